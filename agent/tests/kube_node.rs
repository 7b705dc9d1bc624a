//! A real Kubernetes node (issue 46), checked on its own before the Tessera chart is
//! installed on it: the harness (`support::kube`) brings up the control plane and a
//! node (containerd 2 with CRI and CNI, the kubelet), a pod from a local registry runs,
//! logs, resolves the `kubernetes` Service through the cluster DNS and is deleted; and
//! after the harness is dropped, the machine holds nothing of the cluster, also when it
//! is dropped with the pod still running (as a failed test drops it). A second node,
//! in a network namespace of its own, runs a pod the scheduler places there. Each node
//! has a host filesystem of its own under the host root (what a chart's hostPaths
//! need): two pods write there and mount a tmpfs there with `Bidirectional`
//! propagation, each seen by its own node only. A node restarts its containerd and its
//! kubelet (with another image service) while its pod runs on.
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
    let layout = busybox_layout(work);
    registry.push_layout(&layout, oci::TAG, "busybox");
    format!("{}/busybox:{}", registry.addr, oci::TAG)
}

/// The busybox image as an OCI layout under `work`, tagged [`oci::TAG`].
fn busybox_layout(work: &std::path::Path) -> std::path::PathBuf {
    require_tool("busybox");
    let tree = work.join("busybox-tree");
    let bin = tree.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(oci::which("busybox").unwrap(), bin.join("busybox")).unwrap();
    // busybox runs the applet its name says.
    for applet in ["sh", "sleep", "nslookup", "echo", "cat", "mkdir", "mount"] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
    let layout = work.join("busybox-layout");
    oci::build_dirs_image(
        &layout,
        "amd64",
        &[&tree],
        serde_json::json!({"Entrypoint": ["/bin/sh"], "Env": ["PATH=/bin"]}),
    );
    layout
}

fn pod_manifest(image: &str) -> String {
    pod_on("hello", image, None)
}

/// A pod `name` that greets, resolves the `kubernetes` Service and sleeps; on `node` if
/// given (through the scheduler: a node selector), from a local image then.
fn pod_on(name: &str, image: &str, node: Option<&str>) -> String {
    let placement = match node {
        Some(node) => format!("  nodeSelector:\n    kubernetes.io/hostname: {node}\n"),
        None => String::new(),
    };
    let pull = if node.is_some() {
        "Never"
    } else {
        "IfNotPresent"
    };
    // `trap`: sh as PID 1 ignores SIGTERM otherwise, and the delete would wait out
    // the grace period.
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
{placement}  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: {image}
    imagePullPolicy: {pull}
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

/// `kubectl logs POD` (its stderr too, to show why it failed) once the pod has printed
/// DNS's answer, or as it is after 30 s.
fn pod_log(cluster: &KubeCluster, pod: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = cluster.kubectl(&["logs", pod]);
        let log = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if log.contains("dns done") || Instant::now() >= deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
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

    let log = pod_log(&cluster, "pod/hello");
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

/// Two nodes, the second in a network namespace of its own: each runs a pod the
/// scheduler places there (from an image imported into the nodes), each pod resolves
/// the `kubernetes` Service through CoreDNS on the control-plane address, and the pods
/// get addresses from their own node's range.
#[test]
fn two_nodes_each_run_a_pod() {
    let work = tempfile::tempdir().unwrap();
    let layout = busybox_layout(work.path());
    let archive = work.path().join("busybox.tar");
    let tar = std::process::Command::new("tar")
        .arg("-C")
        .arg(&layout)
        .arg("-cf")
        .arg(&archive)
        .arg(".")
        .status()
        .unwrap();
    assert!(tar.success());

    let mut cluster = KubeCluster::start(&KubeOptions::default());
    let began = Instant::now();
    cluster.add_node();
    eprintln!("kube: second node Ready in {:.1?}", began.elapsed());
    let footprint = cluster.footprint();
    cluster.import_image(&archive, "tessera.test/busybox");
    let image = format!("tessera.test/busybox:{}", oci::TAG);
    let kubernetes_ip = cluster.addrs.kubernetes_service().to_string();

    for n in [1u8, 2] {
        let node = format!("node-{n}");
        cluster.kubectl_apply(&pod_on(&format!("hello-{n}"), &image, Some(&node)));
    }
    for n in [1u8, 2] {
        let pod = format!("pod/hello-{n}");
        cluster.kubectl_ok(&["wait", "--for=condition=Ready", &pod, "--timeout=90s"]);
        let placed = cluster.kubectl_ok(&[
            "get",
            &pod,
            "-o",
            "jsonpath={.spec.nodeName} {.status.podIP}",
        ]);
        let (node, ip) = placed.split_once(' ').unwrap();
        assert_eq!(node, format!("node-{n}"));
        let range = cluster.addrs.pod_cidr(n);
        let (net, _) = range.split_once('/').unwrap();
        let ip: std::net::Ipv4Addr = ip.parse().unwrap();
        let net: std::net::Ipv4Addr = net.parse().unwrap();
        assert_eq!(
            u32::from(ip) & !63,
            u32::from(net),
            "{pod} has {ip}, outside {node}'s pod range {range}"
        );
        let log = pod_log(&cluster, &pod);
        assert!(
            log.contains(GREETING) && log.contains(&kubernetes_ip),
            "{pod} on {node} did not greet and resolve kubernetes.default \
             ({kubernetes_ip}):\n{log}\n{}",
            cluster.logs_tail(30)
        );
        eprintln!("kube: {pod} on {node} at {ip}");
    }
    drop(cluster);
    footprint.assert_clean();
}

/// A privileged pod on `node` with `dir` (under the host root) as a `DirectoryOrCreate`
/// hostPath at `/host`, `Bidirectional`: it writes `written-by` there and mounts a
/// tmpfs on `mnt` with a `marker` inside, both saying `node`; Ready once the marker is
/// there.
fn host_pod(name: &str, image: &str, node: &str, dir: &std::path::Path) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
spec:
  nodeSelector:
    kubernetes.io/hostname: {node}
  restartPolicy: Never
  terminationGracePeriodSeconds: 5
  containers:
  - name: main
    image: {image}
    imagePullPolicy: IfNotPresent
    securityContext:
      privileged: true
    command:
    - /bin/sh
    - -c
    - |
      trap 'exit 0' TERM
      echo {node} > /host/written-by
      mkdir -p /host/mnt
      mount -t tmpfs tessera-test /host/mnt
      echo {node} > /host/mnt/marker
      sleep 3600 &
      wait
    readinessProbe:
      exec:
        command: [/bin/cat, /host/mnt/marker]
      periodSeconds: 1
    volumeMounts:
    - name: host
      mountPath: /host
      mountPropagation: Bidirectional
  volumes:
  - name: host
    hostPath:
      path: {dir}
      type: DirectoryOrCreate
"#,
        dir = dir.display()
    )
}

/// `program ARGS` in `node`'s namespaces; its stdout, panicking if it fails.
fn on_node(node: &support::kube::Node, program: &str, args: &[&str]) -> String {
    let out = node.command(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?} on {} failed: {}",
        node.name,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The mounts at `path` in a mountinfo table: (filesystem type, source).
fn mounts_at(mountinfo: &str, path: &std::path::Path) -> Vec<String> {
    let path = path.to_str().unwrap();
    mountinfo
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(path))
        .map(|l| {
            l.split_once(" - ")
                .map(|(_, fs)| fs.to_owned())
                .unwrap_or_default()
        })
        .collect()
}

/// Two nodes each run a pod from the test's registry (on 127.0.0.1, exposed on the
/// control-plane address, which both nodes reach) with a `Bidirectional` hostPath
/// under the host root: each pod's file lands in its own node's directory only, and
/// each pod's tmpfs is seen from its own node's mount namespace, not from the test's
/// and not from the other node's; the host is clean after the drop.
#[test]
fn each_node_has_a_host_filesystem_of_its_own() {
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let layout = busybox_layout(work.path());
    registry.push_layout(&layout, oci::TAG, "busybox");

    let mut cluster = KubeCluster::start(&KubeOptions::default());
    cluster.add_node();
    let footprint = cluster.footprint();
    let registry_host = cluster.expose_registry(&registry.addr);
    let image = format!("{registry_host}/busybox:{}", oci::TAG);
    let dir = cluster.host_root().join("kube-node-test");

    for n in [1u8, 2] {
        let node = format!("node-{n}");
        cluster.kubectl_apply(&host_pod(&format!("host-{n}"), &image, &node, &dir));
    }
    for n in [1u8, 2] {
        cluster.kubectl_ok(&[
            "wait",
            "--for=condition=Ready",
            &format!("pod/host-{n}"),
            "--timeout=90s",
        ]);
    }

    // What the test mounts under the cluster's dir reaches every node; what the nodes
    // mounted did not come back (checked below).
    let from_test = cluster.dir.join("from-test");
    std::fs::create_dir(&from_test).unwrap();
    let mount = |args: &[&str]| {
        let status = std::process::Command::new(args[0])
            .args(&args[1..])
            .status()
            .unwrap();
        assert!(status.success(), "{args:?}");
    };
    let from_test_s = from_test.to_str().unwrap();
    mount(&["mount", "-t", "tmpfs", "tessera-from-test", from_test_s]);
    for node in cluster.nodes() {
        let mounts = mounts_at(&on_node(node, "cat", &["/proc/self/mountinfo"]), &from_test);
        assert_eq!(
            mounts.len(),
            1,
            "{} sees {mounts:?} at {from_test_s}",
            node.name
        );
    }
    mount(&["umount", from_test_s]);

    let test_mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !dir.exists() && !test_mounts.contains(cluster.host_root().to_str().unwrap()),
        "the host root in the test's mount namespace holds what a node made:\n{test_mounts}"
    );
    for (i, node) in cluster.nodes().iter().enumerate() {
        let other = &cluster.nodes()[1 - i];
        let written = std::fs::read_to_string(node.host_path("kube-node-test/written-by"));
        assert_eq!(
            written.as_deref().map(str::trim).ok(),
            Some(node.name.as_str()),
            "{}'s pod's file in {}",
            node.name,
            node.host_path("kube-node-test").display()
        );
        // As the node sees it, at the same path on every node.
        let seen = on_node(node, "cat", &[dir.join("written-by").to_str().unwrap()]);
        assert_eq!(seen.trim(), node.name);
        let marker = dir.join("mnt/marker");
        let seen = on_node(node, "cat", &[marker.to_str().unwrap()]);
        assert_eq!(
            seen.trim(),
            node.name,
            "{} sees another node's tmpfs at {}",
            node.name,
            marker.display()
        );
        let mounts = mounts_at(
            &on_node(node, "cat", &["/proc/self/mountinfo"]),
            &dir.join("mnt"),
        );
        assert_eq!(
            mounts.len(),
            1,
            "{} should see exactly its pod's tmpfs at {}: {mounts:?}",
            node.name,
            dir.join("mnt").display()
        );
        assert!(mounts[0].starts_with("tmpfs tessera-test "), "{mounts:?}");
        // The tmpfs is on the node's view, not on the directory behind it.
        assert!(!node.host_path("kube-node-test/mnt/marker").exists());
        eprintln!(
            "kube: {} wrote {} and mounted a tmpfs at {} (its view only; not {}'s)",
            node.name,
            node.host_path("kube-node-test/written-by").display(),
            dir.join("mnt").display(),
            other.name
        );
    }

    drop(cluster);
    footprint.assert_clean();
}

/// The restarts a chart install makes: containerd with its (edited) config file while a
/// pod runs, whose container lives on with the same pid; and the kubelet with another
/// image service endpoint (here containerd's own socket, as the node sees it) and back,
/// the node Ready after each, a new pod started through it.
#[test]
fn a_node_restarts_containerd_and_its_kubelet_while_its_pod_runs() {
    let work = tempfile::tempdir().unwrap();
    let registry = Registry::start();
    let image = push_busybox(&registry, work.path());
    let mut cluster = KubeCluster::start(&KubeOptions::with_registry(&registry.addr));
    let footprint = cluster.footprint();
    cluster.kubectl_apply(&pod_manifest(&image));
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/hello",
        "--timeout=90s",
    ]);
    let tasks = |cluster: &KubeCluster| {
        let out = cluster.nodes()[0].ctr(&["tasks", "ls"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .map(str::to_owned)
            .collect();
        lines.sort();
        lines
    };
    let before = tasks(&cluster);
    assert!(before.iter().all(|l| l.contains("RUNNING")), "{before:?}");

    let began = Instant::now();
    cluster.node_mut(0).restart_containerd();
    eprintln!("kube: containerd restarted in {:.1?}", began.elapsed());
    assert_eq!(
        tasks(&cluster),
        before,
        "containers after the containerd restart"
    );

    let configz = |cluster: &KubeCluster| {
        cluster.kubectl_ok(&["get", "--raw", "/api/v1/nodes/node-1/proxy/configz"])
    };
    let socket = cluster.nodes()[0].containerd_socket_in_view();
    let began = Instant::now();
    cluster
        .node_mut(0)
        .set_image_service_endpoint(Some(&socket));
    eprintln!(
        "kube: kubelet restarted and Ready in {:.1?}",
        began.elapsed()
    );
    let endpoint = format!("\"imageServiceEndpoint\":\"unix://{}\"", socket.display());
    assert!(
        configz(&cluster).contains(&endpoint),
        "{}",
        configz(&cluster)
    );
    cluster.kubectl_apply(&pod_on("second", &image, None));
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/second",
        "--timeout=90s",
    ]);

    cluster.node_mut(0).set_image_service_endpoint(None);
    assert!(!configz(&cluster).contains(&endpoint));
    cluster.kubectl_ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/hello",
        "--timeout=30s",
    ]);
    let after = tasks(&cluster);
    for task in &before {
        assert!(
            after.contains(task),
            "{task} is gone after the restarts: {after:?}"
        );
    }

    drop(cluster);
    footprint.assert_clean();
}
