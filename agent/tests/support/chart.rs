//! The Tessera Helm chart (deploy/helm/tessera) on a real cluster ([`super::kube`]):
//! the chart's two images built from this test build's binaries by
//! `scripts/images.sh` (no registry: imported into every node's containerd, as the
//! README's Kubernetes quick start does), and releases installed, upgraded and removed
//! with the real `helm` (`make chart-deps`).
//!
//! ```ignore
//! let mut cluster = KubeCluster::start(&KubeOptions::default());
//! let release = Release::install(&cluster, "tessera", &NodePaths::of(&cluster), &extra_values);
//! release.configure_node(&mut cluster, 0); // with containerd.configureSnapshotter
//! ```

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::kube::{kube_bin, KubeCluster};
use super::{repo_root, s};

/// The namespace releases go to.
pub const NAMESPACE: &str = "tessera-system";

/// How long a release's pods may take to be ready.
const READY: Duration = Duration::from_secs(120);

/// `helm` as `make chart-deps` builds it.
pub fn helm_bin() -> PathBuf {
    let helm = repo_root().join("target/tools/bin/helm");
    assert!(
        helm.is_file(),
        "{} is missing: run `make chart-deps` (helm, built from the Go module proxy)",
        helm.display()
    );
    helm
}

/// The chart's images as docker-archive tarballs, with the tag they carry.
#[derive(Debug)]
pub struct Images {
    pub agent: PathBuf,
    pub scheduler: PathBuf,
    pub tag: String,
}

/// Builds the images once per test process from the binaries of this build
/// (`tessera` and `tessera-scheduler` side by side in the target directory).
pub fn images() -> &'static Images {
    static IMAGES: OnceLock<Images> = OnceLock::new();
    IMAGES.get_or_init(|| {
        let bin_dir = super::scheduler::binary()
            .parent()
            .expect("the binaries' directory")
            .to_path_buf();
        assert!(
            bin_dir.join("tessera-scheduler").is_file(),
            "{} is missing: run `cargo build -p tessera-scheduler` (make unit builds it)",
            bin_dir.join("tessera-scheduler").display()
        );
        let out = bin_dir.join("chart-images");
        // This build's images carry a tag of their own, so a node never mistakes an
        // image of another build (or a real release) for them.
        let tag = "test".to_string();
        let run = Command::new("bash")
            .arg(repo_root().join("scripts/images.sh"))
            .arg(&out)
            .arg(&bin_dir)
            .arg(&tag)
            .output()
            .expect("run scripts/images.sh");
        assert!(
            run.status.success(),
            "scripts/images.sh failed:\n{}\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        );
        Images {
            agent: out.join("tessera.tar"),
            scheduler: out.join("tessera-scheduler.tar"),
            tag,
        }
    })
}

/// Where the chart's hostPath values point on every node.
#[derive(Debug, Clone)]
pub struct NodePaths {
    /// Under which the agent's directories go (its cache, mounts, snapshotter root,
    /// sockets).
    pub root: PathBuf,
    /// containerd's config file, edited by the chart's init container.
    pub containerd_config: PathBuf,
    /// containerd's hosts directory (`config_path`).
    pub certs_dir: PathBuf,
    /// containerd's socket, where the CRI proxy passes calls on to.
    pub containerd_socket: PathBuf,
}

impl NodePaths {
    /// The cluster's nodes' own views ([`KubeCluster::host_root`]): the same paths on
    /// every node, each node's own files behind them, as on separate machines.
    pub fn of(cluster: &KubeCluster) -> NodePaths {
        let node = cluster.nodes().first().expect("a node");
        NodePaths {
            root: cluster.host_root(),
            containerd_config: node.containerd_config_in_view(),
            certs_dir: node.certs_dir_in_view(),
            containerd_socket: node.containerd_socket_in_view(),
        }
    }

    /// The chart's values that put everything of the agent at these paths.
    fn values(&self) -> String {
        let root = self.root.display();
        format!(
            r#"agent:
  socketDir: {root}/run/tessera
  mountRoot: {root}/var/lib/tessera/mnt
  cache:
    hostPath: {root}/var/lib/tessera/cache
  snapshotter:
    root: {root}/var/lib/tessera/snapshotter
  criProxy:
    containerdSocket: {socket}
  layerStore:
    root: {root}/var/lib/tessera/store
containerd:
  configFile: {config}
  certsDir: {certs}
"#,
            socket = self.containerd_socket.display(),
            config = self.containerd_config.display(),
            certs = self.certs_dir.display(),
        )
    }
}

/// A release of the chart on a cluster; uninstalled when dropped if still there. It
/// keeps the cluster's admin kubeconfig, not the cluster: a test goes on restarting
/// the cluster's nodes while the release is installed.
pub struct Release {
    kubeconfig: PathBuf,
    pub name: String,
    dir: PathBuf,
    installed: bool,
}

impl Release {
    /// Imports the images into every node, then `helm install --wait`s the chart as
    /// `name` with the images and `paths`, then `values` (YAML) on top.
    pub fn install(cluster: &KubeCluster, name: &str, paths: &NodePaths, values: &str) -> Release {
        let images = images();
        for node in cluster.nodes() {
            for archive in [&images.agent, &images.scheduler] {
                let out = node.ctr(&["images", "import", s(archive)]);
                assert!(
                    out.status.success(),
                    "import {} into {}: {}",
                    archive.display(),
                    node.name,
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
        let dir = cluster.dir.join(format!("release-{name}"));
        std::fs::create_dir_all(&dir).expect("create release dir");
        std::fs::write(dir.join("paths.yaml"), paths.values()).expect("write values");
        std::fs::write(
            dir.join("images.yaml"),
            format!(
                "agent:\n  image:\n    repository: tessera\n    tag: {tag}\n    pullPolicy: Never\n\
                 scheduler:\n  image:\n    repository: tessera-scheduler\n    tag: {tag}\n    pullPolicy: Never\n",
                tag = images.tag
            ),
        )
        .expect("write values");
        let mut release = Release {
            kubeconfig: cluster.kubeconfig.clone(),
            name: name.to_string(),
            dir,
            installed: false,
        };
        release.write_values(values);
        release.helm_ok(&release.install_args("install"));
        release.installed = true;
        // Not `helm install --wait`: with containerd.configureSnapshotter an agent
        // starts only after its node's containerd was restarted (configure_node). The
        // rest is waited for here.
        let sets = release.kubectl(&["-n", NAMESPACE, "get", "statefulsets", "-o", "name"]);
        for set in String::from_utf8_lossy(&sets.stdout).split_whitespace() {
            let out = release.kubectl(&[
                "-n",
                NAMESPACE,
                "rollout",
                "status",
                set,
                &format!("--timeout={}s", READY.as_secs()),
            ]);
            assert!(
                out.status.success(),
                "{set} did not roll out: {}\n{}",
                String::from_utf8_lossy(&out.stderr),
                release.describe()
            );
        }
        release
    }

    fn write_values(&self, values: &str) {
        std::fs::write(self.dir.join("test.yaml"), values).expect("write values");
    }

    fn install_args(&self, verb: &str) -> Vec<String> {
        let chart = repo_root().join("deploy/helm/tessera");
        let mut args: Vec<String> = vec![
            verb.into(),
            self.name.clone(),
            chart.display().to_string(),
            "--namespace".into(),
            NAMESPACE.into(),
        ];
        if verb == "install" {
            args.push("--create-namespace".into());
        } else {
            args.extend([
                "--wait".into(),
                "--timeout".into(),
                format!("{}s", READY.as_secs()),
            ]);
        }
        for file in ["images.yaml", "paths.yaml", "test.yaml"] {
            args.push("--values".into());
            args.push(self.dir.join(file).display().to_string());
        }
        args
    }

    /// `kubectl ARGS` as the cluster's admin, whatever its outcome.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_command(args).output().expect("run kubectl")
    }

    /// The `kubectl ARGS` command as the cluster's admin, to run as the test likes.
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(kube_bin("kubectl"));
        c.arg(format!("--kubeconfig={}", s(&self.kubeconfig)))
            .args(args)
            .stdin(Stdio::null());
        c
    }

    /// `helm ARGS` against the cluster, whatever its outcome.
    pub fn helm(&self, args: &[String]) -> Output {
        Command::new(helm_bin())
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CACHE_HOME", self.dir.join("helm-cache"))
            .env("HELM_CONFIG_HOME", self.dir.join("helm-config"))
            .env("HELM_DATA_HOME", self.dir.join("helm-data"))
            .output()
            .expect("run helm")
    }

    /// Like [`Release::helm`], panicking with helm's output, the pods and the
    /// cluster's logs if it fails.
    pub fn helm_ok(&self, args: &[String]) -> String {
        let out = self.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}\n{}\n--- pods ---\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.describe()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `helm upgrade --wait` with `values` in place of the install's own: returns once
    /// the DaemonSets that roll (the agents') have rolled.
    pub fn upgrade(&self, values: &str) {
        self.write_values(values);
        self.helm_ok(&self.install_args("upgrade"));
    }

    /// `helm uninstall --wait`.
    pub fn uninstall(&mut self) {
        self.helm_ok(&[
            "uninstall".into(),
            self.name.clone(),
            "--namespace".into(),
            NAMESPACE.into(),
            "--wait".into(),
        ]);
        self.installed = false;
        // helm waits for its own objects; their pods go after, through the garbage
        // collector and each pod's grace period.
        let deadline = Instant::now() + READY;
        loop {
            let pods = self.kubectl(&[
                "-n",
                NAMESPACE,
                "get",
                "pods",
                "-l",
                &format!("app.kubernetes.io/instance={}", self.name),
                "-o",
                "name",
            ]);
            if pods.status.success() && pods.stdout.iter().all(u8::is_ascii_whitespace) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the release's pods outlived helm uninstall:\n{}",
                String::from_utf8_lossy(&pods.stdout)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// The release's pods, their states and recent events, for failure messages.
    pub fn describe(&self) -> String {
        let pods = self.kubectl(&["-n", NAMESPACE, "get", "pods", "-o", "wide"]);
        let events = self.kubectl(&["-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp"]);
        format!(
            "{}\n{}\n--- agent logs ---\n{}",
            String::from_utf8_lossy(&pods.stdout),
            String::from_utf8_lossy(&events.stdout),
            self.logs("app.kubernetes.io/component=agent", "agent")
        )
    }

    /// The last lines of `container`'s logs in the pods `selector` picks.
    pub fn logs(&self, selector: &str, container: &str) -> String {
        let out = self.kubectl(&[
            "-n",
            NAMESPACE,
            "logs",
            "-l",
            selector,
            "-c",
            container,
            "--tail=60",
            "--prefix",
        ]);
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    }

    /// Panics if any container of the release logged a panic (now, or before its
    /// last restart).
    pub fn assert_no_panics(&self) {
        let pods = self.kubectl(&[
            "-n",
            NAMESPACE,
            "get",
            "pods",
            "-o",
            "jsonpath={range .items[*]}{.metadata.name}{\"\\n\"}{end}",
        ]);
        for pod in String::from_utf8_lossy(&pods.stdout).split_whitespace() {
            for previous in ["--previous=false", "--previous=true"] {
                let out =
                    self.kubectl(&["-n", NAMESPACE, "logs", pod, "--all-containers", previous]);
                let text = String::from_utf8_lossy(&out.stdout);
                assert!(
                    !text.contains("panicked at"),
                    "{pod} panicked ({previous}):\n{text}"
                );
            }
        }
    }

    /// What an operator does once per node after installing with
    /// `containerd.configureSnapshotter` (docs/operations.md): waits for the chart to
    /// have configured node `index`'s containerd, restarts containerd for it, and
    /// returns the node's agent pod once it is Ready.
    ///
    /// The agent's pod cannot start before: it runs on the runtime handler the node
    /// pod's init container writes beside the snapshotter, which containerd reads only
    /// at start.
    pub fn configure_node(&self, cluster: &mut KubeCluster, index: usize) -> String {
        let node = cluster.nodes()[index].name.clone();
        self.ready_pod_on("node", &node);
        cluster.node_mut(index).restart_containerd();
        let restarted = Instant::now();
        let pod = self.agent_pod_on(&node);
        eprintln!(
            "{node}: the agent Ready {:.1?} after containerd's restart",
            restarted.elapsed()
        );
        pod
    }

    /// The agent pod on `node` (its name), once it is Ready.
    pub fn agent_pod_on(&self, node: &str) -> String {
        self.ready_pod_on("agent", node)
    }

    /// The release's pod of `component` (`agent`, `node`) on `node`, once it is Ready.
    pub fn ready_pod_on(&self, component: &str, node: &str) -> String {
        let deadline = Instant::now() + READY;
        loop {
            let out = self.kubectl(&[
                "-n",
                NAMESPACE,
                "get",
                "pods",
                "-l",
                &format!("app.kubernetes.io/component={component}"),
                "--field-selector",
                &format!("spec.nodeName={node}"),
                "-o",
                "jsonpath={range .items[*]}{.metadata.name} {.status.conditions[?(@.type==\"Ready\")].status} {.metadata.deletionTimestamp}{\"\\n\"}{end}",
            ]);
            let text = String::from_utf8_lossy(&out.stdout);
            let ready = text.lines().find_map(|l| {
                let mut f = l.split_whitespace();
                match (f.next(), f.next(), f.next()) {
                    (Some(name), Some("True"), None) => Some(name.to_string()),
                    _ => None,
                }
            });
            if let Some(name) = ready {
                return name;
            }
            assert!(
                Instant::now() < deadline,
                "no Ready {component} pod on {node}:\n{}",
                self.describe()
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// `tessera ARGS` in the agent's container on `node` (`kubectl exec`).
    pub fn tessera(&self, node: &str, args: &[&str]) -> Output {
        let pod = self.agent_pod_on(node);
        let mut all = vec![
            "-n",
            NAMESPACE,
            "exec",
            &pod,
            "-c",
            "agent",
            "--",
            "/usr/local/bin/tessera",
        ];
        all.extend_from_slice(args);
        self.kubectl(&all)
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        // The cluster goes with the test anyway; uninstalling first lets the agents
        // stop cleanly and unmount what they mounted before their nodes go.
        if self.installed {
            let _ = self.helm(&[
                "uninstall".into(),
                self.name.clone(),
                "--namespace".into(),
                NAMESPACE.into(),
                "--wait".into(),
                "--timeout".into(),
                "60s".into(),
            ]);
        }
    }
}

/// A one-container pod in namespace `default` for the chart's tests: `image` running
/// `script` with its `/bin/sh`, never restarted, gone a second after SIGTERM.
#[derive(Debug, Clone, Copy)]
pub struct TestPod<'a> {
    pub name: &'a str,
    pub image: &'a str,
    pub script: &'a str,
    /// On this node only (`kubernetes.io/hostname`).
    pub node: Option<&'a str>,
    pub pull_secret: Option<&'a str>,
    /// `imagePullPolicy: Always` (each start pulls, with the pod's credentials); else
    /// `IfNotPresent`.
    pub always_pull: bool,
}

impl<'a> TestPod<'a> {
    pub fn new(name: &'a str, image: &'a str, script: &'a str) -> TestPod<'a> {
        TestPod {
            name,
            image,
            script,
            node: None,
            pull_secret: None,
            always_pull: false,
        }
    }

    pub fn manifest(&self) -> String {
        let mut spec = String::new();
        if let Some(node) = self.node {
            spec += &format!("  nodeSelector:\n    kubernetes.io/hostname: {node}\n");
        }
        if let Some(secret) = self.pull_secret {
            spec += &format!("  imagePullSecrets:\n    - name: {secret}\n");
        }
        let policy = if self.always_pull {
            "Always"
        } else {
            "IfNotPresent"
        };
        format!(
            r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
{spec}  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: app
      image: {image}
      imagePullPolicy: {policy}
      command: ["/bin/sh", "-c", {script}]
"#,
            name = self.name,
            image = self.image,
            script = serde_json::Value::from(self.script),
        )
    }
}

impl Release {
    /// Waits until `check` holds of pod `name` in namespace `default` (`kubectl get pod
    /// NAME -o json`, `Null` while there is none) and returns the pod; panics with the
    /// pod and the release after `within`.
    pub fn wait_pod(
        &self,
        name: &str,
        within: Duration,
        what: &str,
        check: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let deadline = Instant::now() + within;
        loop {
            let out = self.kubectl(&["-n", "default", "get", "pod", name, "-o", "json"]);
            let pod: serde_json::Value =
                serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
            if check(&pod) {
                return pod;
            }
            assert!(
                Instant::now() < deadline,
                "pod {name} is not {what} after {within:?}:\n{:#}\n--- release ---\n{}",
                pod["status"],
                self.describe()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Whether a pod (as `kubectl get pod -o json` gives it) is Ready.
pub fn is_ready(pod: &serde_json::Value) -> bool {
    pod["status"]["conditions"].as_array().is_some_and(|c| {
        c.iter()
            .any(|c| c["type"] == "Ready" && c["status"] == "True")
    })
}

/// Why a pod's first container waits (`ErrImagePull`, …), if it does.
pub fn waiting_reason(pod: &serde_json::Value) -> Option<String> {
    pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"]
        .as_str()
        .map(str::to_owned)
}

/// Node `n`'s (1-based) agent's metrics, from its metrics port on the node's address.
pub fn agent_metrics(cluster: &KubeCluster, n: u8) -> String {
    let url = format!("http://{}:9464/metrics", cluster.addrs.node(n));
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", &url])
        .output()
        .expect("run curl");
    assert!(out.status.success(), "GET {url} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The sum of the series of metric `name` in `metrics` whose labels contain `label`
/// (`""`: every series).
pub fn metric_sum(metrics: &str, name: &str, label: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
                && l.contains(label)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The end of a chart test: no container of the release panicked; the release is
/// uninstalled, the cluster dropped, and the machine holds nothing of either.
pub fn finish(cluster: KubeCluster, release: Release) {
    release.assert_no_panics();
    let footprint = cluster.footprint();
    drop(release);
    drop(cluster);
    footprint.assert_clean();
}
