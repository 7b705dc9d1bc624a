//! `tessera containerd-config`: points containerd's registry hosts at the agent's mirror
//! by writing `certs.d/<registry>/hosts.toml` files (containerd reads them at each pull;
//! no restart is needed), idempotently: a file that already says the same is left alone,
//! a file of someone else's is backed up once before being replaced, and `undo` puts
//! every backup back (or removes the files this command wrote).

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::{Error, Result};

/// First line of every file this command writes: how it recognises its own files.
const MARKER: &str = "# Written by `tessera containerd-config`";
/// Suffix of the copy of a file that was there before.
const BACKUP: &str = "tessera-backup";

/// What to configure.
#[derive(Debug, Clone)]
pub struct HostsConfig {
    /// containerd's hosts directory (`/etc/containerd/certs.d`).
    pub certs_dir: PathBuf,
    /// The mirror's URL (`http://127.0.0.1:7082`).
    pub mirror: String,
    /// Registries (`docker.io`, `registry.example.com:5000`) to send through the mirror.
    pub registries: Vec<String>,
    /// Also every other registry (`_default/hosts.toml`).
    pub all: bool,
    /// Registries whose upstream is plain HTTP.
    pub insecure: Vec<String>,
}

/// What happened to one file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Written,
    Unchanged,
    /// Someone else's file was kept as `hosts.toml.tessera-backup` and replaced.
    BackedUpAndWritten,
    Restored,
    Removed,
    /// Undo found nothing of ours.
    Untouched,
}

#[derive(Debug, Clone, Serialize)]
pub struct FileChange {
    pub registry: String,
    pub path: PathBuf,
    pub change: Change,
}

/// The upstream a registry name stands for.
fn upstream(registry: &str, insecure: &[String]) -> String {
    let host = match registry {
        "docker.io" => "registry-1.docker.io",
        other => other,
    };
    let scheme = if insecure.iter().any(|i| i == registry) {
        "http"
    } else {
        "https"
    };
    format!("{scheme}://{host}")
}

/// The `hosts.toml` sending `registry` through `mirror`, falling back to the upstream
/// itself (containerd tries hosts in order, then `server`).
pub fn hosts_toml(registry: Option<&str>, mirror: &str, insecure: &[String]) -> String {
    let mut out =
        format!("{MARKER}; `tessera containerd-config --undo` restores the previous file.\n");
    if let Some(r) = registry {
        out.push_str(&format!("server = \"{}\"\n", upstream(r, insecure)));
    }
    out.push_str(&format!(
        "\n[host.\"{mirror}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
    ));
    out
}

/// A registry name usable as a directory name under `certs.d`.
fn check_registry(r: &str) -> Result<()> {
    let ok = !r.is_empty()
        && r != "."
        && r != ".."
        && r.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '_'));
    if ok {
        Ok(())
    } else {
        Err(Error::Setting {
            setting: "--registry".into(),
            problem: format!(
                "{r:?} is not a registry host (like docker.io or registry.example.com:5000)"
            ),
        })
    }
}

fn targets(c: &HostsConfig) -> Result<Vec<(String, Option<String>)>> {
    let mut out = Vec::new();
    for r in &c.registries {
        check_registry(r)?;
        out.push((r.clone(), Some(r.clone())));
    }
    if c.all {
        out.push(("_default".to_string(), None));
    }
    if out.is_empty() {
        return Err(Error::Setting {
            setting: "--registry".into(),
            problem: "name at least one --registry, or --all".into(),
        });
    }
    Ok(out)
}

fn backup_of(path: &Path) -> PathBuf {
    path.with_extension(format!("toml.{BACKUP}"))
}

fn is_ours(path: &Path) -> bool {
    std::fs::read_to_string(path).is_ok_and(|t| t.starts_with(MARKER))
}

/// Writes the hosts files; re-running with the same settings changes nothing.
pub fn apply(c: &HostsConfig) -> Result<Vec<FileChange>> {
    let mut changes = Vec::new();
    for (dir, registry) in targets(c)? {
        let path = c.certs_dir.join(&dir).join("hosts.toml");
        let text = hosts_toml(registry.as_deref(), &c.mirror, &c.insecure);
        let change = match std::fs::read_to_string(&path) {
            Ok(existing) if existing == text => Change::Unchanged,
            Ok(_) if is_ours(&path) => Change::Written,
            Ok(_) => {
                let backup = backup_of(&path);
                // Keep the first original: a second run must not back up our own file.
                if !backup.exists() {
                    std::fs::copy(&path, &backup).map_err(|e| Error::io("back up", &path, e))?;
                }
                Change::BackedUpAndWritten
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Change::Written,
            Err(e) => return Err(Error::io("read", &path, e)),
        };
        if change != Change::Unchanged {
            let parent = c.certs_dir.join(&dir);
            std::fs::create_dir_all(&parent).map_err(|e| Error::io("create", &parent, e))?;
            // Whole file or nothing: containerd may read it at any moment.
            let tmp = path.with_extension("toml.tmp");
            std::fs::write(&tmp, &text).map_err(|e| Error::io("write", &tmp, e))?;
            std::fs::rename(&tmp, &path).map_err(|e| Error::io("write", &path, e))?;
        }
        changes.push(FileChange {
            registry: dir,
            path,
            change,
        });
    }
    Ok(changes)
}

/// Puts back what [`apply`] replaced, and removes what it created.
pub fn undo(c: &HostsConfig) -> Result<Vec<FileChange>> {
    let mut changes = Vec::new();
    for (dir, _) in targets(c)? {
        let path = c.certs_dir.join(&dir).join("hosts.toml");
        let backup = backup_of(&path);
        let change = if backup.exists() {
            std::fs::rename(&backup, &path).map_err(|e| Error::io("restore", &backup, e))?;
            Change::Restored
        } else if is_ours(&path) {
            std::fs::remove_file(&path).map_err(|e| Error::io("remove", &path, e))?;
            // The directory too, if this command made it and nothing else is there.
            let _ = std::fs::remove_dir(c.certs_dir.join(&dir));
            Change::Removed
        } else {
            Change::Untouched
        };
        changes.push(FileChange {
            registry: dir,
            path,
            change,
        });
    }
    Ok(changes)
}

/// Whether containerd's config names `certs_dir` as its registry `config_path` (the
/// CRI plugin reads hosts files only from there; `ctr --hosts-dir` needs nothing).
/// `None` when the config file cannot be read.
pub fn config_path_set(containerd_config: &Path, certs_dir: &Path) -> Option<bool> {
    let text = std::fs::read_to_string(containerd_config).ok()?;
    let value: toml::Value = toml::from_str(&text).ok()?;
    let dir = certs_dir.to_string_lossy();
    fn find(v: &toml::Value, dir: &str) -> bool {
        match v {
            toml::Value::Table(t) => t.iter().any(|(k, v)| {
                (k == "config_path" && v.as_str().is_some_and(|p| p.split(':').any(|p| p == dir)))
                    || find(v, dir)
            }),
            _ => false,
        }
    }
    Some(find(&value, &dir))
}

/// The name containerd knows the snapshotter by (`--snapshotter tessera`).
pub const SNAPSHOTTER: &str = "tessera";

/// The runtime handler written beside the snapshotter: containerd's default runtime on
/// containerd's own snapshotter. With the Tessera snapshotter the default, a container
/// can only be created while the agent answers; pods that must start while it does
/// not (the agent's own, after it died or during a rollout) run on this handler
/// (a Kubernetes RuntimeClass naming it). containerd 1.7 and later honour a runtime's
/// `snapshotter`; 1.6 ignores it.
pub const NATIVE_RUNTIME: &str = "tessera-native";

/// What containerd's config says of the Tessera snapshotter.
#[derive(Debug, Clone, Copy)]
pub struct SnapshotterConfig<'a> {
    /// The agent's snapshots socket (the proxy plugin's `address`).
    pub socket: &'a Path,
    /// The snapshotter's root on the node (the agent's snapshotter root), exported to
    /// containerd: its CRI plugin reports the image filesystem (to the kubelet's image
    /// garbage collection and `imagefs` eviction) from the filesystem holding it, and
    /// without the export names a directory that does not exist.
    pub root: &'a Path,
    /// The runtime handler written beside it ([`NATIVE_RUNTIME`]).
    pub native_runtime: &'a str,
}

/// The snapshotter the native runtime uses when the file named none before Tessera's:
/// containerd's default.
const CONTAINERD_DEFAULT_SNAPSHOTTER: &str = "overlayfs";

/// Where a config file's CRI image settings live: the `snapshotter` Kubernetes pulls
/// and unpacks with, `disable_snapshot_annotations`, and the registry `config_path`.
/// containerd 1.x reads version 2; containerd 2.x reads version 3 and converts a
/// version 2 file to it at start, so a version 2 file serves both lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigVersion {
    /// containerd 1.x: `plugins."io.containerd.grpc.v1.cri".containerd`.
    V2,
    /// containerd 2.x: `plugins."io.containerd.cri.v1.images"`.
    V3,
}

impl ConfigVersion {
    /// The table path of the CRI image settings.
    pub fn cri_images_table(self) -> &'static [&'static str] {
        match self {
            ConfigVersion::V2 => &["plugins", "io.containerd.grpc.v1.cri", "containerd"],
            ConfigVersion::V3 => &["plugins", "io.containerd.cri.v1.images"],
        }
    }

    /// The table path of the CRI runtime settings (`default_runtime_name`, `runtimes`).
    pub fn cri_runtime_table(self) -> &'static [&'static str] {
        match self {
            ConfigVersion::V2 => &["plugins", "io.containerd.grpc.v1.cri", "containerd"],
            ConfigVersion::V3 => &["plugins", "io.containerd.cri.v1.runtime", "containerd"],
        }
    }

    /// The table that holds the CRI plugin's registry `config_path`, as TOML.
    pub fn registry_section(self) -> &'static str {
        match self {
            ConfigVersion::V2 => "[plugins.\"io.containerd.grpc.v1.cri\".registry]",
            ConfigVersion::V3 => "[plugins.\"io.containerd.cri.v1.images\".registry]",
        }
    }

    /// The version of a parsed config file; `None` (with the reason) for version 1,
    /// which neither line's CRI plugin settings are written for here.
    fn of(doc: &toml_edit::DocumentMut) -> std::result::Result<Option<ConfigVersion>, String> {
        match doc.get("version").and_then(toml_edit::Item::as_integer) {
            Some(2) => Ok(Some(ConfigVersion::V2)),
            Some(3) => Ok(Some(ConfigVersion::V3)),
            None if doc.iter().next().is_none() => Ok(None),
            v => Err(format!(
                "version {} is not supported: containerd 1.x's version 2 and containerd 2.x's version 3 are (see `containerd config default`)",
                v.map_or("1 (no version key)".to_string(), |v| v.to_string())
            )),
        }
    }
}

/// The version of containerd's config file at `path`, if it can be read and names
/// version 2 or 3.
pub fn config_version(path: &Path) -> Option<ConfigVersion> {
    let text = std::fs::read_to_string(path).ok()?;
    ConfigVersion::of(&text.parse().ok()?).ok().flatten()
}

/// `text` (containerd's `config.toml`, version 2 or 3) with the Tessera snapshotter
/// `c`: the proxy plugin `tessera` at its socket, exporting its root, the CRI image
/// settings (where the file's version keeps them) using it with snapshot annotations
/// on (the snapshotter needs the image and layer of each snapshot), and the native
/// runtime handler
/// (see [`NATIVE_RUNTIME`]): a copy of the default runtime's settings on the
/// snapshotter the file used before. Everything else, comments included, is kept. An
/// empty file becomes version 2, which both containerd lines read.
pub fn with_snapshotter(text: &str, c: &SnapshotterConfig<'_>) -> Result<String> {
    use toml_edit::{value, DocumentMut, Item, Table};
    let native_runtime = c.native_runtime;
    let bad = |reason: String| Error::Config {
        path: PathBuf::from("containerd config.toml"),
        reason,
    };
    let mut doc: DocumentMut = text
        .parse()
        .map_err(|e| bad(format!("not valid TOML: {e}")))?;
    let version = match ConfigVersion::of(&doc).map_err(bad)? {
        Some(v) => v,
        None => {
            doc["version"] = value(2);
            ConfigVersion::V2
        }
    };
    // Parents as implicit tables: no empty `[plugins]` headers appear.
    fn table<'a>(parent: &'a mut Table, key: &str) -> Result<&'a mut Table> {
        if !parent.contains_key(key) {
            let mut t = Table::new();
            t.set_implicit(true);
            parent.insert(key, Item::Table(t));
        }
        parent[key].as_table_mut().ok_or_else(|| Error::Config {
            path: PathBuf::from("containerd config.toml"),
            reason: format!("`{key}` is not a table"),
        })
    }
    let root = doc.as_table_mut();
    let proxy = table(table(root, "proxy_plugins")?, SNAPSHOTTER)?;
    proxy.set_implicit(false);
    proxy["type"] = value("snapshot");
    proxy["address"] = value(c.socket.to_string_lossy().as_ref());
    let mut exports = toml_edit::InlineTable::new();
    exports.insert("root", c.root.to_string_lossy().as_ref().into());
    proxy["exports"] = value(exports);
    let mut cri = &mut *root;
    for key in version.cri_images_table() {
        cri = table(cri, key)?;
    }
    cri.set_implicit(false);
    let before = cri
        .get("snapshotter")
        .and_then(Item::as_str)
        .filter(|s| *s != SNAPSHOTTER)
        .unwrap_or(CONTAINERD_DEFAULT_SNAPSHOTTER)
        .to_string();
    cri["snapshotter"] = value(SNAPSHOTTER);
    cri["disable_snapshot_annotations"] = value(false);

    let mut runtime = &mut *doc.as_table_mut();
    for key in version.cri_runtime_table() {
        runtime = table(runtime, key)?;
    }
    // containerd's own default when the file names none.
    let default = runtime
        .get("default_runtime_name")
        .and_then(Item::as_str)
        .unwrap_or("runc")
        .to_string();
    let runtimes = table(runtime, "runtimes")?;
    if native_runtime == default {
        return Err(bad(format!(
            "the native runtime handler `{native_runtime}` is the default runtime: name another (`--native-runtime`)"
        )));
    }
    // Written once: a later run keeps the handler (and the snapshotter it names) as is.
    if !runtimes.contains_key(native_runtime) {
        // The default runtime's settings (its type, cgroup driver, binary), so the
        // agent's pod runs as every other pod of the node does.
        let mut native = match runtimes.get(&default).and_then(Item::as_table) {
            Some(t) => t.clone(),
            None => {
                let mut t = Table::new();
                t["runtime_type"] = value("io.containerd.runc.v2");
                t
            }
        };
        native.set_implicit(false);
        // Printed after the rest of the file, its sub-tables (`options`) with it.
        native.set_position(usize::MAX);
        for (_, sub) in native.iter_mut() {
            if let Some(sub) = sub.as_table_mut() {
                sub.set_position(usize::MAX);
            }
        }
        if !native.contains_key("runtime_type") {
            // containerd's own default for a runtime that names no type.
            native["runtime_type"] = value("io.containerd.runc.v2");
        }
        native["snapshotter"] = value(before);
        runtimes.insert(native_runtime, Item::Table(native));
    }
    Ok(doc.to_string())
}

/// Configures containerd (its `config.toml` at `path`) for the snapshotter `c`; the
/// first original is kept as `config.toml.tessera-backup`. containerd
/// reads it at start: restart it once.
pub fn apply_snapshotter(path: &Path, c: &SnapshotterConfig<'_>) -> Result<FileChange> {
    let (existing, text) = match std::fs::read_to_string(path) {
        Ok(t) => (Some(t.clone()), with_snapshotter(&t, c)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => (
            None,
            format!(
                "{MARKER}; `tessera containerd-config --undo` removes it.\n{}",
                with_snapshotter("", c)?
            ),
        ),
        Err(e) => return Err(Error::io("read", path, e)),
    };
    let change = match &existing {
        Some(e) if *e == text => Change::Unchanged,
        Some(_) if is_ours(path) => Change::Written,
        Some(_) => {
            let backup = backup_of(path);
            if !backup.exists() {
                std::fs::copy(path, &backup).map_err(|e| Error::io("back up", path, e))?;
            }
            Change::BackedUpAndWritten
        }
        None => Change::Written,
    };
    if change != Change::Unchanged {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io("create", parent, e))?;
        }
        let tmp = path.with_extension("toml.tmp");
        std::fs::write(&tmp, &text).map_err(|e| Error::io("write", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| Error::io("write", path, e))?;
    }
    Ok(FileChange {
        registry: "snapshotter".into(),
        path: path.to_path_buf(),
        change,
    })
}

/// Undoes [`apply_snapshotter`]: the backup back, or the file removed if it wrote it.
pub fn undo_snapshotter(path: &Path) -> Result<FileChange> {
    let backup = backup_of(path);
    let change = if backup.exists() {
        std::fs::rename(&backup, path).map_err(|e| Error::io("restore", &backup, e))?;
        Change::Restored
    } else if is_ours(path) {
        std::fs::remove_file(path).map_err(|e| Error::io("remove", path, e))?;
        Change::Removed
    } else {
        Change::Untouched
    };
    Ok(FileChange {
        registry: "snapshotter".into(),
        path: path.to_path_buf(),
        change,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path) -> HostsConfig {
        HostsConfig {
            certs_dir: dir.to_path_buf(),
            mirror: "http://127.0.0.1:7082".into(),
            registries: vec!["docker.io".into(), "r.example:5000".into()],
            all: true,
            insecure: vec!["r.example:5000".into()],
        }
    }

    #[test]
    fn apply_is_idempotent_and_undo_restores() {
        let t = tempfile::tempdir().unwrap();
        let c = config(t.path());
        // Someone's own file for docker.io.
        let theirs = t.path().join("docker.io/hosts.toml");
        std::fs::create_dir_all(theirs.parent().unwrap()).unwrap();
        std::fs::write(&theirs, "server = \"https://mirror.corp\"\n").unwrap();

        let first = apply(&c).unwrap();
        let kinds: Vec<Change> = first.iter().map(|f| f.change).collect();
        assert_eq!(
            kinds,
            [Change::BackedUpAndWritten, Change::Written, Change::Written]
        );
        let docker = std::fs::read_to_string(&theirs).unwrap();
        assert!(
            docker.contains("server = \"https://registry-1.docker.io\""),
            "{docker}"
        );
        assert!(docker.contains("[host.\"http://127.0.0.1:7082\"]"));
        let local = std::fs::read_to_string(t.path().join("r.example:5000/hosts.toml")).unwrap();
        assert!(
            local.contains("server = \"http://r.example:5000\""),
            "{local}"
        );
        let default = std::fs::read_to_string(t.path().join("_default/hosts.toml")).unwrap();
        assert!(!default.contains("server"), "{default}");
        // The parsed file is what containerd expects.
        let v: toml::Value = toml::from_str(&docker).unwrap();
        assert_eq!(
            v["host"]["http://127.0.0.1:7082"]["capabilities"],
            toml::Value::Array(vec!["pull".into(), "resolve".into()])
        );

        let again = apply(&c).unwrap();
        assert!(
            again.iter().all(|f| f.change == Change::Unchanged),
            "{again:?}"
        );

        let undone = undo(&c).unwrap();
        let kinds: Vec<Change> = undone.iter().map(|f| f.change).collect();
        assert_eq!(kinds, [Change::Restored, Change::Removed, Change::Removed]);
        assert_eq!(
            std::fs::read_to_string(&theirs).unwrap(),
            "server = \"https://mirror.corp\"\n"
        );
        assert!(!t.path().join("r.example:5000").exists());
        assert!(undo(&c)
            .unwrap()
            .iter()
            .all(|f| f.change == Change::Untouched));
    }

    fn ours(socket: &Path) -> SnapshotterConfig<'_> {
        SnapshotterConfig {
            socket,
            root: Path::new("/var/lib/tessera/snapshotter"),
            native_runtime: NATIVE_RUNTIME,
        }
    }

    #[test]
    fn snapshotter_config_keeps_the_rest_and_undoes() {
        let t = tempfile::tempdir().unwrap();
        let conf = t.path().join("config.toml");
        let original = "# the node's config\nversion = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.6\"\n  [plugins.\"io.containerd.grpc.v1.cri\".containerd]\n    snapshotter = \"overlayfs\"\n    default_runtime_name = \"runc\"\n";
        std::fs::write(&conf, original).unwrap();
        let socket = Path::new("/run/tessera/snapshotter.sock");
        assert_eq!(
            apply_snapshotter(&conf, &ours(socket)).unwrap().change,
            Change::BackedUpAndWritten
        );
        let text = std::fs::read_to_string(&conf).unwrap();
        assert!(text.starts_with("# the node's config"), "{text}");
        let v: toml::Value = toml::from_str(&text).unwrap();
        let cri = &v["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["sandbox_image"].as_str(), Some("pause:3.6"));
        assert_eq!(cri["containerd"]["snapshotter"].as_str(), Some("tessera"));
        assert_eq!(
            cri["containerd"]["default_runtime_name"].as_str(),
            Some("runc")
        );
        assert_eq!(
            cri["containerd"]["disable_snapshot_annotations"].as_bool(),
            Some(false)
        );
        assert_eq!(
            v["proxy_plugins"]["tessera"]["type"].as_str(),
            Some("snapshot")
        );
        assert_eq!(
            v["proxy_plugins"]["tessera"]["address"].as_str(),
            Some("/run/tessera/snapshotter.sock")
        );
        assert_eq!(
            v["proxy_plugins"]["tessera"]["exports"]["root"].as_str(),
            Some("/var/lib/tessera/snapshotter")
        );
        // The native runtime: runc on the snapshotter the file used before.
        let native = &cri["containerd"]["runtimes"][NATIVE_RUNTIME];
        assert_eq!(native["snapshotter"].as_str(), Some("overlayfs"), "{text}");
        assert_eq!(
            native["runtime_type"].as_str(),
            Some("io.containerd.runc.v2")
        );
        assert_eq!(
            apply_snapshotter(&conf, &ours(socket)).unwrap().change,
            Change::Unchanged
        );
        assert_eq!(undo_snapshotter(&conf).unwrap().change, Change::Restored);
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), original);

        // Another snapshotter before Tessera's stays the native runtime's; a handler
        // named like the default runtime is refused.
        let zfs = original.replace("\"overlayfs\"", "\"zfs\"");
        let text = with_snapshotter(&zfs, &ours(socket)).unwrap();
        let v: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(
            v["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"][NATIVE_RUNTIME]
                ["snapshotter"]
                .as_str(),
            Some("zfs"),
            "{text}"
        );
        let runc = SnapshotterConfig {
            native_runtime: "runc",
            ..ours(socket)
        };
        let err = with_snapshotter(original, &runc).unwrap_err().to_string();
        assert!(err.contains("is the default runtime"), "{err}");

        // No config yet: one is written, and undo removes it.
        let fresh = t.path().join("new/config.toml");
        assert_eq!(
            apply_snapshotter(&fresh, &ours(socket)).unwrap().change,
            Change::Written
        );
        let v: toml::Value = toml::from_str(&std::fs::read_to_string(&fresh).unwrap()).unwrap();
        assert_eq!(v["version"].as_integer(), Some(2));
        assert_eq!(undo_snapshotter(&fresh).unwrap().change, Change::Removed);
        assert!(!fresh.exists());

        // Version 1 configs are refused by name.
        let old = t.path().join("v1.toml");
        std::fs::write(&old, "[plugins.cri]\n").unwrap();
        let err = apply_snapshotter(&old, &ours(socket))
            .unwrap_err()
            .to_string();
        assert!(err.contains("version 1"), "{err}");
    }

    /// containerd 2.x's config (version 3): the CRI image settings are edited where
    /// containerd 2 reads them, the rest kept, idempotent, undone from the backup.
    #[test]
    fn snapshotter_config_version_3() {
        let t = tempfile::tempdir().unwrap();
        let conf = t.path().join("config.toml");
        let original = "version = 3\nroot = \"/var/lib/containerd\"\n\n[plugins.'io.containerd.cri.v1.images']\n  snapshotter = 'overlayfs'\n  disable_snapshot_annotations = true\n  [plugins.'io.containerd.cri.v1.images'.registry]\n    config_path = '/etc/containerd/certs.d'\n\n[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]\n  SystemdCgroup = true\n";
        std::fs::write(&conf, original).unwrap();
        assert_eq!(config_version(&conf), Some(ConfigVersion::V3));
        let socket = Path::new("/run/tessera/snapshotter.sock");
        assert_eq!(
            apply_snapshotter(&conf, &ours(socket)).unwrap().change,
            Change::BackedUpAndWritten
        );
        let text = std::fs::read_to_string(&conf).unwrap();
        let v: toml::Value = toml::from_str(&text).unwrap();
        assert_eq!(v["version"].as_integer(), Some(3));
        let images = &v["plugins"]["io.containerd.cri.v1.images"];
        assert_eq!(images["snapshotter"].as_str(), Some("tessera"), "{text}");
        assert_eq!(
            images["disable_snapshot_annotations"].as_bool(),
            Some(false)
        );
        assert_eq!(
            images["registry"]["config_path"].as_str(),
            Some("/etc/containerd/certs.d")
        );
        assert_eq!(
            v["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]["runc"]
                ["options"]["SystemdCgroup"]
                .as_bool(),
            Some(true)
        );
        // The native runtime copies the default's settings (its cgroup driver here),
        // on containerd's own snapshotter.
        let native =
            &v["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"][NATIVE_RUNTIME];
        assert_eq!(native["snapshotter"].as_str(), Some("overlayfs"), "{text}");
        assert_eq!(
            native["runtime_type"].as_str(),
            Some("io.containerd.runc.v2")
        );
        assert_eq!(native["options"]["SystemdCgroup"].as_bool(), Some(true));
        // Nothing written where containerd 1.x kept it: containerd 2 would take it
        // for a version 2 leftover.
        assert!(
            v["plugins"].get("io.containerd.grpc.v1.cri").is_none(),
            "{text}"
        );
        assert_eq!(
            v["proxy_plugins"]["tessera"]["address"].as_str(),
            Some("/run/tessera/snapshotter.sock")
        );
        assert_eq!(
            apply_snapshotter(&conf, &ours(socket)).unwrap().change,
            Change::Unchanged
        );
        assert_eq!(
            config_path_set(&conf, Path::new("/etc/containerd/certs.d")),
            Some(true)
        );
        assert_eq!(undo_snapshotter(&conf).unwrap().change, Change::Restored);
        assert_eq!(std::fs::read_to_string(&conf).unwrap(), original);

        // Versions this command does not know are refused by name.
        std::fs::write(&conf, "version = 4\n").unwrap();
        let err = apply_snapshotter(&conf, &ours(socket))
            .unwrap_err()
            .to_string();
        assert!(err.contains("version 4 is not supported"), "{err}");
        assert!(err.contains("version 3"), "{err}");
    }

    #[test]
    fn bad_names_and_config_path() {
        let t = tempfile::tempdir().unwrap();
        let mut c = config(t.path());
        c.registries = vec!["../etc".into()];
        assert!(apply(&c)
            .unwrap_err()
            .to_string()
            .contains("not a registry host"));
        c.registries.clear();
        c.all = false;
        assert!(apply(&c).is_err());

        let conf = t.path().join("config.toml");
        std::fs::write(
            &conf,
            "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".registry]\nconfig_path = \"/etc/containerd/certs.d\"\n",
        )
        .unwrap();
        assert_eq!(
            config_path_set(&conf, Path::new("/etc/containerd/certs.d")),
            Some(true)
        );
        assert_eq!(config_path_set(&conf, Path::new("/other")), Some(false));
        assert_eq!(
            config_path_set(&t.path().join("none"), Path::new("/x")),
            None
        );
    }
}
