//! A real containerd daemon per test, of either line ([`Line`]: Debian's 1.6, or 2.x
//! as `make containerd-deps` builds it, chosen by `TESSERA_TEST_CONTAINERD`), with its
//! own `ctr`: its own root, state, socket and config in a temp dir, started per test
//! and killed when dropped, with whatever it or the test mounted unmounted, also after
//! a panic.
//!
//! ```ignore
//! let cd = Containerd::start(&t.path().join("containerd"));
//! cd.pull_ok(&format!("{}/app:v1", registry.addr), &PullOptions::plain_http());
//! cd.rootfs(&format!("{}/app:v1", registry.addr), &t.path().join("rootfs"));
//! ```
//!
//! # The daemon
//!
//! The generated `config.toml` (version 2 for 1.6, version 3 for 2.x: the same
//! settings in each line's layout) keeps only what pulling and unpacking need:
//! content store, metadata, snapshotters `overlayfs` and `native`, the walking differ,
//! images, leases, GC. Disabled: the CRI plugin; the aufs, btrfs, zfs and devmapper
//! snapshotters (each probes the host at start); runtimes, task service and cgroup
//! monitor (nothing is ever run); the `restart` plugin; the `opt` plugin, which
//! would create `/opt/containerd` on the host; and in 2.x NRI, which would listen on
//! `/var/run/nri/nri.sock`. The snapshotter in use is required
//! (`required_plugins`), so a broken one fails the start with containerd's reason.
//!
//! [`Snapshotter::detect`] picks overlayfs when the temp dir's filesystem takes
//! overlay upper dirs (ext4, xfs, …), overlayfs on a tmpfs mounted under `dir` when it
//! does not (`/` is itself an overlay in a container), `native` (plain copies) if
//! neither works. Every `ctr` call names it (`CONTAINERD_SNAPSHOTTER`): `ctr` defaults
//! to overlayfs whatever the daemon's config says.
//!
//! # containerd 1.6 facts the harness relies on (checked with 1.6.20)
//!
//! * **`ctr` moves the bytes, not the daemon.** In 1.6 (the transfer service came in
//!   1.7) `ctr image pull` resolves, authenticates and downloads in the `ctr` process and
//!   writes into the daemon's content store over gRPC; the daemon only stores and
//!   unpacks. So for a daemon in a [`NetHost`]'s namespace, [`Containerd::ctr`] runs
//!   `ctr` in that namespace too (through `nsenter --net`, sharing the test's mount
//!   namespace so `ctr image mount` mounts where the test looks).
//! * `ctr image pull` unpacks into the snapshotter by default; `ctr image mount` makes a
//!   read-only view snapshot (key = the target path, kept by a lease of the same name)
//!   and mounts it from the `ctr` process; `ctr image unmount --rm` undoes both.
//! * The content store policy is `shared`: a blob still on disk is reused by the next
//!   pull without a request, even after `ctr image rm`, until GC runs. Hence
//!   [`Containerd::remove_image`] uses `--sync` (GC before returning).
//! * With `--hosts-dir`, `ctr` reads `DIR/<host:port>/hosts.toml` for the reference's
//!   host and tries its `[host."…"]` entries in order, then `server`. Every request to
//!   a host other than the reference's (the `server` too, if it differs) carries
//!   `?ns=<reference host:port>`; credentials from `--user` go to every host, a mirror
//!   too, once it answers 401 with a `Basic` challenge; a mirror's 401 (without
//!   `--user`), 404, 5xx or refused connection makes `ctr` try the next host.
//! * A `hosts.toml` without any `[host]` table (only `server`) fails to parse in
//!   1.6.20 ("invalid `host` tree"): `ctr` logs it and pulls as if there were no file.
//!   [`Containerd::pull_ok`] fails on that message.
//! * Without a hosts file, `ctr` speaks plain HTTP to `localhost`/`127.0.0.1` even
//!   without `--plain-http`; elsewhere it needs `--plain-http`.
//! * `ctr` reads `HTTP_PROXY` and friends; they are removed so that pulls from cluster
//!   addresses never go through a proxy of this machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::netns::NetHost;
use super::oci::tool_available;

/// The containerd namespace every `ctr` call of the harness uses.
pub const NAMESPACE: &str = "tessera-test";

/// The namespace of the CRI plugin's images and containers.
pub const CRI_NAMESPACE: &str = "k8s.io";

/// How long the daemon may take to answer on its socket.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// `ctr --timeout`: a hung pull fails the test instead of hanging it.
const CTR_TIMEOUT: &str = "120s";

/// A unix socket path must fit `sun_path` (108 bytes, with its NUL).
const MAX_SOCKET_PATH: usize = 100;

/// Environment variables that would send `ctr`'s and the cluster daemons' HTTP through a
/// proxy of this machine instead of to test addresses.
pub const PROXY_VARS: [&str; 8] = [
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "ALL_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "all_proxy",
];

/// The containerd 2.x release the harness runs as [`Line::V2`]: what `make
/// containerd-deps` builds (scripts/containerd-deps.sh), with the runc it bundles.
pub const CONTAINERD2_VERSION: &str = "v2.2.9";

/// Which containerd line a test runs against: a parameter of the harness, so the same
/// tests cover both. `TESSERA_TEST_CONTAINERD=2` picks containerd 2.x (`make test`
/// runs the containerd-facing tests once per line); unset or `1.6`, Debian's 1.6.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Line {
    /// Debian bookworm's containerd 1.6 and runc 1.1, from `PATH`: config version 2,
    /// `ctr` downloads images itself.
    V1_6,
    /// containerd [`CONTAINERD2_VERSION`] and its runc from `target/tools`: config
    /// version 3, the CRI settings split over `io.containerd.cri.v1.*`, and `ctr image
    /// pull` hands the download to the daemon's transfer service.
    V2,
}

impl Line {
    /// The line `TESSERA_TEST_CONTAINERD` names (default 1.6).
    pub fn current() -> Line {
        match std::env::var("TESSERA_TEST_CONTAINERD").as_deref() {
            Err(_) | Ok("") | Ok("1.6") => Line::V1_6,
            Ok("2") => Line::V2,
            Ok(other) => panic!("TESSERA_TEST_CONTAINERD={other:?}: say `1.6` or `2`"),
        }
    }

    /// Where this line's binaries are (`None`: on `PATH`, Debian's).
    pub fn bin_dir(self) -> Option<PathBuf> {
        match self {
            Line::V1_6 => None,
            Line::V2 => Some(
                super::repo_root()
                    .join("target/tools")
                    .join(format!("containerd-{CONTAINERD2_VERSION}"))
                    .join("bin"),
            ),
        }
    }

    /// The program `name` (`containerd`, `ctr`) of this line, checked to be there.
    pub fn program(self, name: &str) -> PathBuf {
        match self.bin_dir() {
            None => {
                assert!(
                    tool_available(name),
                    "`{name}` not found: install the Debian package `containerd` \
                     (apt-get install containerd)"
                );
                PathBuf::from(name)
            }
            Some(dir) => {
                let program = dir.join(name);
                assert!(
                    program.is_file(),
                    "{} is missing: run `make containerd-deps` (containerd \
                     {CONTAINERD2_VERSION} and its runc, built from the Go module proxy)",
                    program.display()
                );
                program
            }
        }
    }

    /// `PATH` for the daemon: this line's directory first, so containerd starts its
    /// own shim and the shim its own runc; for 2.x then CRIU 4.2.1's (`make
    /// criu-deps`), as a node would install it: runc 1.2 and later run the `criu` on
    /// their `PATH` (runc 1.1, 1.6's, takes the path from the task's options).
    fn daemon_path(self) -> std::ffi::OsString {
        let system = std::env::var_os("PATH").unwrap_or_default();
        match self.bin_dir() {
            None => system,
            Some(dir) => {
                let criu = super::repo_root().join("target/tools/criu");
                let mut paths = vec![dir, criu];
                paths.extend(std::env::split_paths(&system));
                std::env::join_paths(paths).expect("PATH entries without ':'")
            }
        }
    }

    /// The config file version this line reads natively.
    pub fn config_version(self) -> u32 {
        match self {
            Line::V1_6 => 2,
            Line::V2 => 3,
        }
    }
}

/// Where containerd keeps unpacked layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snapshotter {
    /// overlayfs, its layers under the daemon's root in `dir`.
    Overlayfs,
    /// overlayfs, its layers on a tmpfs mounted at `dir/snapshots`: for when `dir`'s
    /// filesystem is itself an overlay, which cannot hold an overlay's upper dir.
    OverlayfsOnTmpfs,
    /// `native`: every snapshot a full copy of its parent; works on any filesystem.
    Native,
    /// The Tessera agent's snapshotter, a proxy plugin ([`Containerd::start_cri`]).
    Tessera,
}

impl Snapshotter {
    /// The name `ctr --snapshotter` and containerd's config use.
    pub fn name(self) -> &'static str {
        match self {
            Snapshotter::Overlayfs | Snapshotter::OverlayfsOnTmpfs => "overlayfs",
            Snapshotter::Native => "native",
            Snapshotter::Tessera => "tessera",
        }
    }

    /// The first of overlayfs, overlayfs on a tmpfs and `native` that
    /// [works](Snapshotter::works) under `dir`.
    pub fn detect(dir: &Path) -> Snapshotter {
        [Snapshotter::Overlayfs, Snapshotter::OverlayfsOnTmpfs]
            .into_iter()
            .find(|s| s.works(dir))
            .unwrap_or(Snapshotter::Native)
    }

    /// Whether this snapshotter can unpack test images under `dir` (which must
    /// exist), found by trying: an overlay mount in `dir`; a tmpfs taking an overlay
    /// and a `user.*` xattr (test images carry user xattrs, which tmpfs has only since
    /// Linux 6.6). `native` always works. Leaves nothing behind.
    pub fn works(self, dir: &Path) -> bool {
        let probe = dir.join("snapshotter-probe");
        let works = match self {
            Snapshotter::Overlayfs => overlay_works(&probe),
            Snapshotter::OverlayfsOnTmpfs => {
                let works = mount_tmpfs(&probe)
                    && xattr::set(&probe, "user.tessera.probe", b"1").is_ok()
                    && overlay_works(&probe.join("overlay"));
                umount_lazy(&probe);
                works
            }
            Snapshotter::Native | Snapshotter::Tessera => true,
        };
        let _ = std::fs::remove_dir_all(&probe);
        works
    }
}

/// What [`Containerd::pull`] passes to `ctr image pull`.
#[derive(Debug, Clone, Default)]
pub struct PullOptions {
    /// `--hosts-dir`: a directory of `<host:port>/hosts.toml` files (mirrors, schemes).
    pub hosts_dir: Option<PathBuf>,
    /// `--user user:password`, offered to any host that challenges.
    pub user: Option<String>,
    /// `--plain-http`: talk HTTP to the reference's own host.
    pub plain_http: bool,
    /// `--platform`, e.g. `linux/arm64` (default: the machine's).
    pub platform: Option<String>,
    /// `--http-dump`: `ctr` prints every request and response head to stderr.
    pub http_dump: bool,
}

impl PullOptions {
    /// Only `--plain-http`: a test registry on its own address.
    pub fn plain_http() -> PullOptions {
        PullOptions {
            plain_http: true,
            ..PullOptions::default()
        }
    }
}

/// A running containerd; killed, and everything it mounted unmounted, when dropped.
#[derive(Debug)]
pub struct Containerd {
    child: Option<Child>,
    /// Root, state, socket, config and log all live here.
    pub dir: PathBuf,
    /// The gRPC socket.
    pub socket: PathBuf,
    pub snapshotter: Snapshotter,
    /// The containerd line this daemon and its `ctr` calls are of.
    pub line: Line,
    /// Started with the CRI plugin and runc ([`Containerd::start_cri`]).
    cri: bool,
    /// The cluster host whose network namespace the daemon and every `ctr` run in.
    host: Option<NetHost>,
    /// Targets of [`Containerd::rootfs`] still mounted, to undo on drop.
    mounts: Mutex<Vec<PathBuf>>,
}

impl Containerd {
    /// Starts containerd with its files under `dir` (created if missing) and the best
    /// snapshotter that works there; returns once it answers on its socket.
    pub fn start(dir: &Path) -> Containerd {
        Containerd::launch(dir, None, None)
    }

    /// Like [`Containerd::start`], in `host`'s network namespace (and the test's mount
    /// namespace: its socket and mounts are on this machine's filesystem).
    pub fn start_in(dir: &Path, host: &NetHost) -> Containerd {
        Containerd::launch(dir, Some(host), None)
    }

    /// Like [`Containerd::start`] or [`Containerd::start_in`], with this snapshotter
    /// rather than the detected one.
    pub fn start_with(dir: &Path, host: Option<&NetHost>, snapshotter: Snapshotter) -> Containerd {
        Containerd::launch(dir, host, Some(snapshotter))
    }

    /// containerd as a Kubernetes node runs it: the CRI plugin (its image service on
    /// the daemon's socket, as the kubelet uses it) and runc, in `host`'s network
    /// namespace if given. `configure` gets the config file before the daemon starts:
    /// to make the Tessera snapshotter the CRI plugin's, as `tessera containerd-config
    /// --snapshotter-socket` does, with `snapshotter` [`Snapshotter::Tessera`] (what
    /// `ctr` calls use); else the CRI plugin uses overlayfs. Registries are reached as
    /// `hosts_dir/<host:port>/hosts.toml` say.
    pub fn start_cri(
        dir: &Path,
        host: Option<&NetHost>,
        snapshotter: Snapshotter,
        hosts_dir: &Path,
        configure: impl FnOnce(&Path) + 'static,
    ) -> Containerd {
        let cri = Cri {
            hosts_dir: hosts_dir.to_path_buf(),
            configure: Box::new(configure),
        };
        Containerd::launch_with(dir, host, Some(snapshotter), Some(cri))
    }

    /// [`Containerd::start_cri`] on this machine with the Tessera snapshotter at
    /// `snapshotter_socket` made CRI's as a user would (`tessera containerd-config
    /// --snapshotter-socket`), reaching `registry` (`host:port`) over plain HTTP.
    pub fn start_cri_tessera(dir: &Path, snapshotter_socket: &Path, registry: &str) -> Containerd {
        let hosts = dir.join("certs.d");
        plain_http_hosts(&hosts, registry);
        let socket = snapshotter_socket.to_path_buf();
        Containerd::start_cri(dir, None, Snapshotter::Tessera, &hosts, move |config| {
            super::tessera_ok(&[
                "containerd-config",
                "--snapshotter-socket",
                socket.to_str().expect("utf-8"),
                "--containerd-config",
                config.to_str().expect("utf-8"),
            ]);
        })
    }

    fn launch(dir: &Path, host: Option<&NetHost>, snapshotter: Option<Snapshotter>) -> Containerd {
        Containerd::launch_with(dir, host, snapshotter, None)
    }

    fn launch_with(
        dir: &Path,
        host: Option<&NetHost>,
        snapshotter: Option<Snapshotter>,
        cri: Option<Cri>,
    ) -> Containerd {
        let line = Line::current();
        let program = line.program("containerd");
        line.program("ctr");
        std::fs::create_dir_all(dir).expect("create containerd dir");
        // Absolute and without symlinks, as the mount table names what drop unmounts.
        let dir = &dir.canonicalize().expect("canonical containerd dir");
        let socket = dir.join("containerd.sock");
        assert!(
            socket.as_os_str().len() <= MAX_SOCKET_PATH,
            "containerd socket path too long for a unix socket: {}",
            socket.display()
        );
        let snapshotter = snapshotter.unwrap_or_else(|| Snapshotter::detect(dir));
        let config = dir.join("config.toml");
        let is_cri = cri.is_some();
        let text = match &cri {
            Some(cri) => cri_config_toml(line, dir, &socket, cri),
            None => config_toml(line, dir, &socket, snapshotter),
        };
        std::fs::write(&config, text).expect("write containerd config");
        if let Some(cri) = cri {
            (cri.configure)(&config);
        }
        let log = std::fs::File::create(dir.join("containerd.log")).expect("containerd log");
        let mut containerd = Containerd {
            child: None,
            dir: dir.to_path_buf(),
            socket,
            snapshotter,
            line,
            cri: is_cri,
            host: host.cloned(),
            mounts: Mutex::new(Vec::new()),
        };
        // From here on, dropping `containerd` cleans up (the tmpfs below, the daemon).
        if snapshotter == Snapshotter::OverlayfsOnTmpfs {
            let root = dir.join("snapshots");
            assert!(
                mount_tmpfs(&root),
                "mount a tmpfs at {} for overlayfs",
                root.display()
            );
        }
        let mut command = match host {
            Some(h) => h.command(&program),
            None => Command::new(&program),
        };
        let child = command
            .env("PATH", line.daemon_path())
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::from(log.try_clone().expect("clone log handle")))
            .stderr(Stdio::from(log))
            .spawn()
            .expect("start containerd");
        containerd.child = Some(child);
        containerd.wait_ready();
        containerd
    }

    /// Waits until the socket accepts, then until `ctr version` gets an answer (a
    /// `ctr` against a missing socket would sit in its own 10 s dial timeout).
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "containerd exited ({status}) before answering:\n{}",
                        self.log()
                    );
                }
            }
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && self.ctr(&["version"]).status.success()
            {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "containerd did not answer on {} within {START_TIMEOUT:?}:\n{}",
                    self.socket.display(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The daemon's pid (the program's own: nsenter with `--net` alone execs it).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).expect("containerd runs")
    }

    /// containerd's log so far (its stdout and stderr).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }

    /// `ctr --address SOCKET --namespace tessera-test ARGS`, whatever its outcome, in
    /// the daemon's network namespace.
    pub fn ctr(&self, args: &[&str]) -> Output {
        self.ctr_command().args(args).output().expect("run ctr")
    }

    /// Like [`Containerd::ctr`], panicking with `ctr`'s output and the daemon's log if
    /// it fails; returns its stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        self.check(&out, args);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn check(&self, out: &Output, args: &[&str]) {
        assert!(
            out.status.success(),
            "ctr {args:?} failed: {}\n--- stdout ---\n{}\n--- stderr ---\n{}\n\
             --- containerd log ---\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
    }

    /// The `ctr` command with the harness's global flags and environment.
    fn ctr_command(&self) -> Command {
        self.ctr_command_in(NAMESPACE)
    }

    /// `ctr` in the CRI plugin's namespace (`k8s.io`), where the images it pulls are.
    pub fn ctr_k8s(&self, args: &[&str]) -> Output {
        self.ctr_command_in(CRI_NAMESPACE)
            .args(args)
            .output()
            .expect("run ctr")
    }

    fn ctr_command_in(&self, namespace: &str) -> Command {
        let ctr = self.line.program("ctr");
        let mut command = match &self.host {
            Some(h) => h.command(&ctr),
            None => Command::new(&ctr),
        };
        command
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", namespace, "--timeout", CTR_TIMEOUT])
            .env("CONTAINERD_SNAPSHOTTER", self.snapshotter.name())
            .stdin(Stdio::null());
        for var in PROXY_VARS {
            command.env_remove(var);
        }
        command
    }

    /// `ctr image pull` of `reference` (fetch, then unpack into the snapshotter),
    /// whatever its outcome.
    pub fn pull(&self, reference: &str, opts: &PullOptions) -> Output {
        let args = pull_args(reference, opts);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.ctr(&args)
    }

    /// Like [`Containerd::pull`], panicking with `ctr`'s output and the daemon's log
    /// if the pull fails.
    pub fn pull_ok(&self, reference: &str, opts: &PullOptions) -> Output {
        let args = pull_args(reference, opts);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = self.ctr(&args);
        self.check(&out, &args);
        // `ctr` logs a hosts.toml it cannot parse and goes on as if it were absent.
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !stderr.contains("failed to decode hosts.toml"),
            "ctr ignored a hosts.toml of {:?}:\n{stderr}",
            opts.hosts_dir
        );
        out
    }

    /// Mounts the unpacked filesystem of `reference` (pulled before) read-only at
    /// `target` (created if missing), as `ctr image mount` does; unmounted by
    /// [`Containerd::unmount`] or on drop.
    pub fn rootfs(&self, reference: &str, target: &Path) {
        std::fs::create_dir_all(target).expect("create rootfs target");
        let target_s = target.to_str().expect("utf-8 path");
        self.ctr_ok(&["image", "mount", reference, target_s]);
        lock(&self.mounts).push(target.to_path_buf());
    }

    /// Undoes [`Containerd::rootfs`]: unmounts `target` and removes its view snapshot.
    pub fn unmount(&self, target: &Path) {
        let target_s = target.to_str().expect("utf-8 path");
        self.ctr_ok(&["image", "unmount", "--rm", target_s]);
        lock(&self.mounts).retain(|m| m != target);
    }

    /// `ctr image rm --sync`: removes the image and, GC having run, its blobs and
    /// snapshots, so that a later pull has to fetch everything again.
    pub fn remove_image(&self, reference: &str) {
        self.ctr_ok(&["image", "rm", "--sync", reference]);
    }

    /// The image names the namespace holds (`ctr image ls -q`).
    pub fn images(&self) -> Vec<String> {
        lines(&self.ctr_ok(&["image", "ls", "-q"]))
    }

    /// Whether the content store of the namespace holds the blob `digest`
    /// (`sha256:…`).
    pub fn content_exists(&self, digest: &str) -> bool {
        lines(&self.ctr_ok(&["content", "ls", "-q"]))
            .iter()
            .any(|d| d == digest)
    }

    /// Snapshot keys in the namespace (`ctr snapshot ls`, first column).
    pub fn snapshots(&self) -> Vec<String> {
        self.ctr_ok(&["snapshot", "ls"])
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect()
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        // The test's own views first, through containerd while it still runs, so their
        // snapshots and leases go too; a lazy unmount if that fails.
        let targets = std::mem::take(&mut *lock(&self.mounts));
        for target in targets.iter().rev() {
            let _ = self
                .ctr_command()
                .args(["image", "unmount", "--rm"])
                .arg(target)
                .output();
            if super::agent::is_mounted(target) {
                umount_lazy(target);
            }
        }
        if self.cri {
            // Containers still running (a failed test): killed and deleted through the
            // daemon while it runs, in the CRI plugin's namespace and in the harness's
            // (`ctr run` after `tessera pull`). A killed shim would leave them running.
            for namespace in [CRI_NAMESPACE, NAMESPACE] {
                let ctr = |args: &[&str]| {
                    self.ctr_command_in(namespace)
                        .args(args)
                        .output()
                        .expect("run ctr")
                };
                let tasks = ctr(&["task", "ls", "-q"]);
                for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
                    let _ = ctr(&["task", "kill", "-s", "SIGKILL", id]);
                    let _ = ctr(&["task", "delete", "-f", id]);
                    let _ = ctr(&["container", "delete", id]);
                }
            }
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Containers' shims (and their containers) outlive the daemon: each names the
        // daemon's socket on its command line.
        if self.cri {
            let _ = Command::new("pkill")
                .arg("-9")
                .arg("-f")
                .arg(self.socket.as_os_str())
                .status();
        }
        // Anything else under `dir`: snapshot mounts containerd left, the tmpfs.
        for mount_point in mounts_under(&self.dir).iter().rev() {
            umount_lazy(mount_point);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect()
}

fn pull_args(reference: &str, opts: &PullOptions) -> Vec<String> {
    let mut args = vec!["image".to_owned(), "pull".to_owned()];
    if let Some(dir) = &opts.hosts_dir {
        args.push("--hosts-dir".to_owned());
        args.push(dir.to_str().expect("utf-8 path").to_owned());
    }
    if let Some(user) = &opts.user {
        args.push("--user".to_owned());
        args.push(user.clone());
    }
    if opts.plain_http {
        args.push("--plain-http".to_owned());
    }
    if let Some(platform) = &opts.platform {
        args.push("--platform".to_owned());
        args.push(platform.clone());
    }
    if opts.http_dump {
        args.push("--http-dump".to_owned());
    }
    args.push(reference.to_owned());
    args
}

fn path(p: &Path) -> String {
    p.to_str().expect("utf-8 path").to_owned()
}

/// What every daemon's config.toml starts with: its version, its files under `dir`,
/// its sockets, the plugin it cannot run without, and the plugins it must not load
/// (each probes the host, or creates files outside `dir`).
fn daemon_toml(line: Line, dir: &Path, socket: &Path, required: &str, disabled: &[&str]) -> String {
    // The same plugins under each line's names: 2.x renamed the restart and cgroups
    // monitors, dropped aufs, and added NRI (a socket under /var/run/nri) and the
    // erofs and blockfile snapshotters.
    let host_probing: &[&str] = match line {
        Line::V1_6 => &[
            "io.containerd.snapshotter.v1.aufs",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.internal.v1.opt",
            "io.containerd.internal.v1.restart",
        ],
        Line::V2 => &[
            "io.containerd.snapshotter.v1.blockfile",
            "io.containerd.snapshotter.v1.btrfs",
            "io.containerd.snapshotter.v1.devmapper",
            "io.containerd.snapshotter.v1.erofs",
            "io.containerd.snapshotter.v1.zfs",
            "io.containerd.internal.v1.opt",
            "io.containerd.monitor.container.v1.restart",
            "io.containerd.nri.v1.nri",
        ],
    };
    let disabled: String = host_probing
        .iter()
        .chain(disabled)
        .map(|p| format!("  \"{p}\",\n"))
        .collect();
    format!(
        r#"version = {version}
root = "{root}"
state = "{state}"
temp = "{temp}"
required_plugins = ["{required}"]
disabled_plugins = [
{disabled}]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "info"
"#,
        version = line.config_version(),
        root = path(&dir.join("root")),
        state = path(&dir.join("state")),
        temp = path(&dir.join("tmp")),
        socket = path(socket),
    )
}

/// The daemon's configuration: everything under `dir`, nothing it does not need.
fn config_toml(line: Line, dir: &Path, socket: &Path, snapshotter: Snapshotter) -> String {
    let overlay_root = match snapshotter {
        Snapshotter::OverlayfsOnTmpfs => path(&dir.join("snapshots")),
        // Empty: the default, under `root`.
        Snapshotter::Overlayfs | Snapshotter::Native | Snapshotter::Tessera => String::new(),
    };
    let required = format!("io.containerd.snapshotter.v1.{}", snapshotter.name());
    let disabled: &[&str] = match line {
        Line::V1_6 => &[
            "io.containerd.grpc.v1.cri",
            "io.containerd.runtime.v1.linux",
            "io.containerd.runtime.v2.task",
            "io.containerd.monitor.v1.cgroups",
            "io.containerd.service.v1.tasks-service",
            "io.containerd.grpc.v1.tasks",
        ],
        Line::V2 => &[
            "io.containerd.grpc.v1.cri",
            "io.containerd.cri.v1.images",
            "io.containerd.cri.v1.runtime",
            "io.containerd.podsandbox.controller.v1.podsandbox",
            "io.containerd.sandbox.controller.v1.shim",
            "io.containerd.runtime.v2.task",
            "io.containerd.monitor.task.v1.cgroups",
            "io.containerd.service.v1.tasks-service",
            "io.containerd.grpc.v1.tasks",
        ],
    };
    // 2.x: `ctr image pull` unpacks through the transfer service, which unpacks only
    // for the (platform, snapshotter) pairs it is configured with; by default just
    // overlayfs ("no unpack platforms defined" for any other).
    let unpack = match line {
        Line::V1_6 => String::new(),
        Line::V2 => transfer_unpack_toml(snapshotter),
    };
    format!(
        r#"{daemon}
[plugins."io.containerd.snapshotter.v1.overlayfs"]
  root_path = "{overlay_root}"
{unpack}"#,
        daemon = daemon_toml(line, dir, socket, &required, disabled),
    )
}

/// containerd 2.x's transfer service told to unpack Linux images into `snapshotter`.
fn transfer_unpack_toml(snapshotter: Snapshotter) -> String {
    format!(
        r#"
[[plugins."io.containerd.transfer.v1.local".unpack_config]]
  platform = "linux"
  snapshotter = "{}"
"#,
        snapshotter.name()
    )
}

/// Writes `hosts_dir/<registry>/hosts.toml` telling containerd to speak plain HTTP to
/// `registry` (`host:port`), for the CRI plugin's `config_path`.
pub fn plain_http_hosts(hosts_dir: &Path, registry: &str) {
    let dir = hosts_dir.join(registry);
    std::fs::create_dir_all(&dir).expect("create hosts dir");
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .expect("write hosts.toml");
}

/// What [`Containerd::start_cri`] configures.
struct Cri {
    hosts_dir: PathBuf,
    configure: Box<dyn FnOnce(&Path)>,
}

/// A node's configuration: the CRI plugin, runc, and no CNI (containers run by `ctr
/// run` need none; pods are not made). The snapshotter is left to `configure`. The
/// same settings in each line's layout: containerd 2.x splits 1.6's one CRI plugin
/// into the CRI service, its runtime settings and its image settings.
fn cri_config_toml(line: Line, dir: &Path, socket: &Path, cri: &Cri) -> String {
    let daemon = daemon_toml(line, dir, socket, "io.containerd.grpc.v1.cri", &[]);
    let cni = path(&dir.join("cni"));
    let hosts = path(&cri.hosts_dir);
    match line {
        Line::V1_6 => format!(
            r#"{daemon}
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni}/bin"
    conf_dir = "{cni}/conf"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{hosts}"
"#
        ),
        Line::V2 => format!(
            r#"{daemon}
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins."io.containerd.cri.v1.runtime"]
  enable_selinux = false
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni}/bin"]
    conf_dir = "{cni}/conf"

[plugins."io.containerd.cri.v1.images"]
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{hosts}"
"#
        ),
    }
}

/// Whether an overlay with an upper dir mounts under `probe` (created, then left
/// unmounted for the caller to remove).
fn overlay_works(probe: &Path) -> bool {
    let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|d| probe.join(d));
    for d in [&lower, &upper, &work, &merged] {
        if std::fs::create_dir_all(d).is_err() {
            return false;
        }
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let mounted = Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged)
        .output()
        .is_ok_and(|o| o.status.success());
    if mounted {
        umount_lazy(&merged);
    }
    mounted
}

/// Mounts a fresh tmpfs at `at` (created if missing).
fn mount_tmpfs(at: &Path) -> bool {
    std::fs::create_dir_all(at).is_ok()
        && Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=0700", "tmpfs"])
            .arg(at)
            .output()
            .is_ok_and(|o| o.status.success())
}

fn umount_lazy(path: &Path) {
    let _ = Command::new("umount").arg("-l").arg(path).output();
}

/// Mount points at or under `dir` in this process's mount table, in mount order.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(unescape_mountinfo(p)))
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
