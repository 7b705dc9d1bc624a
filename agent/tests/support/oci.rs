//! Reference OCI images built with real tools (`umoci`, `skopeo`, GNU `tar`).
//!
//! Integration tests use these images as ground truth: the agent's view of an
//! image must match the tree `umoci unpack` produces from the same layout.
//!
//! Tools needed (Debian): `umoci`, `skopeo`, `tar`, `setfattr` (package
//! `attr`). Install them with `make test-deps`. The builder must run as root
//! (it `chown`s files to other uids).
//!
//! # The image built by [`build_layered_image`]
//!
//! Four layers, tagged `v1` in `work/layout`:
//!
//! 1. `umoci repack` of a fresh tree:
//!    * `etc/app/config.txt`;
//!    * `data/a.txt` (xattr `user.tessera.test=hello`, mtime
//!      `1_700_000_000.123456789`), `data/empty`, `data/sub/b.txt`,
//!      `data/sub/deep/c.txt`;
//!    * `data/link -> a.txt`, `data/abs-link -> /data/a.txt` (symlinks);
//!    * `data/hard1` + `data/hard2` (one inode, a hardlink pair);
//!    * `data/exec.sh` (0755), `data/secret` (0600, uid/gid 1000:1000),
//!      `data/shared` (0640, 1000:2000), `data/setgid-dir/` (02775, 1000:2000),
//!      `data/sticky/` (01777);
//!    * `data/to-delete.txt`, `data/will-be-dir`, `data/modify.txt` (`v1\n`),
//!      `data/chmod.txt` (0644);
//!    * `doomed/` (a tree, removed whole in layer 2);
//!    * `opaque/lower.txt`, `opaque/lower-sub/x.txt`, `opaque/keep-name.txt`
//!      (all hidden by layer 3's opaque marker).
//! 2. `umoci repack` after: removing `data/to-delete.txt`,
//!    `data/will-be-dir` and the whole `doomed/` tree (umoci emits `.wh.`
//!    whiteouts); rewriting `data/modify.txt` to `v2\n`; `chmod 0700
//!    data/chmod.txt` (metadata-only change).
//! 3. A hand-made tar added with `umoci raw add-layer` holding
//!    `opaque/.wh..wh..opq`, `opaque/new.txt` (`layer3\n`, xattr
//!    `user.tessera.layer=3`), `opaque/keep-name.txt` (`layer3 keep\n`) and
//!    `opaque/new-sub/y.txt`. After it, `opaque/` holds only the layer-3 names.
//! 4. `umoci repack` after adding: [`LONG_FILE`] (path > 100 bytes, with a
//!    152-byte file name), [`LONG_SYMLINK`] pointing at it (target > 100
//!    bytes), [`DEEP_FILE`] (40 nested directories), and re-adding deleted
//!    names as other types: `data/will-be-dir/` is now a directory holding
//!    `inner.txt`, `data/to-delete.txt` is now a symlink to `a.txt`, `doomed`
//!    is now a regular file (`file now\n`).
//!
//! `work/exported` is a `skopeo copy` of that layout and `work/exported-zstd`
//! a copy recompressed to zstd (`--dest-compress-format zstd`). Note that
//! umoci 0.4.x cannot unpack zstd layers ("blob is not correct mediatype"),
//! so do not feed `exported-zstd` to [`umoci_unpack_rootfs`].
//!
//! # Tool quirks worth knowing (umoci 0.4.7, skopeo 1.9.3, GNU tar 1.34)
//!
//! * umoci-made layers (1, 2, 4) keep uid/gid, modes (setgid, sticky) and
//!   `user.*` xattrs (as `SCHILY.xattr.*` PAX records, also on directories),
//!   but **round mtimes to whole seconds** (`1_700_000_000.123456789` becomes
//!   `1_700_000_000`, `…0.999999999` rounds up). The GNU-tar layer 3 keeps
//!   nanosecond `mtime` (plus `atime`/`ctime`) in PAX records.
//! * umoci writes entry names without `./` and includes the root `.` and
//!   every changed file's parent directories; GNU tar writes `./`-prefixed
//!   names and a `./` root entry.
//! * Deleting a directory yields a single `.wh.<dir>` whiteout (no entries for
//!   its children); whiteouts are empty regular files with mode 0, mtime 0.
//! * A mode-only change re-emits the whole file in the new layer.
//! * Hardlinks are `Link` entries whose target is the first name
//!   (`data/hard2 -> data/hard1`, no leading `/`).
//! * Long names: paths that fit ustar name (100) + prefix (155) use the
//!   `prefix` field (e.g. [`DEEP_FILE`]); a >100-byte last component uses a
//!   PAX `path` record, a >100-byte symlink target a PAX `linkpath` record.
//! * `skopeo copy` without recompression reuses the blobs and manifest as
//!   is, so `exported` has the same manifest digest as `layout`.
//! * The image is not reproducible: mtimes and history dates are "now".

#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs::{self, File, FileTimes};
use std::os::unix::fs::{chown, symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// A reference image built by [`build_layered_image`].
#[derive(Debug, Clone)]
pub struct LayeredImage {
    /// OCI image layout written by umoci (gzip layers).
    pub layout: PathBuf,
    /// The same image re-exported with `skopeo copy` (gzip layers).
    pub exported: PathBuf,
    /// The image re-exported by skopeo with zstd-compressed layers, when
    /// skopeo supports it.
    pub exported_zstd: Option<PathBuf>,
    /// Tag of the image in every layout above.
    pub tag: String,
}

/// Tag used for every image built here.
pub const TAG: &str = "v1";

/// Number of layers in the image built by [`build_layered_image`].
pub const LAYER_COUNT: usize = 4;

/// mtime (seconds since epoch, nanoseconds) given to `data/a.txt` in layer 1.
pub const A_TXT_MTIME: (u64, u32) = (1_700_000_000, 123_456_789);

/// Layer-4 file whose path is longer than 100 bytes (relative to the rootfs).
pub const LONG_FILE: &str = concat!(
    "long/aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa/",
    "LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL",
    "LLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLLL.txt"
);

/// Layer-4 symlink whose target ([`LONG_FILE`], relative) is longer than 100 bytes.
pub const LONG_SYMLINK: &str = "long/link-to-long";

/// Layer-4 file nested 40 directories deep (relative to the rootfs).
pub const DEEP_FILE: &str = concat!(
    "deep/l00/l01/l02/l03/l04/l05/l06/l07/l08/l09/l10/l11/l12/l13/l14/l15/l16/",
    "l17/l18/l19/l20/l21/l22/l23/l24/l25/l26/l27/l28/l29/l30/l31/l32/l33/l34/",
    "l35/l36/l37/l38/l39/bottom.txt"
);

/// Runs `cmd`, panicking with its stdout and stderr if it cannot be started or
/// exits unsuccessfully.
pub fn run(cmd: &mut Command) {
    run_output(cmd);
}

/// Like [`run`], but returns the command's stdout.
pub fn run_output(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("failed to start {cmd:?}: {e}"));
    if !out.status.success() {
        panic!(
            "command failed ({}): {cmd:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
    }
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether an executable called `name` is on `PATH`.
pub fn tool_available(name: &str) -> bool {
    which(name).is_some()
}

/// The executable called `name` on `PATH`, if there is one.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|p| {
            fs::metadata(p)
                .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
                .unwrap_or(false)
        })
}

/// Panics with an installation hint unless `name` is on `PATH`.
pub fn require_tool(name: &str) {
    if !tool_available(name) {
        let package = match name {
            "setfattr" | "getfattr" => "attr",
            other => other,
        };
        panic!("`{name}` not found: run `make test-deps` (apt-get install {package})");
    }
}

/// Unpacks `layout:tag` with `umoci unpack` into `dest/bundle` and returns the
/// bundle's `rootfs`, the reference merged tree. `dest/bundle` must not exist.
pub fn umoci_unpack_rootfs(layout: &Path, tag: &str, dest: &Path) -> PathBuf {
    require_tool("umoci");
    fs::create_dir_all(dest).expect("create unpack destination");
    let bundle = dest.join("bundle");
    run(Command::new("umoci")
        .arg("unpack")
        .arg("--image")
        .arg(image_ref(layout, tag))
        .arg(&bundle));
    bundle.join("rootfs")
}

/// Builds the four-layer reference image described in the module docs under
/// `work` (`work/layout`, `work/exported`, `work/exported-zstd`, plus scratch
/// directories). `work` must exist and should be empty.
pub fn build_layered_image(work: &Path) -> LayeredImage {
    for tool in ["umoci", "skopeo", "tar", "setfattr"] {
        require_tool(tool);
    }
    let layout = work.join("layout");
    let image = image_ref(&layout, TAG);
    run(Command::new("umoci")
        .arg("init")
        .arg("--layout")
        .arg(&layout));
    run(Command::new("umoci").args(["new", "--image"]).arg(&image));

    // Layer 1: the base tree.
    let bundle = work.join("bundle-1");
    let root = umoci_unpack_rootfs(&layout, TAG, &bundle);
    populate_layer1(&root);
    repack(&layout, &bundle.join("bundle"), "layer 1: base tree");

    // Layer 2: deletions, a content change and a mode change.
    let bundle = work.join("bundle-2");
    let root = umoci_unpack_rootfs(&layout, TAG, &bundle);
    fs::remove_file(root.join("data/to-delete.txt")).expect("rm to-delete.txt");
    fs::remove_file(root.join("data/will-be-dir")).expect("rm will-be-dir");
    fs::remove_dir_all(root.join("doomed")).expect("rm -r doomed");
    fs::write(root.join("data/modify.txt"), "v2\n").expect("modify modify.txt");
    set_mode(&root.join("data/chmod.txt"), 0o700);
    repack(&layout, &bundle.join("bundle"), "layer 2: deletions");

    // Layer 3: a hand-made tar with an opaque directory.
    let layer3 = work.join("layer3");
    build_layer3_tree(&layer3);
    let layer3_tar = work.join("layer3.tar");
    run(Command::new("tar")
        .args(["--xattrs", "--numeric-owner", "--sort=name", "-C"])
        .arg(&layer3)
        .arg("-cf")
        .arg(&layer3_tar)
        .arg("."));
    run(Command::new("umoci")
        .args(["raw", "add-layer", "--history.comment"])
        .arg("layer 3: opaque directory")
        .arg("--image")
        .arg(&image)
        .arg(&layer3_tar));

    // Layer 4: long names, deep nesting, deleted names re-added as other types.
    let bundle = work.join("bundle-4");
    let root = umoci_unpack_rootfs(&layout, TAG, &bundle);
    populate_layer4(&root);
    repack(&layout, &bundle.join("bundle"), "layer 4: long names");

    run(Command::new("umoci").args(["gc", "--layout"]).arg(&layout));

    let exported = work.join("exported");
    // `--insecure-policy`: do not depend on /etc/containers/policy.json.
    run(Command::new("skopeo")
        .args(["--insecure-policy", "copy"])
        .arg(oci_transport(&layout, TAG))
        .arg(oci_transport(&exported, TAG)));

    // skopeo 1.9.3 (Debian) writes `tar+zstd` layers to an `oci:` destination
    // with `--dest-compress-format zstd` (plain single-frame zstd, not
    // zstd:chunked). Builds without zstd support fail here; then there is
    // no zstd copy.
    let exported_zstd_path = work.join("exported-zstd");
    let zstd = Command::new("skopeo")
        .args(["--insecure-policy", "copy", "--dest-compress"])
        .args(["--dest-compress-format", "zstd"])
        .arg(oci_transport(&layout, TAG))
        .arg(oci_transport(&exported_zstd_path, TAG))
        .output()
        .expect("start skopeo");
    let exported_zstd = if zstd.status.success() {
        Some(exported_zstd_path)
    } else {
        eprintln!(
            "skopeo cannot write zstd layers, skipping exported-zstd: {}",
            String::from_utf8_lossy(&zstd.stderr)
        );
        None
    };

    LayeredImage {
        layout,
        exported,
        exported_zstd,
        tag: TAG.to_owned(),
    }
}

/// A one-layer image written straight into an OCI layout by [`build_blob_image`].
#[derive(Debug, Clone)]
pub struct BlobImage {
    /// The OCI image layout.
    pub layout: PathBuf,
    /// Tag of the image in `layout`.
    pub tag: String,
    /// `sha256:…` of the layer blob.
    pub layer_digest: String,
    /// The layer blob (gzip) as pushed and served.
    pub layer: Vec<u8>,
}

/// Writes a one-layer image to `work/layout` for tests about moving bytes rather than
/// about their content: the layer holds one file of `payload_bytes` pseudo-random
/// bytes, so the blob is about that size and no codec shrinks it. `work` must exist.
pub fn build_blob_image(work: &Path, payload_bytes: usize) -> BlobImage {
    let layout = work.join("layout");
    let payload = pseudo_random(payload_bytes, payload_bytes as u64);
    let manifest_digest = build_files_image(&layout, "amd64", &[vec![("payload.bin", payload)]]);
    let blob = |digest: &str| fs::read(layout.join("blobs/sha256").join(&digest[7..]));
    let manifest: serde_json::Value =
        serde_json::from_slice(&blob(&manifest_digest).expect("read manifest"))
            .expect("manifest JSON");
    let layer_digest = manifest["layers"][0]["digest"]
        .as_str()
        .expect("layer digest")
        .to_owned();
    let layer = blob(&layer_digest).expect("read layer");
    BlobImage {
        layout,
        tag: TAG.to_owned(),
        layer_digest,
        layer,
    }
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    format!("sha256:{}", hex::encode(sha2::Sha256::digest(bytes)))
}

fn image_ref(layout: &Path, tag: &str) -> String {
    format!("{}:{tag}", layout.display())
}

fn oci_transport(layout: &Path, tag: &str) -> String {
    format!("oci:{}:{tag}", layout.display())
}

fn repack(layout: &Path, bundle: &Path, comment: &str) {
    run(Command::new("umoci")
        .args(["repack", "--history.comment", comment, "--image"])
        .arg(image_ref(layout, TAG))
        .arg(bundle));
}

fn populate_layer1(root: &Path) {
    write(root, "etc/app/config.txt", "key = value\n", 0o644);

    write(root, "data/a.txt", "alpha\n", 0o644);
    write(root, "data/empty", "", 0o644);
    write(root, "data/sub/b.txt", "bravo\n", 0o644);
    write(root, "data/sub/deep/c.txt", "charlie\n", 0o644);
    symlink("a.txt", root.join("data/link")).expect("symlink data/link");
    symlink("/data/a.txt", root.join("data/abs-link")).expect("symlink data/abs-link");
    write(root, "data/hard1", "same inode\n", 0o644);
    fs::hard_link(root.join("data/hard1"), root.join("data/hard2")).expect("hard link");
    write(root, "data/exec.sh", "#!/bin/sh\necho hi\n", 0o755);
    write(root, "data/secret", "s3cr3t\n", 0o600);
    chown_to(&root.join("data/secret"), 1000, 1000);
    write(root, "data/shared", "group readable\n", 0o640);
    chown_to(&root.join("data/shared"), 1000, 2000);
    mkdir(root, "data/setgid-dir");
    chown_to(&root.join("data/setgid-dir"), 1000, 2000);
    set_mode(&root.join("data/setgid-dir"), 0o2775);
    mkdir(root, "data/sticky");
    set_mode(&root.join("data/sticky"), 0o1777);
    write(root, "data/to-delete.txt", "delete me\n", 0o644);
    write(root, "data/will-be-dir", "a file for now\n", 0o644);
    write(root, "data/modify.txt", "v1\n", 0o644);
    write(root, "data/chmod.txt", "mode changes\n", 0o644);

    write(root, "doomed/one.txt", "1\n", 0o644);
    write(root, "doomed/inner/two.txt", "2\n", 0o644);
    symlink("../one.txt", root.join("doomed/inner/link")).expect("symlink doomed link");

    write(root, "opaque/lower.txt", "lower\n", 0o644);
    write(root, "opaque/lower-sub/x.txt", "lower x\n", 0o644);
    write(root, "opaque/keep-name.txt", "lower keep\n", 0o644);

    setxattr(&root.join("data/a.txt"), "user.tessera.test", "hello");
    setxattr(&root.join("data/sub"), "user.tessera.dir", "on a directory");

    // Last, so nothing above bumps them.
    set_mtime(&root.join("data/a.txt"), A_TXT_MTIME.0, A_TXT_MTIME.1);
    set_mtime(&root.join("data/sub/b.txt"), 1_600_000_000, 1);
    set_mtime(&root.join("data/sub/deep"), 1_500_000_000, 999_999_999);
}

fn build_layer3_tree(dir: &Path) {
    mkdir(dir, "opaque");
    // The opaque marker: hides everything the lower layers had in `opaque/`.
    write(dir, "opaque/.wh..wh..opq", "", 0o644);
    write(dir, "opaque/new.txt", "layer3\n", 0o644);
    write(dir, "opaque/keep-name.txt", "layer3 keep\n", 0o644);
    write(dir, "opaque/new-sub/y.txt", "layer3 y\n", 0o644);
    setxattr(&dir.join("opaque/new.txt"), "user.tessera.layer", "3");
    set_mtime(&dir.join("opaque/new.txt"), 1_650_000_000, 424_242_424);
    for p in [
        "",
        "opaque",
        "opaque/.wh..wh..opq",
        "opaque/new.txt",
        "opaque/keep-name.txt",
        "opaque/new-sub",
        "opaque/new-sub/y.txt",
    ] {
        chown_to(&dir.join(p), 0, 0);
    }
    set_mode(dir, 0o755);
}

fn populate_layer4(root: &Path) {
    write(root, LONG_FILE, "long path\n", 0o644);
    let target = Path::new(LONG_FILE)
        .strip_prefix("long")
        .expect("LONG_FILE under long/");
    assert!(target.as_os_str().len() > 100);
    symlink(target, root.join(LONG_SYMLINK)).expect("symlink long");
    write(root, DEEP_FILE, "at the bottom\n", 0o644);
    set_mtime(&root.join(DEEP_FILE), 1_700_000_001, 5);

    write(
        root,
        "data/will-be-dir/inner.txt",
        "now a directory\n",
        0o644,
    );
    symlink("a.txt", root.join("data/to-delete.txt")).expect("symlink to-delete.txt");
    write(root, "doomed", "file now\n", 0o644);
}

/// Writes `rel` under `root` (creating parents) with `mode`.
fn write(root: &Path, rel: &str, contents: &str, mode: u32) {
    let path = root.join(rel);
    if let Some(parent) = path.parent() {
        fs::create_dir_all(parent).expect("create parent directories");
    }
    fs::write(&path, contents).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    set_mode(&path, mode);
}

fn mkdir(root: &Path, rel: &str) {
    let path = root.join(rel);
    fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {:o} {}: {e}", mode, path.display()));
}

fn chown_to(path: &Path, uid: u32, gid: u32) {
    chown(path, Some(uid), Some(gid))
        .unwrap_or_else(|e| panic!("chown {uid}:{gid} {}: {e}", path.display()));
}

fn set_mtime(path: &Path, secs: u64, nanos: u32) {
    let t = UNIX_EPOCH + Duration::new(secs, nanos);
    let times = FileTimes::new()
        .set_modified(t)
        .set_accessed(SystemTime::now());
    File::open(path)
        .and_then(|f| f.set_times(times))
        .unwrap_or_else(|e| panic!("set mtime {}: {e}", path.display()));
}

fn setxattr(path: &Path, name: &str, value: &str) {
    run(Command::new("setfattr")
        .args(["-n", name, "-v", value])
        .arg(OsStr::new(path)));
}

/// `len` pseudo-random bytes from `seed` (xorshift64): incompressible, reproducible.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ seed.wrapping_mul(0x2545_F491_4F6C_DD1D);
    (0..len.div_ceil(8))
        .flat_map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state.to_le_bytes()
        })
        .take(len)
        .collect()
}

/// Writes an image of regular files straight into an OCI layout at `layout` (tag
/// [`TAG`]): one gzip tar layer per entry of `layers`, each a list of (path, bytes),
/// and a config for `arch` with an Entrypoint and Env that conversions must keep.
/// Made with GNU `tar` and `gzip`: milliseconds. Returns the manifest's digest.
pub fn build_files_image(layout: &Path, arch: &str, layers: &[Vec<(&str, Vec<u8>)>]) -> String {
    let process = serde_json::json!({"Entrypoint": ["/bin/app", "--serve"], "Env": ["MODE=test"]});
    build_files_image_with(layout, arch, layers, &[], process)
}

/// Like [`build_files_image`], with the files at `executables` mode 0755 and `process`
/// as the config's `config` object (Entrypoint, Cmd, Env, …).
pub fn build_files_image_with(
    layout: &Path,
    arch: &str,
    layers: &[Vec<(&str, Vec<u8>)>],
    executables: &[&str],
    process: serde_json::Value,
) -> String {
    let scratch = tempfile::tempdir().expect("scratch dir");
    let mut dirs = Vec::new();
    for (i, files) in layers.iter().enumerate() {
        let src = scratch.path().join(format!("layer-{i}"));
        fs::create_dir_all(&src).expect("create layer dir");
        for (path, bytes) in files {
            let p = src.join(path);
            fs::create_dir_all(p.parent().expect("parent")).expect("create dirs");
            fs::write(&p, bytes).expect("write file");
            if executables.contains(path) {
                use std::os::unix::fs::PermissionsExt;
                fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod");
            }
        }
        dirs.push(src);
    }
    let dirs: Vec<&Path> = dirs.iter().map(PathBuf::as_path).collect();
    build_dirs_image(layout, arch, &dirs, process)
}

/// Writes an image into an OCI layout at `layout` (tag [`TAG`]) whose layers are the
/// trees at `layers` (one gzip tar each, as they are: modes, links), with `process` as
/// the config's `config` object. Returns the manifest's digest.
pub fn build_dirs_image(
    layout: &Path,
    arch: &str,
    layers: &[&Path],
    process: serde_json::Value,
) -> String {
    for tool in ["tar", "gzip"] {
        require_tool(tool);
    }
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs).expect("create blobs dir");
    let put = |bytes: &[u8]| {
        let digest = sha256(bytes);
        fs::write(blobs.join(&digest[7..]), bytes).expect("write blob");
        digest
    };
    let scratch = tempfile::tempdir().expect("scratch dir");
    let mut diff_ids = Vec::new();
    let mut descriptors = Vec::new();
    for (i, src) in layers.iter().enumerate() {
        let tar_path = scratch.path().join(format!("layer-{i}.tar"));
        run(Command::new("tar")
            .args(["--numeric-owner", "--owner=0", "--group=0", "--sort=name"])
            .args(["--mtime=@1700000000", "-C"])
            .arg(src)
            .arg("-cf")
            .arg(&tar_path)
            .arg("."));
        diff_ids.push(sha256(&fs::read(&tar_path).expect("read layer tar")));
        run(Command::new("gzip").args(["-n", "-f"]).arg(&tar_path));
        let layer = fs::read(tar_path.with_extension("tar.gz")).expect("read layer");
        descriptors.push(serde_json::json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
            "digest": put(&layer),
            "size": layer.len(),
        }));
    }
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "config": process,
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    })
    .to_string();
    let config_digest = put(config.as_bytes());
    let manifest = serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": config_digest,
            "size": config.len(),
        },
        "layers": descriptors,
    })
    .to_string();
    let manifest_digest = put(manifest.as_bytes());
    let index = serde_json::json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": TAG},
        }],
    });
    fs::write(layout.join("index.json"), index.to_string()).expect("write index.json");
    fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .expect("write oci-layout");
    manifest_digest
}
