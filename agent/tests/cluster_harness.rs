//! The network-namespace cluster harness itself (`support::netns`, with the registry,
//! scheduler and agent started inside it), checked before the P2P tests and the swarm
//! benchmark build on it: hosts have their own addresses and reach each other and the
//! test process through the bridge; programs run in a host's network namespace but in
//! the test's mount namespace (FUSE mounts stay visible); the egress cap shapes what the
//! registry sends and its interface counts it; services can be killed and restarted;
//! nothing is left behind, also after a panic or a crashed run.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::agent::AgentProcess;
use support::netns::{Cluster, NetHost};
use support::oci::{self, build_files_image, pseudo_random, require_tool};
use support::registry::Registry;
use support::scheduler::SchedulerProcess;

/// `curl`'s HTTP status for `GET url`, run as `cmd` (the root namespace's curl, or one
/// in a host's namespace).
fn http_status(mut cmd: Command, url: &str) -> String {
    let out = cmd
        .args(["-sS", "--noproxy", "*", "--max-time", "10"])
        .args(["-o", "/dev/null", "-w", "%{http_code}", url])
        .output()
        .expect("run curl");
    assert!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Whether a TCP connection to `ip:port` opens from `host`'s namespace (bash's
/// `/dev/tcp`: no tool beyond bash needed).
fn connects_from(host: &NetHost, ip: impl std::fmt::Display, port: u16) -> bool {
    host.command("timeout")
        .args(["5", "bash", "-c", "exec 3<>/dev/tcp/$0/$1"])
        .arg(ip.to_string())
        .arg(port.to_string())
        .stderr(Stdio::null())
        .status()
        .expect("run bash in the namespace")
        .success()
}

/// Whether a TCP connection to `addr` opens from the test process (the root namespace).
fn connects(addr: &str) -> bool {
    let addr = addr.parse().unwrap();
    TcpStream::connect_timeout(&addr, Duration::from_secs(5)).is_ok()
}

/// The namespaces `ip netns list` shows.
fn namespaces() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .collect()
}

/// The prefix every namespace of `host`'s cluster starts with (`tsr-PID-N-`), and the
/// root-side veth of its subnet (`tsrKr`).
fn cluster_names(host: &NetHost) -> (String, String) {
    let (cluster, _index) = host.netns.rsplit_once('-').unwrap();
    (
        format!("{cluster}-"),
        format!("tsr{}r", host.ip.octets()[2]),
    )
}

/// Waits (the kernel frees a namespace's devices asynchronously) until no namespace
/// of the cluster and not its root-side veth remain.
fn assert_gone(prefix: &str, veth: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left: Vec<String> = namespaces()
            .into_iter()
            .filter(|n| n.starts_with(prefix))
            .collect();
        let veth_left = Path::new("/sys/class/net").join(veth).exists();
        if left.is_empty() && !veth_left {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "left behind: namespaces {left:?}, root veth {veth} {}",
            if veth_left { "present" } else { "gone" }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Four hosts: addresses in 198.18.K.0/24, reachable from the test and from each other;
/// a registry in one of them, its egress capped by `tbf`, serving an image pushed from
/// the test process to another host at the capped rate, counted on its interface; a
/// scheduler killed and restarted on the same address.
#[test]
fn hosts_reach_each_other_and_the_capped_registry() {
    require_tool("curl");
    let t = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new();
    let registry_host = cluster.add_host("registry");
    let scheduler_host = cluster.add_host("scheduler");
    let a = cluster.add_host("a");
    let b = cluster.add_host("b");

    // Distinct addresses in one subnet of the benchmark range, every namespace listed.
    let hosts = [&registry_host, &scheduler_host, &a, &b];
    let k = registry_host.ip.octets()[2];
    for (i, h) in hosts.iter().enumerate() {
        assert_eq!(h.ip, Ipv4Addr::new(198, 18, k, i as u8 + 1), "{h:?}");
        assert!(namespaces().contains(&h.netns), "{} not listed", h.netns);
    }

    // The registry's egress: a token bucket at 16 Mbit/s.
    registry_host.cap_egress("16mbit");
    let qdisc = oci::run_output(
        registry_host
            .command("tc")
            .args(["qdisc", "show", "dev", "eth0"]),
    );
    assert!(
        qdisc.contains("tbf") && qdisc.contains("rate 16Mbit"),
        "{qdisc}"
    );

    let registry = Registry::start_in(&registry_host);
    assert_eq!(registry.addr, format!("{}:5000", registry_host.ip));
    let v2 = format!("http://{}/v2/", registry.addr);
    // From the test process through the bridge, and from every other host.
    assert_eq!(http_status(Command::new("curl"), &v2), "200");
    for h in [&scheduler_host, &a, &b] {
        assert_eq!(http_status(h.command("curl"), &v2), "200", "from {h:?}");
    }

    // Another host's services are reachable from a host; the test process's loopback
    // is not (the program really runs in the host's network namespace).
    let mut scheduler = SchedulerProcess::start_in(&scheduler_host, t.path().join("s.log"), &[]);
    assert!(connects_from(&a, scheduler_host.ip, 7080));
    assert!(connects_from(&b, registry_host.ip, 5000));
    let local = TcpListener::bind("127.0.0.1:0").unwrap();
    let local_port = local.local_addr().unwrap().port();
    assert!(connects(&format!("127.0.0.1:{local_port}")));
    assert!(!connects_from(&a, "127.0.0.1", local_port));

    // Pushed from the test process, read back from host `a`: the same manifest and
    // layer, sent at the capped rate, every byte counted on the registry's interface.
    let layout = t.path().join("layout");
    let data = pseudo_random(2 << 20, 1);
    let digest = build_files_image(&layout, "amd64", &[vec![("data/blob.bin", data)]]);
    registry.push_layout(&layout, oci::TAG, "harness/files");
    let pulled = t.path().join("pulled");
    let before = registry_host.tx_bytes();
    let started = Instant::now();
    oci::run(
        a.command("skopeo")
            .args(["copy", "--insecure-policy", "--src-tls-verify=false"])
            .arg(format!(
                "docker://{}/harness/files:{}",
                registry.addr,
                oci::TAG
            ))
            .arg(format!("oci:{}:{}", pulled.display(), oci::TAG)),
    );
    let elapsed = started.elapsed();
    let sent = registry_host.tx_bytes() - before;
    let index: serde_json::Value =
        serde_json::from_slice(&std::fs::read(pulled.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["manifests"][0]["digest"], digest.as_str());
    let layer_bytes: u64 = std::fs::read_dir(layout.join("blobs/sha256"))
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let pulled_blob = pulled.join("blobs/sha256").join(e.file_name());
            assert_eq!(
                std::fs::read(e.path()).unwrap(),
                std::fs::read(&pulled_blob).unwrap(),
                "{}",
                pulled_blob.display()
            );
            e.metadata().unwrap().len()
        })
        .max()
        .unwrap();
    assert!(
        sent >= layer_bytes,
        "the registry's interface counted {sent} bytes for a {layer_bytes}-byte layer"
    );
    // 2 MiB at 16 Mbit/s is 1.05 s, less the 256 KiB burst: ~0.9 s.
    assert!(
        elapsed >= Duration::from_millis(700),
        "{layer_bytes} bytes through a 16 Mbit/s cap in {elapsed:?}"
    );

    // The scheduler dies and comes back on the same address.
    let scheduler_addr = format!("{}:7080", scheduler_host.ip);
    scheduler.kill9();
    assert!(!connects(&scheduler_addr));
    scheduler.restart();
    assert!(connects(&scheduler_addr));

    let names = cluster_names(&a);
    drop((scheduler, registry, local));
    drop(cluster);
    assert_gone(&names.0, &names.1);
}

/// A program started through `NetHost::command` is the program itself (nsenter with
/// `--net` alone execs it: its pid is the `Child`'s), in the host's network namespace
/// and in the test's own mount namespace (where agents' FUSE mounts must be seen).
#[test]
fn commands_run_in_the_hosts_network_namespace_only() {
    let mut cluster = Cluster::new();
    let host = cluster.add_host("h");
    let mut child = host.command("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let ns = |pid: &str, kind: &str| std::fs::read_link(format!("/proc/{pid}/ns/{kind}"));
    // nsenter execs: wait until the pid runs `sleep` rather than nsenter.
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::fs::read_link(format!("/proc/{pid}/exe"))
        .map(|exe| !exe.ends_with("sleep"))
        .unwrap_or(true)
    {
        assert!(Instant::now() < deadline, "pid {pid} never became `sleep`");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Stat follows the links to the namespaces' inodes: the same one, the host's.
    let host_net = std::fs::metadata(format!("/run/netns/{}", host.netns)).unwrap();
    let child_net = std::fs::metadata(format!("/proc/{pid}/ns/net")).unwrap();
    assert_eq!(
        (host_net.dev(), host_net.ino()),
        (child_net.dev(), child_net.ino()),
        "the child is not in {}",
        host.netns
    );
    assert_eq!(
        ns(&pid.to_string(), "mnt").unwrap(),
        ns("self", "mnt").unwrap(),
        "the child has a mount namespace of its own: FUSE mounts would be invisible"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

/// An agent on a host: its metrics answer on the host's address from the test process,
/// its socket on the shared filesystem; killed, it is gone (the pid killed is the
/// agent's own), and it restarts with the same files.
#[test]
fn an_agent_in_a_namespace_is_reachable_and_restartable() {
    let t = tempfile::tempdir().unwrap();
    let mut cluster = Cluster::new();
    let host = cluster.add_host("agent");
    let mut agent = AgentProcess::start_in(&t.path().join("agent"), &host, &[]);
    assert_eq!(agent.metrics, format!("{}:9464", host.ip));
    assert!(agent.metrics().contains("tessera_agent"), "{}", agent.log());
    assert!(agent.status().is_object());
    agent.kill9();
    assert!(!connects(&agent.metrics), "the killed agent still listens");
    agent.restart();
    assert!(agent.metrics().contains("tessera_agent"), "{}", agent.log());
    drop(agent);
    let names = cluster_names(&host);
    drop(cluster);
    assert_gone(&names.0, &names.1);
}

/// Two clusters at once get different subnets; a cluster dropped while a test panics
/// leaves nothing behind; namespaces of a test process that died are removed by the
/// next cluster.
#[test]
fn clusters_are_separate_and_leave_nothing_behind() {
    let mut one = Cluster::new();
    let mut two = Cluster::new();
    let (h1, h2) = (one.add_host("x"), two.add_host("x"));
    assert_ne!(h1.ip.octets()[2], h2.ip.octets()[2]);
    assert_ne!(h1.netns, h2.netns);
    let names = [cluster_names(&h1), cluster_names(&h2)];
    drop((one, two));
    for (prefix, veth) in &names {
        assert_gone(prefix, veth);
    }

    // A panic with a registry running in the cluster: unwinding stops the registry,
    // then deletes the namespaces.
    let panicked = std::thread::spawn(|| {
        let mut cluster = Cluster::new();
        let host = cluster.add_host("registry");
        let registry = Registry::start_in(&host);
        let names = cluster_names(&host);
        let _keep = (registry, cluster);
        std::panic::panic_any(names);
    })
    .join()
    .unwrap_err();
    let (prefix, veth) = panicked.downcast_ref::<(String, String)>().unwrap();
    assert_gone(prefix, veth);

    // A crashed run's namespace: named after a pid that no longer exists.
    let mut gone = Command::new("true").spawn().unwrap();
    let dead = gone.id();
    gone.wait().unwrap();
    let stale = format!("tsr-{dead}-0-br");
    oci::run(Command::new("ip").args(["netns", "add", &stale]));
    let _fresh = Cluster::new();
    assert!(
        !namespaces().contains(&stale),
        "{stale} survived a new cluster"
    );
}
