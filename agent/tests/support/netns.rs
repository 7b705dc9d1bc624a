//! A small simulated cluster of Linux network namespaces, for P2P tests and the swarm
//! benchmark: every host (registry, scheduler, each agent) gets its own namespace with
//! its own address, all joined by a bridge; the test process itself is attached too, so
//! it can push images to the registry and reach every service directly.
//!
//! ```text
//!   root ns (the test, 198.18.K.254) ─┐
//!   host 1 (198.18.K.1)  ─ veth ──────┤ bridge (in its own namespace)
//!   host 2 (198.18.K.2)  ─ veth ──────┤
//!   …                                 ┘
//! ```
//!
//! - Addresses come from 198.18.0.0/15, the range reserved for benchmarking
//!   (RFC 2544), so they cannot clash with a real network; K is unique per cluster.
//! - Programs run through `nsenter --net=/run/netns/NAME`, which enters only the network
//!   namespace. (`ip netns exec` would also give them a private mount namespace, and the
//!   FUSE mounts agents make would be invisible to the test.) With `--net` alone,
//!   nsenter execs the program, so a `Child`'s pid is the program's own.
//! - `tc` caps a host's egress (`cap_egress`): the registry's upload to the cluster.
//! - Dropping the cluster deletes its namespaces (and with them every veth and the
//!   bridge), also after a failed assertion; a new cluster first removes what a crashed
//!   test process left behind (namespaces named after a pid that is gone).

use std::ffi::OsStr;
use std::net::Ipv4Addr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Namespace names start with this, then the pid of the test process.
const PREFIX: &str = "tsr-";

static CLUSTERS: AtomicU32 = AtomicU32::new(0);
static SUBNETS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Runs `ip ARGS`, panicking with its stderr on failure.
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

pub struct Cluster {
    /// `tsr-<pid>-<n>`: every namespace of the cluster starts with it.
    name: String,
    /// K in 198.18.K.0/24.
    subnet: u8,
    bridge_ns: String,
    namespaces: Vec<String>,
}

/// One host of the cluster.
#[derive(Debug, Clone)]
pub struct NetHost {
    pub netns: String,
    pub ip: Ipv4Addr,
}

impl Cluster {
    /// Builds the bridge and attaches the test process to it. Panics, saying what is
    /// missing, when network namespaces cannot be made here (not root, no iproute2).
    pub fn new() -> Cluster {
        let probe = Command::new("ip").args(["netns", "list"]).output();
        match probe {
            Ok(o) if o.status.success() => {}
            _ => panic!(
                "the P2P tests need `ip netns` (Debian iproute2) and root to build network namespaces"
            ),
        }
        assert!(
            rustix_is_root(),
            "the P2P tests need root to build network namespaces; run them as root"
        );
        remove_stale();
        let n = CLUSTERS.fetch_add(1, Ordering::Relaxed);
        // A subnet per live cluster: the first K whose root-side veth does not exist,
        // taken (the veth created) under a lock so parallel tests never share one.
        let _taking = SUBNETS.lock().unwrap_or_else(|p| p.into_inner());
        let subnet = (1..=250u8)
            .find(|k| !std::path::Path::new(&format!("/sys/class/net/tsr{k}r")).exists())
            .expect("a free 198.18.K.0/24 subnet (250 clusters at once?)");
        let name = format!("{PREFIX}{}-{n}", std::process::id());
        let bridge_ns = format!("{name}-br");
        let mut cluster = Cluster {
            name,
            subnet,
            bridge_ns: bridge_ns.clone(),
            namespaces: Vec::new(),
        };
        ip(&["netns", "add", &bridge_ns]);
        cluster.namespaces.push(bridge_ns.clone());
        ip(&["-n", &bridge_ns, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &bridge_ns, "link", "set", "br0", "up"]);
        // The test process: a veth from the root namespace into the bridge.
        let (root_end, bridge_end) = (format!("tsr{subnet}r"), format!("tsr{subnet}rb"));
        ip(&[
            "link",
            "add",
            &root_end,
            "type",
            "veth",
            "peer",
            "name",
            &bridge_end,
        ]);
        ip(&["link", "set", &bridge_end, "netns", &bridge_ns]);
        ip(&[
            "-n",
            &bridge_ns,
            "link",
            "set",
            &bridge_end,
            "master",
            "br0",
            "up",
        ]);
        ip(&[
            "addr",
            "add",
            &format!("198.18.{subnet}.254/24"),
            "dev",
            &root_end,
        ]);
        ip(&["link", "set", &root_end, "up"]);
        cluster
    }

    /// Adds a host: a namespace with loopback up and `eth0` on the bridge.
    pub fn add_host(&mut self, label: &str) -> NetHost {
        let i = self.namespaces.len(); // 1.. (the bridge is 0)
        assert!(i < 250, "at most 249 hosts per cluster");
        let netns = format!("{}-{i}", self.name);
        let (outside, inside) = (
            format!("tsr{}h{i}", self.subnet),
            format!("tsr{}x{i}", self.subnet),
        );
        ip(&["netns", "add", &netns]);
        self.namespaces.push(netns.clone());
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        ip(&[
            "link", "add", &outside, "type", "veth", "peer", "name", &inside,
        ]);
        ip(&["link", "set", &inside, "netns", &netns]);
        ip(&["-n", &netns, "link", "set", &inside, "name", "eth0"]);
        ip(&["link", "set", &outside, "netns", &self.bridge_ns]);
        ip(&[
            "-n",
            &self.bridge_ns,
            "link",
            "set",
            &outside,
            "master",
            "br0",
            "up",
        ]);
        let addr = Ipv4Addr::new(198, 18, self.subnet, i as u8);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{addr}/24"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        let _ = label; // Names are by index; the label documents the call site.
        NetHost { netns, ip: addr }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Hosts first, the bridge last; a namespace whose processes still run lingers
        // until they exit, but its name (and our address range) is released now.
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "del", &format!("tsr{}r", self.subnet)])
            .output();
    }
}

impl NetHost {
    /// `program` run in this host's network namespace (and nothing else's).
    pub fn command(&self, program: impl AsRef<OsStr>) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net=/run/netns/{}", self.netns))
            .arg("--")
            .arg(program);
        c
    }

    /// Bytes this host has sent (its `eth0` counter): what the registry served, as the
    /// registry's own network interface counts it.
    pub fn tx_bytes(&self) -> u64 {
        // `ip netns exec` mounts the namespace's own /sys for the one `cat`.
        let out = Command::new("ip")
            .args(["netns", "exec", &self.netns, "cat"])
            .arg("/sys/class/net/eth0/statistics/tx_bytes")
            .output()
            .expect("read tx_bytes");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("tx_bytes of {}: {out:?}", self.netns))
    }

    /// Caps this host's egress to `rate` (`tc` syntax, e.g. `200mbit`).
    pub fn cap_egress(&self, rate: &str) {
        let out = Command::new("tc")
            .args(["-n", &self.netns, "qdisc", "replace", "dev", "eth0", "root"])
            .args(["tbf", "rate", rate, "burst", "256kb", "latency", "100ms"])
            .output()
            .expect("run tc (Debian iproute2)");
        assert!(
            out.status.success(),
            "tc failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn rustix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(2).map(|e| e == "0"))
        })
        .unwrap_or(false)
}

/// Deletes namespaces left by test processes that are gone.
fn remove_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).output();
        }
    }
}
