//! A real Kubernetes node (issue 46), checked on its own before the Tessera chart is
//! installed on it: the harness (`support::kube`) brings up the control plane and a
//! node (containerd 2 with CRI and CNI, the kubelet), a pod from a local registry runs,
//! logs, resolves the `kubernetes` Service through the cluster DNS and is deleted; and
//! after the harness is dropped, the machine holds nothing of the cluster, also when it
//! is dropped with the pod still running (as a failed test drops it).
//!
//! Needs root, `make kubernetes-deps`, `make containerd-deps`, and Debian's
//! busybox-static, docker-registry, skopeo and containernetworking-plugins (`make
//! test-deps`). A missing prerequisite fails the test with what to run.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::time::{Duration, Instant};

use support::kube::{KubeCluster, KubeOptions};
use support::oci::{self, require_tool};
use support::registry::Registry;

/// What the pod prints first: finding it in `kubectl logs` shows the kubelet ran the
/// image and reads its log.
const GREETING: &str = "hello from a tessera test pod";

/// A busybox image (Debian's static busybox, with the applets the pod uses linked to
/// it) pushed to `registry` as `busybox:v1`; returns the reference.
fn push_busybox(registry: &Registry, work: &std::path::Path) -> String {
    require_tool("busybox");
    let tree = work.join("busybox-tree");
    let bin = tree.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(oci::which("busybox").unwrap(), bin.join("busybox")).unwrap();
    // busybox runs the applet its name says.
    for applet in ["sh", "sleep", "nslookup", "echo"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let layout = work.join("busybox-layout");
    oci::build_dirs_image(
        &layout,
        "amd64",
        &[&tree],
        serde_json::json!({"Entrypoint": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    registry.push_layout(&layout, oci::TAG, "busybox");
    format!("{}/busybox:{}", registry.addr, oci::TAG)
}

fn pod_manifest(image: &str) -> String {
    // `trap`: sh as PID 1 ignores SIGTERM otherwise, and the delete would wait out
    // the grace period.
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: hello
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: hello
    image: {image}
    command:
    - /bin/sh
    - -c
    - |
      trap 'exit 0' TERM
      echo "{GREETING}"
      nslookup kubernetes.default.svc.cluster.local
      echo "dns done"
      sleep 3600 &
      wait
"#
    )
}

#[test]
fn a_pod_runs_on_a_real_node_and_the_host_is_clean_afterwards() {
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let image = push_busybox(&registry, work.path());

    let cluster = KubeCluster::start(&KubeOptions::with_registry(&registry.addr));
    eprintln!(
        "kube: cluster up in {:.1?} (slot {}, node {} at {})",
        cluster.bring_up,
        cluster.addrs.slot,
        cluster.nodes()[0].name,
        cluster.nodes()[0].ip
    );
    let footprint = cluster.footprint();
    let kubernetes_ip = cluster.addrs.kubernetes_service().to_string();

    let began = Instant::now();
    cluster.kubectl_apply(&pod_manifest(&image));
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/hello",
        "--timeout=90s",
    ]);
    eprintln!("kube: pod Running in {:.1?}", began.elapsed());

    // The log fills as the pod goes on: wait for DNS's answer too.
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = String::from_utf8_lossy(&cluster.kubectl(&["logs", "hello"]).stdout).into_owned();
        if log.contains("dns done") || Instant::now() >= deadline {
            break log;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(
        log.contains(GREETING),
        "the pod's log lacks its greeting:\n{log}\n{}",
        cluster.logs_tail(30)
    );
    assert!(
        log.contains(&kubernetes_ip),
        "the pod did not resolve kubernetes.default through the cluster DNS \
         ({kubernetes_ip} expected):\n{log}\n{}",
        cluster.logs_tail(30)
    );
    let node = cluster.kubectl_ok(&[
        "get",
        "pod",
        "hello",
        "-o",
        "jsonpath={.spec.nodeName} {.status.podIP}",
    ]);
    eprintln!("kube: pod on {node}");

    cluster.kubectl_ok(&["delete", "pod", "hello", "--wait=true", "--timeout=60s"]);
    let left = cluster.kubectl_ok(&["get", "pods", "-o", "name"]);
    assert!(left.trim().is_empty(), "pods left after the delete: {left}");

    let began = Instant::now();
    drop(cluster);
    eprintln!("kube: torn down in {:.1?}", began.elapsed());
    footprint.assert_clean();
}

/// A failed test drops the cluster mid-way: the harness must then kill the pod's
/// processes itself, unmount its network namespace and volumes, and remove the veth,
/// the bridge and libcni's cache file, without the kubelet's help.
#[test]
fn a_cluster_dropped_with_a_running_pod_leaves_nothing_behind() {
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let image = push_busybox(&registry, work.path());
    let cluster = KubeCluster::start(&KubeOptions::with_registry(&registry.addr));
    let footprint = cluster.footprint();
    cluster.kubectl_apply(&pod_manifest(&image));
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/hello",
        "--timeout=90s",
    ]);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _cluster = cluster;
        panic!("a test failing with its pod running");
    }));
    assert!(result.is_err());
    footprint.assert_clean();
}
