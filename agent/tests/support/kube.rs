//! A real one-machine Kubernetes cluster per test: etcd, kube-apiserver,
//! kube-controller-manager, kube-scheduler and CoreDNS, and nodes that each run their own
//! containerd 2 (CRI, runc, CNI bridge) and kubelet. Everything lives in a temp dir;
//! dropping the [`KubeCluster`] puts the machine back as it was, also after a panic.
//!
//! ```ignore
//! let registry = Registry::start();
//! let mut cluster = KubeCluster::start(&KubeOptions::default());
//! cluster.add_node();
//! let host = cluster.expose_registry(&registry.addr); // every node pulls HOST/…
//! cluster.kubectl_apply(POD_YAML); // hostPaths under cluster.host_root(): per node
//! cluster.kubectl_ok(&["wait", "--for=condition=Ready", "pod/hello", "--timeout=60s"]);
//! let node = &cluster.nodes()[1];
//! node.command("findmnt").output(); // as node-2 sees its mounts
//! std::fs::read(node.host_path("var/lib/tessera/cache/…")); // node-2's files
//! ```
//!
//! Binaries: `make kubernetes-deps` (scripts/kubernetes-deps.sh: Kubernetes
//! [`K8S_VERSION`], etcd, CoreDNS, a static `pause`) and `make containerd-deps`
//! (containerd [`super::containerd::CONTAINERD2_VERSION`] with its runc: the
//! containerd harness's 2.x line); CNI plugins from Debian's
//! `containernetworking-plugins` in `/usr/lib/cni`. Root is needed. A missing piece
//! fails the test saying what to run; nothing is skipped.
//!
//! # Addresses
//!
//! All from 198.18.0.0/15 (RFC 2544, benchmarking: never a real network), apart from
//! the ranges other tests use (`support::netns`: 198.18.K.0/24; the demo:
//! 198.19.254.0/24). A cluster takes a slot S in 0..10, the first whose
//! interface `tskS` does not exist yet, so clusters of concurrent test processes do not
//! clash:
//!
//! | what | where |
//! |---|---|
//! | control plane (apiserver :6443, controller-manager, scheduler, CoreDNS :53) | 198.19.(100+S).254 |
//! | node N's address (kubelet :10250, InternalIP) | 198.19.(100+S).N |
//! | node N ≥ 2's network namespace, veth `tskSvN` ↔ its `eth0` | `tskS-nN` |
//! | Services (`--service-cluster-ip-range`; `kubernetes` is .1) | 198.19.(110+S).0/24 |
//! | node N's pods (CNI bridge `tskbrS-N`, host-local) | 198.19.(120+S).64·(N−1)/26 |
//!
//! The control plane's and node 1's addresses are /32s on the interface `tskS` (one
//! end of a veth pair: this kernel has no `dummy` driver), which the harness adds and
//! deletes. Pods get routes to 198.19.(100+S).0/24 (CoreDNS, the apiserver) and to
//! 198.19.(120+S).0/24 (other nodes' pods) through their bridge, and no default route:
//! their traffic cannot leave this machine. There is no kube-proxy, so ClusterIPs do
//! not route; CoreDNS answers for them all the same.
//! etcd listens on 127.0.0.1 (free ports): only the apiserver talks to it.
//!
//! Node 1 shares the test's network namespace; every later node has its own, routed
//! to the test's through a veth pair (its pods' /26 routed to it), so that each node's
//! containerd, kubelet and host-network pods bind their ports apart, as on separate
//! machines.
//!
//! # Registries
//!
//! Node 1 reaches the test's registries on 127.0.0.1; later nodes do not (127.0.0.1 is
//! their own). [`KubeCluster::expose_registry`] makes a registry reachable from every
//! node: a listener of the test process on the control-plane address (every node routes
//! to it) passes connections on, and every node's containerd gets a `hosts.toml` (plain
//! HTTP) for that address. A registry bound on the control-plane address itself needs
//! only [`KubeCluster::trust_plain_http_registry`]. Or import images into every node
//! with [`KubeCluster::import_image`].
//!
//! # Each node's host filesystem
//!
//! On real machines every node has a filesystem of its own; here they share one. So
//! every node (node 1 too) runs its containerd, kubelet, shims and containers in a
//! mount namespace of its own, kept as the file `DIR/ns/node-N` (as `ip netns` keeps
//! network namespaces; `DIR/ns` is a private mount, which nsfs binds need), in which
//! [`KubeCluster::host_root`] (`DIR/host`) is a bind of the node's own `DIR/nodes/node-N/host`
//! ([`Node::host_path`] finds it from the test). A chart's hostPaths under the host
//! root thus mean "this node's" on every node. containerd's config file, hosts
//! directory and socket sit at fixed paths there ([`CONTAINERD_CONFIG`],
//! [`CONTAINERD_CERTS_D`], [`CONTAINERD_SOCKET`]). Propagation, inside a node's
//! namespace: everything is a slave of the test's mounts (what the test mounts under
//! `DIR` arrives; nothing a node mounts goes back to the test or to another node); the
//! host root's bind is shared, a peer group of its own (`Bidirectional` hostPaths need
//! a shared mount: a pod's mounts there reach the node, and only it); the kubelet's
//! root is a shared bind on itself (its pods' volumes). [`Node::command`] runs a
//! program as the node sees things (nsenter into its mount and network namespaces).
//!
//! Nodes still share the fixed paths below: a later kubelet takes over
//! `/var/lib/kubelet/device-plugins/kubelet.sock`, which matters only to device
//! plugins, which these clusters do not run.
//!
//! # What else the cluster touches on the host, and how it is put back
//!
//! * **Processes**: every daemon is a child of the test, killed on drop; containers
//!   and pause processes are found through the node's cgroup root (`/tskS-N` in every
//!   cgroup v1 hierarchy, made for the kubelet's `cgroupRoot`), shims through their
//!   command line (it names the node's containerd socket). All are killed, then the
//!   cgroups removed.
//! * **Mounts**: the temp dir is bind-mounted on itself and made `rshared` (`/` is a
//!   private mount here; the nodes' namespaces are its slaves), `DIR/ns` bound on
//!   itself, private, holding the nodes' mount namespace files. containerd's overlays,
//!   the pods' network namespaces (`netns_mounts_under_state_dir`, not
//!   `/var/run/netns`), the kubelet's volumes and what pods mount under the host root
//!   are made in the nodes' mount namespaces, under the temp dir. On drop, once every
//!   process in a node's namespace is killed (found by the namespace's inode), all of
//!   that is unmounted inside it, then its file unmounted, and the namespace is gone;
//!   then the test's own mounts, innermost first.
//! * **Network**: the `tskS` veth pair, node 1's CNI bridge, later nodes' network
//!   namespaces (with their bridges and veths); pods' veths go with their namespaces; host-local keeps its leases in the temp dir; libcni's
//!   cache files (`/var/lib/cni/results/…`, a path containerd does not let us move)
//!   are removed by network name, or for containerd's own loopback network by the
//!   pod namespace path they name. No iptables rule is made (`ipMasq` off,
//!   no portmap, `makeIPTablesUtilChains: false`).
//! * **sysctls**: the kubelet sets vm.overcommit_memory, vm.panic_on_oom, kernel.panic,
//!   kernel.panic_on_oops and kernel.keys.root_max{keys,bytes}; the bridge plugin turns
//!   on net.ipv4.ip_forward. Their values are recorded before anything starts and
//!   written back on drop. Clusters in one process run one at a time (a lock) so that
//!   a second one never records the first one's values as the machine's.
//! * **Files outside the temp dir**: a few paths are fixed in the daemons' code. The
//!   kubelet registers device plugins on `/var/lib/kubelet/device-plugins/kubelet.sock`
//!   and links container logs into `/var/log/containers`; containerd 2 puts shim
//!   sockets in `/run/containerd/s`. Links into the temp dir and sockets nobody listens
//!   on any more are removed, and each of these paths the machine did not have before
//!   (directories once empty). runc's state and the kubelet's certificates are moved
//!   into the temp dir (the runtime's `Root`, `--cert-dir`).
//!
//! [`Footprint`] is what a test checks after the drop: no mount, process, interface,
//! cgroup, network namespace or file of the cluster left, no process in a node's mount
//! namespace and no mount holding one, sysctls and iptables rules as before.
//!
//! # Facts this relies on (Debian bookworm, kernel 6.18, cgroup v1, PID 1 not systemd)
//!
//! * containerd's CRI needs `restrict_oom_score_adj = true`: root here lacks
//!   CAP_SYS_RESOURCE, cannot lower oom_score_adj, and every sandbox would fail with
//!   "can't get final child's PID from pipe: EOF".
//! * The kubelet needs `failCgroupV1: false`, `cgroupDriver: cgroupfs` (containerd
//!   reports the same from `SystemdCgroup = false`), and a node IP that is not
//!   loopback; the apiserver reaches it as InternalIP.
//! * No registry outside is reachable: the sandbox image is our own static `pause`
//!   (scripts/pause/pause.c), imported with `ctr images import` and pinned as
//!   containerd's sandbox image.
//! * The controller-manager starts only once an authenticated `/readyz` passes; pods
//!   can be created once it has made the namespace's `default` ServiceAccount.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::containerd::{Line, PROXY_VARS};
use super::oci::{self, require_tool, run};

/// The Kubernetes release `make kubernetes-deps` builds.
pub const K8S_VERSION: &str = "v1.34.4";

/// Each node's containerd config file, relative to [`KubeCluster::host_root`] (as
/// `/etc/containerd/config.toml` is to `/` on a real node).
pub const CONTAINERD_CONFIG: &str = "etc/containerd/config.toml";

/// Each node's containerd hosts directory (the CRI plugin's `config_path`), relative to
/// [`KubeCluster::host_root`].
pub const CONTAINERD_CERTS_D: &str = "etc/containerd/certs.d";

/// Each node's containerd socket, relative to [`KubeCluster::host_root`].
pub const CONTAINERD_SOCKET: &str = "run/containerd/containerd.sock";

/// Where the sandbox image is named (imported, never pulled).
pub const PAUSE_IMAGE: &str = "tessera.test/pause:v1";

/// How long a cluster may take from nothing to a Ready node.
const BRING_UP: Duration = Duration::from_secs(120);

/// How long a single daemon may take to answer.
const DAEMON_START: Duration = Duration::from_secs(60);

/// The CNI plugins' directory (Debian `containernetworking-plugins`).
const CNI_BIN: &str = "/usr/lib/cni";

/// The kubelet writes links to container logs here whatever its config says.
const CONTAINER_LOG_LINKS: &str = "/var/log/containers";

/// libcni's cache of results (`<network>-<container>-<ifname>`), a fixed path.
const CNI_CACHE: &str = "/var/lib/cni";

/// containerd 2's shim sockets (`pkg/shim`: `defaults.DefaultStateDir/s`), a fixed path.
const SHIM_SOCKETS: &str = "/run/containerd/s";

/// Fixed paths the daemons make whatever their configuration says, children before
/// parents, and whether [`Footprint::assert_clean`] checks them. Each one the machine
/// did not have before is removed on drop (directories only when empty: another
/// cluster may be using them):
/// * the kubelet's device-plugin registration socket (`pluginapi.KubeletSocket`,
///   hard-coded) and its directory;
/// * the kubelet's container log links;
/// * libcni's cache;
/// * containerd 2's shim sockets, and runc's default state dir (moved with the
///   runtime's `Root`). Not checked: containerd 2 tests running beside this one make
///   them too; stale sockets of ours are checked one by one.
const FIXED_PATHS: [(&str, bool); 12] = [
    ("/var/lib/kubelet/device-plugins/kubelet.sock", true),
    (
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint",
        true,
    ),
    ("/var/lib/kubelet/device-plugins", true),
    ("/var/lib/kubelet", true),
    (CONTAINER_LOG_LINKS, true),
    ("/var/lib/cni/results", true),
    (CNI_CACHE, true),
    (SHIM_SOCKETS, false),
    ("/run/containerd/runc/k8s.io", true),
    ("/run/containerd/runc", false),
    ("/run/containerd", false),
    // `ip netns add` makes it for a second node; the netns tests make it too.
    ("/run/netns", false),
];

/// sysctls the kubelet (container manager) and the CNI bridge plugin change.
const SYSCTLS: [&str; 7] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
];

/// One cluster at a time per process: sysctls are recorded as the machine's, and a
/// [`Footprint`] is checked with no cluster up.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One cluster at a time on the machine, across test processes: the clusters' nodes
/// share host ports and the machine's sysctls, and each [`Footprint`] would count
/// another process's cluster as left behind. Released when the holder exits.
const MACHINE_LOCK: &str = "/run/lock/tessera-kube-tests.lock";

/// The holder of [`MACHINE_LOCK`] (and of [`ONE_AT_A_TIME`]), waiting for it first.
#[derive(Debug)]
struct OneOnTheMachine {
    _file: std::fs::File,
    _in_process: MutexGuard<'static, ()>,
}

impl OneOnTheMachine {
    fn take() -> OneOnTheMachine {
        let in_process = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
        std::fs::create_dir_all("/run/lock").expect("create /run/lock");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(MACHINE_LOCK)
            .unwrap_or_else(|e| panic!("open {MACHINE_LOCK}: {e}"));
        let began = Instant::now();
        rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
            .unwrap_or_else(|e| panic!("lock {MACHINE_LOCK}: {e}"));
        if began.elapsed() > Duration::from_secs(1) {
            eprintln!(
                "waited {:.0?} for another test process's Kubernetes cluster to go",
                began.elapsed()
            );
        }
        OneOnTheMachine {
            _file: file,
            _in_process: in_process,
        }
    }
}

/// A Kubernetes binary from `make kubernetes-deps`, checked to be there.
pub fn kube_bin(name: &str) -> PathBuf {
    let bin = super::repo_root()
        .join("target/tools")
        .join(format!("kubernetes-{K8S_VERSION}"))
        .join("bin")
        .join(name);
    assert!(
        bin.is_file(),
        "{} is missing: run `make kubernetes-deps` (scripts/kubernetes-deps.sh builds \
         Kubernetes {K8S_VERSION}, etcd, CoreDNS and pause from the Go module proxy; \
         about 21 minutes on 2 cores with a cold Go cache)",
        bin.display()
    );
    bin
}

/// A containerd 2 binary (containerd, ctr, containerd-shim-runc-v2, runc) from `make
/// containerd-deps`, checked to be there.
pub fn containerd_bin(name: &str) -> PathBuf {
    Line::V2.program(name)
}

fn containerd_bin_dir() -> PathBuf {
    Line::V2
        .bin_dir()
        .expect("containerd 2.x lives in target/tools")
}

/// The addresses of the cluster in slot `slot` (see the module doc's table).
#[derive(Debug, Clone, Copy)]
pub struct Addresses {
    pub slot: u8,
}

impl Addresses {
    /// apiserver, controller-manager, scheduler and CoreDNS.
    pub fn control_plane(self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 100 + self.slot, 254)
    }

    /// Node `n` (1-based).
    pub fn node(self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 100 + self.slot, n)
    }

    /// The Service range.
    pub fn service_cidr(self) -> String {
        format!("198.19.{}.0/24", 110 + self.slot)
    }

    /// The `kubernetes` Service's ClusterIP (the range's first address).
    pub fn kubernetes_service(self) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 110 + self.slot, 1)
    }

    /// Node `n`'s pod range, a /26 (62 pods).
    pub fn pod_cidr(self, n: u8) -> String {
        format!("198.19.{}.{}/26", 120 + self.slot, 64 * (n - 1))
    }

    /// Node `n`'s pod gateway: its CNI bridge's address.
    pub fn pod_gateway(self, n: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 19, 120 + self.slot, 64 * (n - 1) + 1)
    }

    /// Every node's pods.
    pub fn all_pods_cidr(self) -> String {
        format!("198.19.{}.0/24", 120 + self.slot)
    }

    /// What the pods may reach: the hosts' /24.
    pub fn host_cidr(self) -> String {
        format!("198.19.{}.0/24", 100 + self.slot)
    }
}

/// What a test wants of the cluster.
#[derive(Debug, Clone, Default)]
pub struct KubeOptions {
    /// Registries (`host:port`) the nodes' containerd reaches over plain HTTP (a
    /// `hosts.toml` each under the CRI plugin's `config_path`, on every node). A
    /// registry on 127.0.0.1 is reached by node 1 only: see
    /// [`KubeCluster::expose_registry`].
    pub plain_http_registries: Vec<String>,
    /// The kubelets' image garbage collection; `None`: off (a test machine's disk
    /// may be fuller than a node's defaults allow, and images the test imported must
    /// stay).
    pub image_gc: Option<ImageGc>,
}

/// The kubelet's image garbage collection, as KubeletConfiguration names it. The
/// kubelet runs it at its start and every 5 minutes after (not configurable).
#[derive(Debug, Clone, Copy)]
pub struct ImageGc {
    /// `imageGCHighThresholdPercent`: at this usage of the image filesystem it frees
    /// unused images...
    pub high_threshold_percent: u8,
    /// `imageGCLowThresholdPercent`: ...down to this one.
    pub low_threshold_percent: u8,
    /// `imageMinimumGCAge`: an image detected more recently is not freed for space.
    pub minimum_age: Duration,
    /// `imageMaximumGCAge`: an image unused for longer is freed whatever the usage,
    /// once the kubelet has run that long (zero: never).
    pub maximum_age: Duration,
}

impl ImageGc {
    /// The KubeletConfiguration lines.
    fn yaml(&self) -> String {
        format!(
            "imageGCHighThresholdPercent: {}\nimageGCLowThresholdPercent: {}\n\
             imageMinimumGCAge: {}s\nimageMaximumGCAge: {}s\n",
            self.high_threshold_percent,
            self.low_threshold_percent,
            self.minimum_age.as_secs(),
            self.maximum_age.as_secs()
        )
    }
}

impl KubeOptions {
    /// One plain-HTTP registry, e.g. a [`super::registry::Registry`]'s `addr`.
    pub fn with_registry(addr: &str) -> KubeOptions {
        KubeOptions {
            plain_http_registries: vec![addr.to_owned()],
            image_gc: None,
        }
    }
}

/// A running daemon; killed (SIGKILL: nothing of its state outlives the test) when
/// dropped.
#[derive(Debug)]
struct Daemon {
    name: String,
    child: Child,
    /// Its stdout and stderr.
    log: PathBuf,
}

impl Daemon {
    /// Starts `command` with its output appended to `log` (a restart's after the
    /// last run's), without proxy settings.
    fn spawn(name: &str, mut command: Command, log: &Path) -> Daemon {
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("open daemon log");
        let err = out.try_clone().expect("clone log handle");
        for var in PROXY_VARS {
            command.env_remove(var);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({command:?}): {e}"));
        Daemon {
            name: name.to_owned(),
            child,
            log: log.to_path_buf(),
        }
    }

    /// Panics with the end of its log if it has exited (a zombie, not yet reaped:
    /// `Child::try_wait` would need `&mut`, and waits run beside shared borrows).
    fn check_alive(&self) {
        let stat =
            std::fs::read_to_string(format!("/proc/{}/stat", self.child.id())).unwrap_or_default();
        // The state follows the parenthesised command name.
        let state = stat
            .rsplit_once(") ")
            .and_then(|(_, rest)| rest.chars().next());
        if matches!(state, None | Some('Z') | Some('X')) {
            panic!(
                "{} exited during bring-up; the end of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 60)
            );
        }
    }
}

impl Daemon {
    /// SIGTERM, as a service manager stops a daemon, and waits for it to exit;
    /// SIGKILL after `timeout`.
    fn stop(&mut self, timeout: Duration) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).output();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        eprintln!(
            "kube: {} did not exit on SIGTERM within {timeout:?}",
            self.name
        );
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last `lines` lines of a log file.
pub fn tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Certificates and keys of the cluster, all PEM under `dir/pki`.
#[derive(Debug)]
struct Pki {
    dir: PathBuf,
}

impl Pki {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA, the apiserver's serving certificate, the clients of the control plane and
    /// the service-account key pair.
    fn make(dir: &Path, addrs: Addresses) -> Pki {
        require_tool("openssl");
        let pki = Pki {
            dir: dir.join("pki"),
        };
        std::fs::create_dir_all(&pki.dir).expect("create pki dir");
        run(openssl()
            .args(["-x509", "-nodes", "-days", "2"])
            .args(["-subj", "/CN=tessera-kube-ca"])
            .args(["-addext", "basicConstraints=critical,CA:TRUE"])
            .args([
                "-addext",
                "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            ])
            .arg("-keyout")
            .arg(pki.path("ca.key"))
            .arg("-out")
            .arg(pki.ca()));
        let cp = addrs.control_plane().to_string();
        let svc = addrs.kubernetes_service().to_string();
        pki.sign(
            "apiserver",
            "/CN=kube-apiserver",
            &format!(
                "subjectAltName=IP:{cp},IP:{svc},IP:127.0.0.1,DNS:localhost,DNS:kubernetes,\
                 DNS:kubernetes.default,DNS:kubernetes.default.svc,\
                 DNS:kubernetes.default.svc.cluster.local\nextendedKeyUsage=serverAuth\n"
            ),
        );
        // The apiserver maps a client certificate's CN to the user, each O to a group.
        for (name, subject) in [
            ("admin", "/O=system:masters/CN=tessera-admin"),
            ("controller-manager", "/CN=system:kube-controller-manager"),
            ("scheduler", "/CN=system:kube-scheduler"),
            // The kubelet asks the apiserver (SubjectAccessReview) whether this user may
            // read logs: system:masters may.
            (
                "apiserver-kubelet-client",
                "/O=system:masters/CN=kube-apiserver-kubelet-client",
            ),
        ] {
            pki.client(name, subject);
        }
        // Service-account tokens: ES256, which the apiserver signs and checks.
        run(Command::new("openssl")
            .args(["genpkey", "-algorithm", "EC"])
            .args(["-pkeyopt", "ec_paramgen_curve:P-256", "-out"])
            .arg(pki.path("sa.key")));
        run(Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(pki.path("sa.key"))
            .arg("-out")
            .arg(pki.path("sa.pub")));
        pki
    }

    /// A client certificate `name.pem` / `name.key` for `subject`.
    fn client(&self, name: &str, subject: &str) {
        self.sign(name, subject, "extendedKeyUsage=clientAuth\n");
    }

    /// A key and a certificate the CA signs, with `extensions` (openssl extfile lines).
    fn sign(&self, name: &str, subject: &str, extensions: &str) {
        let ext = self.path(&format!("{name}.ext"));
        std::fs::write(
            &ext,
            format!("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n{extensions}"),
        )
        .expect("write extensions");
        let csr = self.path(&format!("{name}.csr"));
        run(openssl()
            .args(["-nodes", "-subj", subject, "-keyout"])
            .arg(self.path(&format!("{name}.key")))
            .arg("-out")
            .arg(&csr));
        run(Command::new("openssl")
            .args(["x509", "-req", "-days", "2", "-CAcreateserial", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(self.ca())
            .arg("-CAkey")
            .arg(self.path("ca.key"))
            .arg("-extfile")
            .arg(&ext)
            .arg("-out")
            .arg(self.path(&format!("{name}.pem"))));
    }

    /// A kubeconfig at `path` for the client `name` (its certificate) of `server`.
    fn kubeconfig(&self, path: &Path, server: &str, name: &str) {
        let p = |f: &str| self.path(f).to_str().expect("utf-8 path").to_owned();
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: tessera\n  cluster:\n    \
                 server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {name}\n  \
                 user:\n    client-certificate: {cert}\n    client-key: {key}\ncontexts:\n- \
                 name: tessera\n  context:\n    cluster: tessera\n    user: {name}\n\
                 current-context: tessera\n",
                ca = p("ca.pem"),
                cert = p(&format!("{name}.pem")),
                key = p(&format!("{name}.key")),
            ),
        )
        .expect("write kubeconfig");
    }
}

/// `openssl req` making a fresh P-256 key: fast, and every Kubernetes component takes it.
fn openssl() -> Command {
    let mut c = Command::new("openssl");
    c.args([
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
    ]);
    c
}

/// The machine state the cluster changes, recorded before it starts.
#[derive(Debug, Clone)]
pub struct Footprint {
    /// The cluster's temp dir: must be gone, nothing mounted under it.
    pub dir: PathBuf,
    /// The `tskS` interface and the nodes' CNI bridges: must be gone.
    pub interfaces: Vec<String>,
    /// cgroup v1 directories (one per hierarchy per node): must be gone.
    pub cgroups: Vec<PathBuf>,
    /// `/proc/sys` paths and their values before the cluster.
    pub sysctls: Vec<(String, String)>,
    /// `iptables-save` before the cluster (counters removed), if iptables is here.
    pub iptables: Option<String>,
    /// The nodes' network namespaces (`/run/netns/NAME`): must be gone.
    pub netns: Vec<String>,
    /// The nodes' mount namespaces (node name, nsfs inode: `mnt:[INODE]`): no process
    /// may be in one any more, and no mount may hold one.
    pub mount_namespaces: Vec<(String, u64)>,
    /// Those of [`FIXED_PATHS`] that did not exist before, and whether each is checked.
    absent: Vec<(PathBuf, bool)>,
    /// What [`SHIM_SOCKETS`] held before.
    shim_sockets: Vec<PathBuf>,
    /// The CNI networks' names (libcni cache files start with them).
    networks: Vec<String>,
}

impl Footprint {
    fn record(dir: &Path) -> Footprint {
        Footprint {
            dir: dir.to_path_buf(),
            interfaces: Vec::new(),
            netns: Vec::new(),
            mount_namespaces: Vec::new(),
            cgroups: Vec::new(),
            sysctls: SYSCTLS
                .iter()
                .map(|s| ((*s).to_owned(), read_sysctl(s)))
                .collect(),
            iptables: iptables_rules(),
            absent: FIXED_PATHS
                .iter()
                .filter(|(p, _)| Path::new(p).symlink_metadata().is_err())
                .map(|(p, checked)| (PathBuf::from(p), *checked))
                .collect(),
            shim_sockets: list_dir(Path::new(SHIM_SOCKETS)).unwrap_or_default(),
            networks: Vec::new(),
        }
    }

    /// Panics naming everything of the cluster still on the machine.
    pub fn assert_clean(&self) {
        // Not while another test's cluster of this process is up: it would reuse this
        // one's slot, interface names included, the moment this one was dropped.
        let _no_cluster_up = OneOnTheMachine::take();
        let mut left = Vec::new();
        if self.dir.exists() {
            left.push(format!("temp dir {} still exists", self.dir.display()));
        }
        for m in mounts_under(&self.dir) {
            left.push(format!("mount {}", m.display()));
        }
        for (pid, what) in processes_of(&self.dir, &self.cgroup_names()) {
            left.push(format!("process {pid}: {what}"));
        }
        let inodes: Vec<u64> = self.mount_namespaces.iter().map(|(_, i)| *i).collect();
        for (pid, what) in processes_in_mount_namespaces(&inodes) {
            left.push(format!("process {pid} in a node's mount namespace: {what}"));
        }
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for (node, inode) in &self.mount_namespaces {
            let held = format!(" mnt:[{inode}] ");
            for line in table.lines().filter(|l| l.contains(&held)) {
                left.push(format!("{node}'s mount namespace still mounted: {line}"));
            }
        }
        for i in &self.interfaces {
            if Path::new("/sys/class/net").join(i).exists() {
                left.push(format!("network interface {i}"));
            }
        }
        for ns in &self.netns {
            if Path::new("/run/netns").join(ns).exists() {
                left.push(format!("network namespace {ns}"));
            }
        }
        for c in &self.cgroups {
            if c.exists() {
                left.push(format!("cgroup {}", c.display()));
            }
        }
        for (name, before) in &self.sysctls {
            let now = read_sysctl(name);
            if &now != before {
                left.push(format!("sysctl {name} is {now:?}, was {before:?}"));
            }
        }
        if let (Some(before), Some(now)) = (&self.iptables, iptables_rules()) {
            if &now != before {
                left.push(format!(
                    "iptables rules changed:\n--- before\n{before}\n--- after\n{now}"
                ));
            }
        }
        for link in log_links_into(&self.dir) {
            left.push(format!("log link {}", link.display()));
        }
        for (p, checked) in &self.absent {
            if *checked && p.symlink_metadata().is_ok() {
                left.push(format!("{} (did not exist before)", p.display()));
            }
        }
        let listening = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
        for socket in self.stale_shim_sockets(&listening) {
            left.push(format!("stale shim socket {}", socket.display()));
        }
        for f in self.cni_cache_files() {
            left.push(format!("CNI cache file {}", f.display()));
        }
        assert!(
            left.is_empty(),
            "the cluster left this on the machine:\n  {}",
            left.join("\n  ")
        );
    }

    /// The cgroup names (`tskS-N`) whose members are the nodes' containers.
    fn cgroup_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .cgroups
            .iter()
            .filter_map(|c| c.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// libcni cache files of this cluster's pods: named after its networks, or (the
    /// `cni-loopback` network containerd adds to every pod) naming a network namespace
    /// under the cluster's dir.
    fn cni_cache_files(&self) -> Vec<PathBuf> {
        let dir = self.dir.to_string_lossy().into_owned();
        list_dir(&Path::new(CNI_CACHE).join("results"))
            .unwrap_or_default()
            .into_iter()
            .filter(|f| {
                let name = f
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default();
                self.networks
                    .iter()
                    .any(|net| name.starts_with(&format!("{net}-")))
                    || std::fs::read_to_string(f).is_ok_and(|text| text.contains(&dir))
            })
            .collect()
    }

    /// Shim sockets that appeared since the cluster started and that nobody listens on
    /// (a killed shim leaves its socket file; a live one of another containerd is
    /// listed in `listening`, /proc/net/unix).
    fn stale_shim_sockets(&self, listening: &str) -> Vec<PathBuf> {
        list_dir(Path::new(SHIM_SOCKETS))
            .unwrap_or_default()
            .into_iter()
            .filter(|s| !self.shim_sockets.contains(s))
            .filter(|s| !listening.contains(s.to_string_lossy().as_ref()))
            .collect()
    }

    /// Puts back what is not a process, mount, interface or cgroup: sysctls, log
    /// links, libcni's cache files, stale shim sockets, and directories made for them.
    fn restore_files(&self) {
        for (name, value) in &self.sysctls {
            if read_sysctl(name) != *value {
                let _ = std::fs::write(Path::new("/proc/sys").join(name), value);
            }
        }
        for link in log_links_into(&self.dir) {
            let _ = std::fs::remove_file(link);
        }
        for f in self.cni_cache_files() {
            let _ = std::fs::remove_file(f);
        }
        let listening = std::fs::read_to_string("/proc/net/unix").unwrap_or_default();
        for socket in self.stale_shim_sockets(&listening) {
            let _ = std::fs::remove_file(&socket);
        }
        for (p, _) in &self.absent {
            match p.symlink_metadata() {
                Ok(m) if m.is_dir() => {
                    let _ = std::fs::remove_dir(p);
                }
                Ok(_) => {
                    let _ = std::fs::remove_file(p);
                }
                Err(_) => {}
            }
        }
    }
}

fn read_sysctl(name: &str) -> String {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

/// `iptables-save` without its comments and packet counters, or `None` without iptables.
fn iptables_rules() -> Option<String> {
    let out = Command::new("iptables-save").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Some(
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| match l.rfind(" [") {
                Some(i) if l.starts_with(':') => &l[..i],
                _ => l,
            })
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn list_dir(dir: &Path) -> Option<Vec<PathBuf>> {
    let entries = std::fs::read_dir(dir).ok()?;
    Some(entries.flatten().map(|e| e.path()).collect())
}

/// Links in [`CONTAINER_LOG_LINKS`] pointing under `dir`.
fn log_links_into(dir: &Path) -> Vec<PathBuf> {
    list_dir(Path::new(CONTAINER_LOG_LINKS))
        .unwrap_or_default()
        .into_iter()
        .filter(|l| std::fs::read_link(l).is_ok_and(|t| t.starts_with(dir)))
        .collect()
}

/// Processes whose command line names `dir`, or that sit in one of the cgroups
/// `cgroup_names` (the nodes' containers): (pid, what).
fn processes_of(dir: &Path, cgroup_names: &[String]) -> Vec<(u32, String)> {
    let dir_s = dir.to_string_lossy().into_owned();
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in list_dir(Path::new("/proc")).unwrap_or_default() {
        let Some(pid) = entry
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if pid == me {
            continue;
        }
        let cmdline = std::fs::read(entry.join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        let cgroups = std::fs::read_to_string(entry.join("cgroup")).unwrap_or_default();
        let in_cgroup = cgroup_names.iter().any(|name| {
            cgroups.contains(&format!(":/{name}/")) || cgroups.contains(&format!(":/{name}\n"))
        });
        if cmdline.contains(&dir_s) || in_cgroup {
            found.push((pid, cmdline.trim().to_owned()));
        }
    }
    found
}

/// Processes whose mount namespace is one of `inodes` (nsfs inodes): (pid, what).
fn processes_in_mount_namespaces(inodes: &[u64]) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in list_dir(Path::new("/proc")).unwrap_or_default() {
        let Some(pid) = entry
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(ns) = std::fs::metadata(entry.join("ns/mnt")) else {
            continue;
        };
        if inodes.contains(&ns.ino()) {
            let cmdline = std::fs::read(entry.join("cmdline"))
                .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                .unwrap_or_default();
            found.push((pid, cmdline.trim().to_owned()));
        }
    }
    found
}

/// Mount points at or under `dir`, in mount order.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mount_points_under(&table, dir)
}

/// The mount points of a mountinfo `table` at or under `dir`, in mount order.
fn mount_points_under(table: &str, dir: &Path) -> Vec<PathBuf> {
    table
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| PathBuf::from(p.replace("\\040", " ")))
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// Unmounts everything at or under `dir`, innermost (latest) first.
fn unmount_all(dir: &Path) {
    for _round in 0..3 {
        let mounts = mounts_under(dir);
        if mounts.is_empty() {
            return;
        }
        for m in mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(m).output();
        }
    }
}

/// Kills every process in the mount namespace `inode`, a few rounds.
fn kill_processes_in_mount_namespace(inode: u64) {
    for _round in 0..5 {
        let found = processes_in_mount_namespaces(&[inode]);
        if found.is_empty() {
            return;
        }
        for (pid, _) in found {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Kills every process [`processes_of`] finds, a few rounds (a dying shim may still
/// start a process).
fn kill_processes_of(dir: &Path, cgroup_names: &[String]) {
    for _round in 0..5 {
        let found = processes_of(dir, cgroup_names);
        if found.is_empty() {
            return;
        }
        for (pid, _) in found {
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).output();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Runs `what` until it returns `Ok`, panicking with its last error after `timeout`.
/// `check` runs between tries (a daemon that died fails the wait at once).
fn wait_for<T>(
    what: &str,
    timeout: Duration,
    check: impl Fn(),
    mut attempt: impl FnMut() -> Result<T, String>,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        match attempt() {
            Ok(v) => return v,
            Err(e) if Instant::now() >= deadline => {
                panic!("{what}: not within {timeout:?}; last: {e}")
            }
            Err(_) => {}
        }
        check();
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// A free TCP port on 127.0.0.1 (bound, noted, released).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("find a free port")
        .port()
}

/// A plain HTTP/1.0 GET's body, or why not.
fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    Ok(text)
}

/// `ip ARGS`, panicking with its stderr.
fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("run ip {args:?}: {e} (install iproute2)"));
    assert!(
        out.status.success(),
        "ip {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// A running cluster; see the module doc. Dropping it tears everything down.
#[derive(Debug)]
pub struct KubeCluster {
    /// The temp dir everything lives in (bind-mounted on itself, rshared).
    pub dir: PathBuf,
    pub addrs: Addresses,
    /// A `system:masters` kubeconfig, for `kubectl`, `helm` and the test.
    pub kubeconfig: PathBuf,
    /// `https://198.19.(100+S).254:6443`.
    pub server: String,
    /// Time from [`KubeCluster::start`] to the first node Ready.
    pub bring_up: Duration,
    pki: Pki,
    /// etcd, apiserver, controller-manager, scheduler, CoreDNS, in start order.
    control: Vec<Daemon>,
    nodes: Vec<Node>,
    /// The pause image as an OCI archive, imported into every node.
    pause_archive: PathBuf,
    /// Registries (`host:port`) every node's containerd reaches over plain HTTP: the
    /// options' and those added since; a node added later gets them all.
    plain_http_registries: Vec<String>,
    /// The kubelets' image garbage collection (the options').
    image_gc: Option<ImageGc>,
    /// Listeners on the control-plane address passing connections on to a registry of
    /// the test's (see [`KubeCluster::expose_registry`]).
    forwarders: Vec<Forwarder>,
    footprint: Footprint,
    /// Removed last, after everything under it is unmounted.
    temp: Option<tempfile::TempDir>,
    _one_at_a_time: OneOnTheMachine,
}

impl KubeCluster {
    /// Starts the control plane and one node (`node-1`), and returns once the node is
    /// Ready and the `default` ServiceAccount exists (pods can be created).
    pub fn start(options: &KubeOptions) -> KubeCluster {
        let began = Instant::now();
        let mut cluster = KubeCluster::start_control_plane(options);
        cluster.add_node();
        cluster.bring_up = began.elapsed();
        cluster
    }

    /// The control plane without nodes.
    pub fn start_control_plane(options: &KubeOptions) -> KubeCluster {
        assert!(
            rustix::process::geteuid().is_root(),
            "a Kubernetes node needs root (cgroups, mounts, network interfaces)"
        );
        for tool in [
            "etcd",
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler",
            "kubelet",
            "kubectl",
            "coredns",
            "pause",
        ] {
            kube_bin(tool);
        }
        for tool in ["containerd", "ctr", "containerd-shim-runc-v2", "runc"] {
            containerd_bin(tool);
        }
        for plugin in ["bridge", "host-local", "loopback"] {
            assert!(
                Path::new(CNI_BIN).join(plugin).is_file(),
                "{CNI_BIN}/{plugin} is missing: apt-get install containernetworking-plugins"
            );
        }
        for tool in ["openssl", "ip", "tar", "gzip"] {
            require_tool(tool);
        }
        let guard = OneOnTheMachine::take();
        let began = Instant::now();
        let temp = tempfile::Builder::new()
            .prefix("tsk")
            .tempdir()
            .expect("temp dir");
        let dir = temp.path().to_path_buf();
        let footprint = Footprint::record(&dir);
        let slot = take_slot();
        let addrs = Addresses { slot };
        let mut cluster = KubeCluster {
            dir: dir.clone(),
            addrs,
            kubeconfig: dir.join("admin.kubeconfig"),
            server: format!("https://{}:6443", addrs.control_plane()),
            bring_up: Duration::ZERO,
            plain_http_registries: options.plain_http_registries.clone(),
            image_gc: options.image_gc,
            forwarders: Vec::new(),
            pki: Pki {
                dir: dir.join("pki"),
            },
            control: Vec::new(),
            nodes: Vec::new(),
            pause_archive: dir.join("pause.tar"),
            footprint,
            temp: Some(temp),
            _one_at_a_time: guard,
        };
        cluster.footprint.interfaces.push(iface(slot));
        // From here on a panic drops `cluster`, which undoes what was done.
        ip(&[
            "addr",
            "add",
            &format!("{}/32", addrs.control_plane()),
            "dev",
            &iface(slot),
        ]);
        ip(&["link", "set", &iface(slot), "up"]);
        // Shared, so that the nodes' mount namespaces (its slaves) see what the test
        // mounts under it later.
        run(Command::new("mount").args(["--bind", s(&dir), s(&dir)]));
        run(Command::new("mount").args(["--make-rshared", s(&dir)]));
        // Empty here; each node's mount namespace binds the node's own directory on it.
        std::fs::create_dir(cluster.host_root()).expect("create host root");
        // The nodes' mount namespaces are kept as files here: a mount namespace can
        // only be bind-mounted onto a mount that does not propagate.
        let ns = dir.join("ns");
        std::fs::create_dir(&ns).expect("create ns dir");
        run(Command::new("mount").args(["--bind", s(&ns), s(&ns)]));
        run(Command::new("mount").args(["--make-private", s(&ns)]));
        cluster.pki = Pki::make(&dir, addrs);
        cluster
            .pki
            .kubeconfig(&cluster.kubeconfig, &cluster.server, "admin");
        cluster.start_etcd_and_apiserver();
        cluster.start_controllers();
        cluster.make_pause_archive();
        eprintln!(
            "kube: control plane of slot {slot} up in {:.1?} ({})",
            began.elapsed(),
            cluster.server
        );
        cluster
    }

    /// Panics if a daemon has died (a wait would otherwise run into its timeout).
    fn check_daemons(&self) {
        for d in &self.control {
            d.check_alive();
        }
        for n in &self.nodes {
            n.check_daemons();
        }
    }

    fn start_etcd_and_apiserver(&mut self) {
        let (client, peer) = (free_port(), free_port());
        let client_url = format!("http://127.0.0.1:{client}");
        let peer_url = format!("http://127.0.0.1:{peer}");
        let mut etcd = Command::new(kube_bin("etcd"));
        etcd.args(["--name", "tessera"])
            .arg(format!("--data-dir={}", s(&self.dir.join("etcd"))))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=tessera={peer_url}"))
            // Throwaway data: no fsync, a test cluster is not worth the disk waits.
            .args(["--unsafe-no-fsync", "--log-level=warn"]);
        self.control
            .push(Daemon::spawn("etcd", etcd, &self.dir.join("etcd.log")));
        let etcd_addr = format!("127.0.0.1:{client}");
        wait_for(
            "etcd /health",
            DAEMON_START,
            || self.check_daemons(),
            || {
                let body = http_get(&etcd_addr, "/health")?;
                if body.contains("\"health\":\"true\"") {
                    Ok(())
                } else {
                    Err(body)
                }
            },
        );

        let p = |name: &str| s(&self.pki.path(name)).to_owned();
        let cp = self.addrs.control_plane().to_string();
        let mut apiserver = Command::new(kube_bin("kube-apiserver"));
        apiserver
            .arg(format!("--etcd-servers={client_url}"))
            .arg(format!("--advertise-address={cp}"))
            .arg(format!("--bind-address={cp}"))
            .arg("--secure-port=6443")
            .arg(format!("--cert-dir={}", s(&self.dir.join("apiserver"))))
            .arg(format!("--tls-cert-file={}", p("apiserver.pem")))
            .arg(format!("--tls-private-key-file={}", p("apiserver.key")))
            .arg(format!("--client-ca-file={}", p("ca.pem")))
            .arg(format!(
                "--service-cluster-ip-range={}",
                self.addrs.service_cidr()
            ))
            .arg("--service-account-issuer=https://kubernetes.default.svc.cluster.local")
            .arg(format!("--service-account-key-file={}", p("sa.pub")))
            .arg(format!(
                "--service-account-signing-key-file={}",
                p("sa.key")
            ))
            .arg("--authorization-mode=Node,RBAC")
            .arg("--enable-admission-plugins=NodeRestriction")
            // The Tessera chart's agent is privileged (FUSE, mounts).
            .arg("--allow-privileged=true")
            .arg(format!(
                "--kubelet-client-certificate={}",
                p("apiserver-kubelet-client.pem")
            ))
            .arg(format!(
                "--kubelet-client-key={}",
                p("apiserver-kubelet-client.key")
            ))
            // The node's address of its own, never a name this machine cannot resolve.
            .arg("--kubelet-preferred-address-types=InternalIP")
            .arg("--profiling=false");
        self.control.push(Daemon::spawn(
            "kube-apiserver",
            apiserver,
            &self.dir.join("apiserver.log"),
        ));
        // Authenticated: the controller-manager needs RBAC's bootstrap roles, which
        // /readyz includes (poststarthook/rbac/bootstrap-roles).
        wait_for(
            "kube-apiserver /readyz",
            DAEMON_START,
            || self.check_daemons(),
            || {
                let out = self.kubectl(&["get", "--raw", "/readyz"]);
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                }
            },
        );
    }

    fn start_controllers(&mut self) {
        let p = |name: &str| s(&self.pki.path(name)).to_owned();
        let cp = self.addrs.control_plane().to_string();
        for (name, port, extra) in [
            (
                "kube-controller-manager",
                10257,
                vec![
                    format!("--service-account-private-key-file={}", p("sa.key")),
                    format!("--root-ca-file={}", p("ca.pem")),
                    format!("--cluster-signing-cert-file={}", p("ca.pem")),
                    format!("--cluster-signing-key-file={}", p("ca.key")),
                    "--use-service-account-credentials=true".to_owned(),
                ],
            ),
            ("kube-scheduler", 10259, Vec::new()),
        ] {
            let short = name.trim_start_matches("kube-");
            let kubeconfig = self.dir.join(format!("{short}.kubeconfig"));
            self.pki.kubeconfig(&kubeconfig, &self.server, short);
            let mut command = Command::new(kube_bin(name));
            command
                .arg(format!("--kubeconfig={}", s(&kubeconfig)))
                .arg(format!("--authentication-kubeconfig={}", s(&kubeconfig)))
                .arg(format!("--authorization-kubeconfig={}", s(&kubeconfig)))
                .arg(format!("--bind-address={cp}"))
                .arg(format!("--secure-port={port}"))
                .arg(format!("--cert-dir={}", s(&self.dir.join(short))))
                .arg("--leader-elect=false")
                .args(extra);
            self.control.push(Daemon::spawn(
                name,
                command,
                &self.dir.join(format!("{short}.log")),
            ));
        }
        self.start_coredns();
    }

    /// CoreDNS on the control-plane address, port 53, answering for `cluster.local`
    /// from the API (no upstream: nothing outside is reachable).
    fn start_coredns(&mut self) {
        let corefile = self.dir.join("Corefile");
        std::fs::write(
            &corefile,
            format!(
                ".:53 {{\n    bind {cp}\n    errors\n    kubernetes cluster.local in-addr.arpa ip6.arpa {{\n        kubeconfig {kc}\n        pods insecure\n        fallthrough in-addr.arpa ip6.arpa\n    }}\n    cache 30\n}}\n",
                cp = self.addrs.control_plane(),
                // The admin's: CoreDNS only lists and watches, and a role of its own
                // would be one more thing to create before it starts.
                kc = s(&self.kubeconfig),
            ),
        )
        .expect("write Corefile");
        let mut coredns = Command::new(kube_bin("coredns"));
        coredns.arg("-conf").arg(&corefile).current_dir(&self.dir);
        self.control.push(Daemon::spawn(
            "coredns",
            coredns,
            &self.dir.join("coredns.log"),
        ));
    }

    /// The pause image (our static `pause` as `/pause`) as an OCI archive for `ctr
    /// images import`.
    fn make_pause_archive(&self) {
        let layout = self.dir.join("images/pause");
        let pause = std::fs::read(kube_bin("pause")).expect("read pause");
        oci::build_files_image_with(
            &layout,
            "amd64",
            &[vec![("pause", pause)]],
            &["pause"],
            serde_json::json!({"Entrypoint": ["/pause"]}),
        );
        run(Command::new("tar")
            .arg("-C")
            .arg(&layout)
            .arg("-cf")
            .arg(&self.pause_archive)
            .arg("."));
    }

    /// Adds a node (`node-N`, N = nodes so far + 1) and returns once it is Ready.
    ///
    /// Node 1 runs in the test's network namespace (its address beside the control
    /// plane's), so it reaches registries on 127.0.0.1. Later nodes each get a network
    /// namespace of their own (see [`node_netns`]): their containerd, kubelet, CNI
    /// bridge and host-network pods see only their own ports, as on separate machines,
    /// and 127.0.0.1 there is their own: give them images with
    /// [`KubeCluster::import_image`].
    pub fn add_node(&mut self) -> &Node {
        let n = u8::try_from(self.nodes.len() + 1).expect("fewer than 255 nodes");
        assert!(
            n <= 4,
            "a cluster has room for 4 nodes' pod ranges (/26 each)"
        );
        let node = Node::start(self, n);
        self.nodes.push(node);
        let name = format!("node-{n}");
        wait_for(
            &format!("{name} Ready"),
            BRING_UP,
            || self.check_daemons(),
            || {
                let out = self.kubectl(&[
                    "get",
                    "node",
                    &name,
                    "-o",
                    "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
                ]);
                let status = String::from_utf8_lossy(&out.stdout).into_owned();
                if status == "True" {
                    Ok(())
                } else {
                    Err(format!(
                        "Ready={status:?} {}",
                        String::from_utf8_lossy(&out.stderr)
                    ))
                }
            },
        );
        // Pods are refused until the controller-manager has made `default`'s account.
        wait_for(
            "ServiceAccount default/default",
            BRING_UP,
            || self.check_daemons(),
            || {
                let out = self.kubectl(&["get", "serviceaccount", "default"]);
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                }
            },
        );
        self.nodes.last().expect("the node just added")
    }

    /// Imports an OCI archive (a tar of an OCI layout whose image is tagged `TAG`) as
    /// `BASE:TAG` into every node's CRI namespace, for pods with `imagePullPolicy:
    /// Never` on nodes that cannot reach the test's registry.
    pub fn import_image(&self, archive: &Path, base: &str) {
        for node in &self.nodes {
            node.import(archive, base);
        }
    }

    /// The nodes, in the order they were added.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `index` (0-based: `node-1` is 0), to restart its containerd or kubelet.
    pub fn node_mut(&mut self, index: usize) -> &mut Node {
        &mut self.nodes[index]
    }

    /// Where every node sees its own "host filesystem": the same path on each node,
    /// a different directory behind it ([`Node::host_path`]), as on separate machines.
    /// A chart's hostPaths go under here. In the test's mount namespace it is an empty
    /// directory.
    pub fn host_root(&self) -> PathBuf {
        self.dir.join("host")
    }

    /// Makes every node's containerd (and every node added later) pull from `host`
    /// (`host:port`) over plain HTTP: a `hosts.toml` in each node's
    /// [`CONTAINERD_CERTS_D`], which containerd reads at every pull. The registry must
    /// be reachable from every node: on the control-plane address (see
    /// [`KubeCluster::expose_registry`]).
    pub fn trust_plain_http_registry(&mut self, host: &str) {
        for node in &self.nodes {
            write_hosts_toml(&node.host_path(CONTAINERD_CERTS_D), host);
        }
        if !self.plain_http_registries.iter().any(|r| r == host) {
            self.plain_http_registries.push(host.to_owned());
        }
    }

    /// Makes the registry at `addr` (e.g. a [`super::registry::Registry`]'s
    /// `127.0.0.1:PORT`, which only node 1 reaches) reachable from every node: a
    /// listener on the control-plane address, which every node routes to, passes each
    /// connection on to `addr`; every node's containerd trusts it over plain HTTP.
    /// Returns its `host:port` (`198.19.(100+S).254:PORT`), the registry's name in the
    /// image references the nodes pull. It lives as long as the cluster.
    pub fn expose_registry(&mut self, addr: &str) -> String {
        let forwarder = Forwarder::start(self.addrs.control_plane(), addr);
        let host = forwarder.addr.to_string();
        self.forwarders.push(forwarder);
        self.trust_plain_http_registry(&host);
        host
    }

    /// `kubectl --kubeconfig ADMIN ARGS`, whatever its outcome.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command()
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// `kubectl` with the admin kubeconfig, for a test to add arguments and stdin to.
    pub fn kubectl_command(&self) -> Command {
        let mut c = Command::new(kube_bin("kubectl"));
        c.arg(format!("--kubeconfig={}", s(&self.kubeconfig)))
            .stdin(Stdio::null());
        for var in PROXY_VARS {
            c.env_remove(var);
        }
        c
    }

    /// Like [`KubeCluster::kubectl`], panicking with its output and the logs if it
    /// fails; returns its stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}\n--- stdout ---\n{}\n--- stderr ---\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.logs_tail(30)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `manifest`, panicking if it fails.
    pub fn kubectl_apply(&self, manifest: &str) -> String {
        let mut child = self
            .kubectl_command()
            .args(["apply", "-f", "-"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl apply");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(manifest.as_bytes())
            .expect("write manifest");
        let out = child.wait_with_output().expect("wait for kubectl apply");
        assert!(
            out.status.success(),
            "kubectl apply failed: {}\n{manifest}\n{}",
            String::from_utf8_lossy(&out.stderr),
            self.logs_tail(30)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The end of every daemon's log, for failure messages.
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        let daemons = self.control.iter().chain(
            self.nodes
                .iter()
                .flat_map(|n| n.containerd.iter().chain(n.kubelet.iter())),
        );
        for d in daemons {
            text.push_str(&format!(
                "--- {} ({}) ---\n{}\n",
                d.name,
                d.log.display(),
                tail(&d.log, lines)
            ));
        }
        text
    }

    /// What the cluster has changed on the machine, to check after it is dropped.
    pub fn footprint(&self) -> Footprint {
        self.footprint.clone()
    }
}

impl Drop for KubeCluster {
    fn drop(&mut self) {
        // Nodes first (their pods, shims and mounts), then the control plane.
        while let Some(node) = self.nodes.pop() {
            drop(node);
        }
        while let Some(daemon) = self.control.pop() {
            drop(daemon);
        }
        self.forwarders.clear();
        kill_processes_of(&self.dir, &self.footprint.cgroup_names());
        // A node whose start panicked before it was one has no drop of its own: its
        // namespace goes once its processes do and its file is unmounted (below).
        for (_, inode) in &self.footprint.mount_namespaces {
            kill_processes_in_mount_namespace(*inode);
        }
        unmount_all(&self.dir);
        for c in self.footprint.cgroups.iter().rev() {
            remove_cgroup(c);
        }
        for i in &self.footprint.interfaces {
            let _ = Command::new("ip").args(["link", "del", i]).output();
        }
        self.footprint.restore_files();
        if let Some(temp) = self.temp.take() {
            if let Err(e) = temp.close() {
                eprintln!("kube: could not remove {}: {e}", self.dir.display());
            }
        }
    }
}

/// A TCP listener on an address every node reaches, passing each connection on to a
/// target only the test's network namespace reaches (a registry on 127.0.0.1). Threads
/// of the test process: nothing of it outlives the process.
#[derive(Debug)]
struct Forwarder {
    /// Where it listens: `CONTROL_PLANE:PORT`.
    addr: SocketAddr,
    /// Tells the accepting thread to stop; it is woken by a connection of our own.
    stop: Arc<AtomicBool>,
    accepting: Option<JoinHandle<()>>,
}

impl Forwarder {
    fn start(ip: Ipv4Addr, target: &str) -> Forwarder {
        let listener = TcpListener::bind((ip, 0))
            .unwrap_or_else(|e| panic!("listen on {ip} to pass connections on to {target}: {e}"));
        let addr = listener.local_addr().expect("listener address");
        let stop = Arc::new(AtomicBool::new(false));
        let target = target.to_owned();
        let stopping = stop.clone();
        let accepting = std::thread::spawn(move || {
            for client in listener.incoming() {
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(client) = client else { continue };
                // Refused: the client sees its connection closed, as from the registry.
                let Ok(server) = TcpStream::connect(&target) else {
                    continue;
                };
                pipe(&client, &server);
                pipe(&server, &client);
            }
        });
        Forwarder {
            addr,
            stop,
            accepting: Some(accepting),
        }
    }
}

/// Copies `from` to `to` on a thread of its own until `from` ends, then ends `to`'s
/// writing side (HTTP clients wait for the end of a body otherwise).
fn pipe(from: &TcpStream, to: &TcpStream) {
    let (Ok(mut from), Ok(mut to)) = (from.try_clone(), to.try_clone()) else {
        return;
    };
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut from, &mut to);
        let _ = to.shutdown(Shutdown::Write);
    });
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accepting.take() {
            let _ = t.join();
        }
    }
}

/// A `hosts.toml` under `certs_d` for `registry` (`host:port`), over plain HTTP.
fn write_hosts_toml(certs_d: &Path, registry: &str) {
    let d = certs_d.join(registry);
    std::fs::create_dir_all(&d).expect("create hosts dir");
    std::fs::write(
        d.join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .expect("write hosts.toml");
}

/// The cluster's interface in slot `slot`.
fn iface(slot: u8) -> String {
    format!("tsk{slot}")
}

/// Takes the first free slot: the one whose interface this call creates (an existing
/// interface means another cluster has it). A veth pair, both ends up, stands in for a
/// dummy interface: this kernel has no `dummy` driver, and an address on `lo` could
/// not tell the slots apart. Deleting one end deletes both.
fn take_slot() -> u8 {
    for slot in 0..10u8 {
        let made = Command::new("ip")
            .args(["link", "add", &iface(slot), "type", "veth", "peer", "name"])
            .arg(format!("{}p", iface(slot)))
            .output()
            .is_ok_and(|o| o.status.success());
        if made {
            ip(&["link", "set", &format!("{}p", iface(slot)), "up"]);
            return slot;
        }
    }
    panic!(
        "no free Kubernetes test slot: interfaces tsk0..tsk9 all exist (left by crashed \
         runs? `ip link del tskN` them)"
    )
}

/// Removes a cgroup v1 directory and its children, deepest first.
fn remove_cgroup(dir: &Path) {
    if let Some(children) = list_dir(dir) {
        for child in children.iter().filter(|c| c.is_dir()) {
            remove_cgroup(child);
        }
    }
    let _ = std::fs::remove_dir(dir);
}

/// One node: containerd 2 with CRI and a kubelet, each with its state under
/// `dir/nodes/node-N`, in a mount namespace of the node's own (and, after the first,
/// a network namespace of its own).
///
/// # The node's view
///
/// In the node's mount namespace, [`KubeCluster::host_root`] is a bind of the node's
/// own directory ([`Node::host_path`] shows it from the test), so a path under it means
/// "this node's" on every node, as `/var/lib/…` does on separate machines. The node's
/// containerd config, hosts directory and socket are there too
/// ([`Node::containerd_config_in_view`] and its siblings). Run a program as the node
/// sees things with [`Node::command`].
#[derive(Debug)]
pub struct Node {
    /// `node-N`, the Node object's name.
    pub name: String,
    pub ip: Ipv4Addr,
    /// Everything of the node: containerd's root and state, the kubelet's root, the
    /// directory behind its view of the host root (`host/`).
    pub dir: PathBuf,
    /// The CRI socket (containerd's), as the test reaches it (its path in the node's
    /// view is [`Node::containerd_socket_in_view`]).
    pub containerd_socket: PathBuf,
    /// The kubelet's `--root-dir` (pods' volumes); a shared mount in the node's
    /// namespace.
    pub kubelet_root: PathBuf,
    /// [`KubeCluster::host_root`], the same for every node.
    host_root: PathBuf,
    /// What the node sees at `host_root` (`dir/host`).
    host_dir: PathBuf,
    /// The cluster's temp dir: everything mounted under it in the node's mount
    /// namespace is unmounted on drop.
    cluster_dir: PathBuf,
    /// The node's mount namespace, kept as a file (`cluster dir/ns/node-N`).
    mount_ns: PathBuf,
    /// Its nsfs inode, by which its processes are found.
    mount_ns_inode: u64,
    /// The cluster's admin kubeconfig, to wait for the node to be Ready.
    admin_kubeconfig: PathBuf,
    /// The kubelet's `--image-service-endpoint`; `None`: containerd's socket.
    image_service_endpoint: Option<PathBuf>,
    containerd: Option<Daemon>,
    kubelet: Option<Daemon>,
    /// The node's cgroup root in every v1 hierarchy.
    cgroups: Vec<PathBuf>,
    /// The CNI bridge (in the node's network namespace).
    bridge: String,
    /// The node's network namespace (`/run/netns/NAME`); `None`: the test's own.
    netns: Option<String>,
}

impl Node {
    fn start(cluster: &mut KubeCluster, n: u8) -> Node {
        let addrs = cluster.addrs;
        let name = format!("node-{n}");
        let dir = cluster.dir.join("nodes").join(&name);
        let host_dir = dir.join("host");
        let kubelet_root = dir.join("kubelet");
        for d in [&kubelet_root, &host_dir] {
            std::fs::create_dir_all(d).expect("create node dirs");
        }
        for sub in [CONTAINERD_CERTS_D, "run/containerd"] {
            std::fs::create_dir_all(host_dir.join(sub)).expect("create node host dirs");
        }
        let ip_addr = addrs.node(n);
        let netns = if n == 1 {
            ip(&[
                "addr",
                "add",
                &format!("{ip_addr}/32"),
                "dev",
                &iface(addrs.slot),
            ]);
            None
        } else {
            Some(node_netns(cluster, n))
        };
        let (mount_ns, mount_ns_inode) = node_mount_ns(cluster, &name, &host_dir, &kubelet_root);
        let bridge = format!("tskbr{}-{n}", addrs.slot);
        let network = format!("tessera-kube-{}-{n}", addrs.slot);
        cluster.footprint.interfaces.push(bridge.clone());
        cluster.footprint.networks.push(network.clone());
        let cgroup_name = format!("tsk{}-{n}", addrs.slot);
        let mut cgroups = make_cgroup_root(&cgroup_name);
        // runc makes the container's cgroup in the cgroup2 `unified` mount as well
        // (hybrid mode): not needed by the kubelet, but removed all the same.
        cgroups.push(Path::new("/sys/fs/cgroup/unified").join(&cgroup_name));
        cluster.footprint.cgroups.extend(cgroups.iter().cloned());
        let mut node = Node {
            name: name.clone(),
            ip: ip_addr,
            containerd_socket: host_dir.join(CONTAINERD_SOCKET),
            kubelet_root,
            host_root: cluster.host_root(),
            host_dir,
            cluster_dir: cluster.dir.clone(),
            mount_ns,
            mount_ns_inode,
            admin_kubeconfig: cluster.kubeconfig.clone(),
            image_service_endpoint: None,
            dir,
            containerd: None,
            kubelet: None,
            cgroups,
            bridge,
            netns,
        };
        node.write_cni(addrs, n, &network);
        node.write_containerd_config(&cluster.plain_http_registries);
        node.start_containerd();
        node.import_pause(&cluster.pause_archive);
        node.write_kubelet_config(cluster, &cgroup_name);
        node.start_kubelet();
        node
    }

    /// `program` run as the node runs things: in its mount namespace (and its network
    /// namespace, nodes after the first), so that it sees the node's view of
    /// [`KubeCluster::host_root`], the mounts the node's pods made there (FUSE mounts,
    /// tmpfs) and the node's ports. nsenter execs `program`: the child's pid is the
    /// program's. Its working directory is the namespace's `/`.
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--mount={}", s(&self.mount_ns)));
        if let Some(ns) = &self.netns {
            c.arg(format!("--net=/run/netns/{ns}"));
        }
        c.arg("--").arg(program);
        c
    }

    /// [`KubeCluster::host_root`]: where this node sees its own host filesystem.
    pub fn host_root(&self) -> &Path {
        &self.host_root
    }

    /// Where the node's `<host_root>/p` lives as seen from the test, for reading and
    /// writing files without [`Node::command`]. `p` is relative to the host root, or
    /// an absolute path under it. Mounts the node made there are not seen from here.
    pub fn host_path(&self, p: impl AsRef<Path>) -> PathBuf {
        let p = p.as_ref();
        let relative = if p.is_absolute() {
            p.strip_prefix(&self.host_root).unwrap_or_else(|_| {
                panic!(
                    "{} is not under the host root {}",
                    p.display(),
                    self.host_root.display()
                )
            })
        } else {
            p
        };
        self.host_dir.join(relative)
    }

    /// containerd's config file as the node sees it (`<host_root>/`[`CONTAINERD_CONFIG`]);
    /// containerd reads it at every start ([`Node::restart_containerd`]).
    pub fn containerd_config_in_view(&self) -> PathBuf {
        self.host_root.join(CONTAINERD_CONFIG)
    }

    /// containerd's hosts directory (`config_path`) as the node sees it
    /// (`<host_root>/`[`CONTAINERD_CERTS_D`]).
    pub fn certs_dir_in_view(&self) -> PathBuf {
        self.host_root.join(CONTAINERD_CERTS_D)
    }

    /// containerd's socket as the node sees it (`<host_root>/`[`CONTAINERD_SOCKET`]):
    /// the kubelet's runtime endpoint.
    pub fn containerd_socket_in_view(&self) -> PathBuf {
        self.host_root.join(CONTAINERD_SOCKET)
    }

    /// Panics if the node's containerd or kubelet has died.
    fn check_daemons(&self) {
        for d in self.containerd.iter().chain(self.kubelet.iter()) {
            d.check_alive();
        }
    }

    /// The bridge network: host-local leases kept in the node's dir, a route to the
    /// hosts' /24 only.
    fn write_cni(&self, addrs: Addresses, n: u8, network: &str) {
        let conf_dir = self.dir.join("cni/conf");
        std::fs::create_dir_all(&conf_dir).expect("create CNI conf dir");
        let conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": network,
            "plugins": [{
                "type": "bridge",
                "bridge": self.bridge,
                "isGateway": true,
                // No NAT and no portmap: no iptables rule, and no traffic leaves.
                "ipMasq": false,
                "ipam": {
                    "type": "host-local",
                    "dataDir": s(&self.dir.join("cni/leases")),
                    "ranges": [[{
                        "subnet": addrs.pod_cidr(n),
                        "gateway": addrs.pod_gateway(n).to_string(),
                    }]],
                    "routes": [{"dst": addrs.host_cidr()}, {"dst": addrs.all_pods_cidr()}],
                },
            }],
        });
        std::fs::write(conf_dir.join("10-tessera.conflist"), conf.to_string())
            .expect("write CNI config");
    }

    /// containerd's config and a `hosts.toml` per plain-HTTP registry, at the fixed
    /// paths of the node's view.
    fn write_containerd_config(&self, registries: &[String]) {
        for registry in registries {
            write_hosts_toml(&self.host_path(CONTAINERD_CERTS_D), registry);
        }
        let config = self.host_path(CONTAINERD_CONFIG);
        std::fs::write(&config, self.containerd_toml()).expect("write containerd config");
    }

    /// Starts containerd with the config file in the node's view, and waits until it
    /// answers.
    fn start_containerd(&mut self) {
        let mut command = self.command(containerd_bin("containerd"));
        // Its own shim and the shim its own runc.
        let mut paths = vec![containerd_bin_dir()];
        paths.extend(std::env::split_paths(
            &std::env::var_os("PATH").unwrap_or_default(),
        ));
        command
            .arg("--config")
            .arg(self.containerd_config_in_view())
            .env(
                "PATH",
                std::env::join_paths(paths).expect("PATH without ':'"),
            );
        let log = self.dir.join("containerd.log");
        self.containerd = Some(Daemon::spawn(
            &format!("{} containerd", self.name),
            command,
            &log,
        ));
        wait_for(
            &format!("{} containerd", self.name),
            DAEMON_START,
            || self.check_daemons(),
            || {
                let out = self.ctr(&["version"]);
                if out.status.success() {
                    Ok(())
                } else {
                    Err(String::from_utf8_lossy(&out.stderr).into_owned())
                }
            },
        );
    }

    /// Stops containerd (SIGTERM, as `systemctl restart containerd` does), starts it
    /// again with the same config file (re-read: the chart's init container edits it),
    /// and waits until it answers. Running containers live on: their shims are not
    /// containerd's children, and the new containerd reconnects to them.
    ///
    /// The kubelet is paused (SIGSTOP) from before containerd stops until its CRI
    /// answers again for the node's sandboxes: a kubelet that asks a containerd still
    /// recovering them may find a sandbox not ready and re-create it, and with the
    /// Tessera snapshotter as containerd's default the agent's re-created pod then
    /// needs the agent's own snapshotter to start (docs/compatibility.md). On a real
    /// node that race exists; the tests pin the order to test one thing at a time.
    pub fn restart_containerd(&mut self) {
        let kubelet = self.kubelet.as_ref().map(|k| k.child.id().to_string());
        let signal = |sig: &str| {
            if let Some(pid) = &kubelet {
                let _ = Command::new("kill").args([sig, pid]).status();
            }
        };
        signal("-STOP");
        if let Some(mut d) = self.containerd.take() {
            d.stop(Duration::from_secs(30));
        }
        self.start_containerd();
        // The CRI plugin lists the recovered sandboxes once it has loaded them.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.ctr(&["containers", "ls", "-q"]).status.success() {
            if Instant::now() > deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        std::thread::sleep(Duration::from_secs(1));
        signal("-CONT");
    }

    /// containerd 2 (config version 3) as a node runs it: its root and state under the
    /// node's dir, its socket and hosts directory in the node's view; plugins that
    /// would probe or write to the host are off.
    fn containerd_toml(&self) -> String {
        let d = |sub: &str| s(&self.dir.join(sub)).to_owned();
        format!(
            r#"version = 3
root = "{root}"
state = "{state}"
temp = "{temp}"
required_plugins = ["io.containerd.grpc.v1.cri"]
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.blockfile",
  "io.containerd.snapshotter.v1.erofs",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  level = "info"

[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{hosts}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  # Root here cannot lower oom_score_adj (no CAP_SYS_RESOURCE).
  restrict_oom_score_adj = true
  # Not /var/run/netns: every mount of the node stays under its dir.
  netns_mounts_under_state_dir = true
  enable_cdi = false
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        # runc's state, by default in /run/containerd/runc.
        Root = "{runc_root}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
"#,
            root = d("containerd/root"),
            state = d("containerd/state"),
            temp = d("containerd/tmp"),
            socket = s(&self.containerd_socket_in_view()),
            pause = PAUSE_IMAGE,
            hosts = s(&self.certs_dir_in_view()),
            runc = s(&containerd_bin("runc")),
            runc_root = d("runc"),
            cni_bin = CNI_BIN,
            cni_conf = d("cni/conf"),
        )
    }

    /// `ctr --address SOCKET --namespace k8s.io ARGS` (the CRI plugin's namespace).
    pub fn ctr(&self, args: &[&str]) -> Output {
        let mut c = Command::new(containerd_bin("ctr"));
        c.arg("--address")
            .arg(&self.containerd_socket)
            .args(["--namespace", "k8s.io", "--timeout", "60s"])
            .args(args)
            .stdin(Stdio::null());
        for var in PROXY_VARS {
            c.env_remove(var);
        }
        c.output().expect("run ctr")
    }

    fn import_pause(&self, archive: &Path) {
        // The archive's only image is tagged `v1`; --base-name makes it PAUSE_IMAGE.
        let base = PAUSE_IMAGE.rsplit_once(':').expect("a tag").0;
        self.import(archive, base);
        let images =
            String::from_utf8_lossy(&self.ctr(&["images", "ls", "-q"]).stdout).into_owned();
        assert!(
            images.lines().any(|l| l == PAUSE_IMAGE),
            "after import the node's images are {images:?}, without {PAUSE_IMAGE}"
        );
    }

    /// `ctr images import --base-name BASE ARCHIVE` into the CRI namespace.
    pub fn import(&self, archive: &Path, base: &str) {
        let out = self.ctr(&["images", "import", "--base-name", base, s(archive)]);
        assert!(
            out.status.success(),
            "ctr images import of {} into {} failed: {}\n{}",
            archive.display(),
            self.name,
            String::from_utf8_lossy(&out.stderr),
            self.containerd
                .as_ref()
                .map(|d| tail(&d.log, 30))
                .unwrap_or_default()
        );
    }

    /// The kubelet's certificate, kubeconfig and config file.
    fn write_kubelet_config(&self, cluster: &KubeCluster, cgroup_name: &str) {
        let pki = &cluster.pki;
        let subject = format!("/O=system:nodes/CN=system:node:{}", self.name);
        pki.client(&self.name, &subject);
        pki.kubeconfig(
            &self.dir.join("kubelet.kubeconfig"),
            &cluster.server,
            &self.name,
        );
        let d = |sub: &str| s(&self.dir.join(sub)).to_owned();
        std::fs::write(
            self.dir.join("kubelet.yaml"),
            format!(
                r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: {ip}
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: {ca}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://{socket}
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_name}
cgroupsPerQOS: true
failCgroupV1: false
failSwapOn: false
makeIPTablesUtilChains: false
podLogsDir: {logs}
clusterDNS: [{dns}]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
# A test machine's disk may be fuller than a node's defaults allow.
evictionHard:
  memory.available: 50Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
{image_gc}serializeImagePulls: false
"#,
                ip = self.ip,
                ca = s(&pki.ca()),
                socket = s(&self.containerd_socket_in_view()),
                logs = d("pod-logs"),
                dns = cluster.addrs.control_plane(),
                image_gc = cluster.image_gc.map_or_else(
                    || "imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n".into(),
                    |gc| gc.yaml()
                ),
            ),
        )
        .expect("write kubelet config");
    }

    /// Starts the kubelet in the node's namespaces (its image service
    /// [`Node::image_service_endpoint`]'s).
    fn start_kubelet(&mut self) {
        let d = |sub: &str| s(&self.dir.join(sub)).to_owned();
        let mut kubelet = self.command(kube_bin("kubelet"));
        kubelet
            .arg(format!("--config={}", d("kubelet.yaml")))
            .arg(format!("--kubeconfig={}", d("kubelet.kubeconfig")))
            .arg(format!("--hostname-override={}", self.name))
            .arg(format!("--node-ip={}", self.ip))
            .arg(format!("--root-dir={}", s(&self.kubelet_root)))
            // Its default is /var/lib/kubelet/pki whatever --root-dir says.
            .arg(format!("--cert-dir={}", d("kubelet-pki")))
            .arg(format!("--volume-plugin-dir={}", d("volume-plugins")));
        if let Some(endpoint) = &self.image_service_endpoint {
            kubelet.arg(format!("--image-service-endpoint=unix://{}", s(endpoint)));
        }
        self.kubelet = Some(Daemon::spawn(
            &format!("{} kubelet", self.name),
            kubelet,
            &self.dir.join("kubelet.log"),
        ));
    }

    /// Restarts the kubelet (SIGTERM, then started again) with
    /// `--image-service-endpoint=unix://ENDPOINT` (a path as the node sees it, e.g. a
    /// CRI proxy's socket under [`KubeCluster::host_root`]), or with containerd as its
    /// image service again for `None`; returns once the new kubelet has reported the
    /// node Ready. Pods live on (containerd runs them).
    pub fn set_image_service_endpoint(&mut self, endpoint: Option<&Path>) {
        self.image_service_endpoint = endpoint.map(Path::to_path_buf);
        if let Some(mut d) = self.kubelet.take() {
            d.stop(Duration::from_secs(30));
        }
        let since = utc_now_rfc3339();
        self.start_kubelet();
        self.wait_ready_since(&since);
    }

    /// Waits until the kubelet's healthz answers and the Node's Ready condition is True
    /// with a heartbeat at or after `since` (RFC 3339, UTC, seconds): the condition
    /// of the kubelet started last, not one from before a restart.
    fn wait_ready_since(&self, since: &str) {
        let healthz = format!("{}:10248", self.ip);
        wait_for(
            &format!("{} kubelet healthz", self.name),
            DAEMON_START,
            || self.check_daemons(),
            || {
                let body = http_get(&healthz, "/healthz")?;
                if body.ends_with("ok") {
                    Ok(())
                } else {
                    Err(body)
                }
            },
        );
        wait_for(
            &format!("{} Ready after {since}", self.name),
            BRING_UP,
            || self.check_daemons(),
            || {
                let mut kubectl = Command::new(kube_bin("kubectl"));
                kubectl
                    .arg(format!("--kubeconfig={}", s(&self.admin_kubeconfig)))
                    .args(["get", "node", &self.name, "-o"])
                    .arg(
                        "jsonpath={.status.conditions[?(@.type==\"Ready\")].status} \
                         {.status.conditions[?(@.type==\"Ready\")].lastHeartbeatTime}",
                    )
                    .stdin(Stdio::null());
                for var in PROXY_VARS {
                    kubectl.env_remove(var);
                }
                let out = kubectl.output().expect("run kubectl");
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                match text.split_once(' ') {
                    // RFC 3339 in UTC with `Z` sorts as text.
                    Some(("True", beat)) if beat >= since => Ok(()),
                    _ => Err(format!("{text} {}", String::from_utf8_lossy(&out.stderr))),
                }
            },
        );
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        // The kubelet first, so it restarts nothing; then every container through
        // containerd while it runs (a killed shim would leave its container running).
        self.kubelet = None;
        if self.containerd.is_some() {
            let tasks = self.ctr(&["tasks", "ls", "-q"]);
            for id in String::from_utf8_lossy(&tasks.stdout).split_whitespace() {
                let _ = self.ctr(&["tasks", "kill", "-s", "SIGKILL", id]);
                let _ = self.ctr(&["tasks", "delete", "-f", id]);
            }
        }
        self.containerd = None;
        // Shims (their command line names the socket), anything in the node's cgroups,
        // and anything else in the node's mount namespace (a test's Node::command).
        let names: Vec<String> = self
            .cgroups
            .first()
            .and_then(|c| c.file_name())
            .map(|n| vec![n.to_string_lossy().into_owned()])
            .unwrap_or_default();
        kill_processes_of(&self.dir, &names);
        kill_processes_in_mount_namespace(self.mount_ns_inode);
        // In the node's mount namespace: network namespaces, overlays, volumes, what
        // pods mounted under the host root, the copies of other nodes' namespace
        // files. Then the namespace itself goes with its file's mount; with the pods'
        // network namespaces gone their veths go too, and then the bridge can.
        self.unmount_in_mount_ns();
        let _ = Command::new("umount").arg(&self.mount_ns).output();
        let _ = std::fs::remove_file(&self.mount_ns);
        match &self.netns {
            None => {
                let _ = Command::new("ip")
                    .args(["link", "del", &self.bridge])
                    .output();
            }
            // Its last process gone, the namespace goes with its bridge and veths.
            Some(ns) => {
                let _ = Command::new("ip").args(["netns", "del", ns]).output();
            }
        }
        for c in &self.cgroups {
            remove_cgroup(c);
        }
    }
}

impl Node {
    /// Unmounts everything under the cluster's dir in the node's mount namespace (its
    /// copy of the dir is a slave: nothing goes back to the test's), saying what stays.
    fn unmount_in_mount_ns(&self) {
        let inside = |program: &str| {
            let mut c = Command::new("nsenter");
            c.arg(format!("--mount={}", s(&self.mount_ns)))
                .arg("--")
                .arg(program);
            c
        };
        for _round in 0..3 {
            let Ok(out) = inside("cat").arg("/proc/self/mountinfo").output() else {
                return;
            };
            let table = String::from_utf8_lossy(&out.stdout).into_owned();
            let mounts = mount_points_under(&table, &self.cluster_dir);
            if mounts.is_empty() {
                return;
            }
            let _ = inside("umount")
                .args(["--recursive", "--lazy"])
                .arg(&self.cluster_dir)
                .output();
        }
        eprintln!(
            "kube: mounts left in {}'s mount namespace (it goes when unmounted)",
            self.name
        );
    }
}

/// Makes node `name`'s mount namespace, kept as the file `cluster dir/ns/NAME`, and
/// returns the file and the namespace's inode. Inside it, everything is a slave of the
/// test's mounts (`--propagation slave`: what the test mounts arrives, nothing the node
/// mounts goes back or to other nodes); [`KubeCluster::host_root`] is a bind of
/// `host_dir`, shared as a peer group of its own (the kubelet allows `Bidirectional`
/// hostPaths only on shared mounts); the kubelet's root is a shared bind on itself
/// (its pods' volumes).
fn node_mount_ns(
    cluster: &mut KubeCluster,
    name: &str,
    host_dir: &Path,
    kubelet_root: &Path,
) -> (PathBuf, u64) {
    require_tool("unshare");
    require_tool("nsenter");
    let file = cluster.dir.join("ns").join(name);
    std::fs::File::create(&file).expect("create mount namespace file");
    run(Command::new("unshare")
        .arg(format!("--mount={}", s(&file)))
        .args(["--propagation", "slave", "true"]));
    let inode = std::fs::metadata(&file)
        .expect("stat mount namespace file")
        .ino();
    cluster
        .footprint
        .mount_namespaces
        .push((name.to_owned(), inode));
    let host_root = cluster.host_root();
    let inside = |args: &[&str]| {
        run(Command::new("nsenter")
            .arg(format!("--mount={}", s(&file)))
            .args(["--", "mount"])
            .args(args));
    };
    inside(&["--make-rslave", s(&cluster.dir)]);
    inside(&["--bind", s(host_dir), s(&host_root)]);
    inside(&["--make-shared", s(&host_root)]);
    inside(&["--bind", s(kubelet_root), s(kubelet_root)]);
    inside(&["--make-rshared", s(kubelet_root)]);
    (file, inode)
}

/// Now in UTC as RFC 3339 to the second (`date -u`), as the apiserver writes times.
fn utc_now_rfc3339() -> String {
    let out = Command::new("date")
        .args(["-u", "+%Y-%m-%dT%H:%M:%SZ"])
        .output()
        .expect("run date");
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// Makes node `n`'s network namespace `tskS-nN`, joined to the test's by a veth pair
/// (`tskSvN` here, `eth0` there) and routed, not bridged: the node has its address as
/// a /32 and reaches the hosts' /24 through the control-plane address (answered by
/// proxy-less ARP: any local address answers on any interface); here, routes to the
/// node and to its pods go into the veth. Returns the namespace's name.
fn node_netns(cluster: &mut KubeCluster, n: u8) -> String {
    let addrs = cluster.addrs;
    let ns = format!("tsk{}-n{n}", addrs.slot);
    let here = format!("tsk{}v{n}", addrs.slot);
    ip(&["netns", "add", &ns]);
    cluster.footprint.netns.push(ns.clone());
    ip(&[
        "link", "add", &here, "type", "veth", "peer", "name", "eth0", "netns", &ns,
    ]);
    cluster.footprint.interfaces.push(here.clone());
    ip(&["link", "set", &here, "up"]);
    let node = format!("{}/32", addrs.node(n));
    let cp = addrs.control_plane().to_string();
    ip(&["-n", &ns, "link", "set", "lo", "up"]);
    ip(&["-n", &ns, "addr", "add", &node, "dev", "eth0"]);
    ip(&["-n", &ns, "link", "set", "eth0", "up"]);
    ip(&[
        "-n",
        &ns,
        "route",
        "add",
        &format!("{cp}/32"),
        "dev",
        "eth0",
    ]);
    for dst in [addrs.host_cidr(), addrs.all_pods_cidr()] {
        ip(&["-n", &ns, "route", "add", &dst, "via", &cp, "dev", "eth0"]);
    }
    // `src`: this end has no address, and the kernel would otherwise pick the
    // machine's own, to which the node has no route back.
    ip(&["route", "add", &node, "dev", &here, "src", &cp]);
    let pods = addrs.pod_cidr(n);
    let via = addrs.node(n).to_string();
    ip(&["route", "add", &pods, "via", &via, "dev", &here, "src", &cp]);
    ns
}

/// Makes `/NAME` in every cgroup v1 hierarchy (the kubelet checks its `cgroupRoot`
/// exists in each) and returns them. cpuset starts empty in a new v1 cgroup: it gets
/// its parent's CPUs and memory nodes, or no task could join it.
fn make_cgroup_root(name: &str) -> Vec<PathBuf> {
    let mut made = Vec::new();
    for hierarchy in list_dir(Path::new("/sys/fs/cgroup")).unwrap_or_default() {
        // cgroup2's `unified` is not a v1 hierarchy; the kubelet does not use it here.
        if hierarchy.file_name().is_some_and(|n| n == "unified") || !hierarchy.is_dir() {
            continue;
        }
        if hierarchy.is_symlink() {
            continue;
        }
        let dir = hierarchy.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => made.push(dir.clone()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => made.push(dir.clone()),
            Err(e) => panic!(
                "create cgroup {}: {e} (is cgroup v1 mounted rw?)",
                dir.display()
            ),
        }
        if hierarchy.file_name().is_some_and(|n| n == "cpuset") {
            for file in ["cpuset.cpus", "cpuset.mems"] {
                let parent = std::fs::read_to_string(hierarchy.join(file)).expect("read cpuset");
                std::fs::write(dir.join(file), parent.trim()).expect("write cpuset");
            }
        }
    }
    assert!(
        !made.is_empty(),
        "no cgroup v1 hierarchy under /sys/fs/cgroup: this harness runs the kubelet with \
         cgroup v1 (failCgroupV1: false)"
    );
    made
}
