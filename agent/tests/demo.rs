//! The local demo cluster (`make demo`, `scripts/demo.sh`) end to end: it starts a
//! registry, a scheduler and three agents, converts the sample image, starts it lazily
//! on every agent, checkpoints a booted server and restores it from a lazy mount, and
//! prints its report; `scripts/demo.sh stop` then leaves nothing
//! mounted or running. The tests run the script itself with this build's binaries and a
//! smaller data file, once on network namespaces and once on loopback ports.
#![allow(clippy::unwrap_used)]

mod support;

use std::path::Path;
use std::process::{Command, Output};

/// One demo run in its own directory; stopped when dropped, also after a failed assertion.
struct Demo {
    out: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl Demo {
    fn new(env: &[(&'static str, &str)]) -> Demo {
        let out = tempfile::tempdir().unwrap();
        let bin_dir = support::scheduler::binary()
            .parent()
            .unwrap()
            .display()
            .to_string();
        let mut all = vec![
            ("DEMO_OUT", out.path().display().to_string()),
            ("DEMO_BIN_DIR", bin_dir),
            ("DEMO_DATA_MB", "32".to_string()),
        ];
        all.extend(env.iter().map(|(k, v)| (*k, v.to_string())));
        Demo { out, env: all }
    }

    fn script(&self, arg: &str) -> Output {
        Command::new("bash")
            .arg(support::repo_root().join("scripts/demo.sh"))
            .arg(arg)
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run bash scripts/demo.sh")
    }

    fn path(&self) -> &Path {
        self.out.path()
    }

    /// What of the demo is still mounted or running: mounts under its directory and
    /// processes naming it, each described.
    fn leftovers(&self) -> Vec<String> {
        let dir = format!("{}/", self.path().display());
        let mut left: Vec<String> = std::fs::read_to_string("/proc/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(1).is_some_and(|m| m.starts_with(&dir)))
            .map(|l| format!("mount {l}"))
            .collect();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if cmdline.contains(&dir) && !cmdline.contains("demo.sh") {
                left.push(format!("process {cmdline}"));
            }
        }
        left
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.script("stop");
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the demo, checks its report, stops it and checks nothing is left.
fn run_demo(demo: &Demo, namespaces: Option<&str>) {
    let run = demo.script("start");
    let (stdout, stderr) = (text(&run.stdout), text(&run.stderr));
    assert!(run.status.success(), "the demo failed:\n{stdout}\n{stderr}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(demo.path().join("report.json")).unwrap()).unwrap();
    let agents = report["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 3, "{report}");
    let image_bytes = report["image_bytes"].as_u64().unwrap();
    let first_origin = agents[0]["origin_bytes"].as_u64().unwrap();
    assert!(
        first_origin > 0 && agents[0]["peer_bytes"] == 0,
        "the first agent fetches from the registry: {report}"
    );
    for (n, agent) in agents.iter().enumerate() {
        let read = agent["bytes_read"].as_u64().unwrap();
        let fetched =
            agent["origin_bytes"].as_u64().unwrap() + agent["peer_bytes"].as_u64().unwrap();
        assert!(
            read > 1 << 20,
            "agent {} read {read} bytes: {report}",
            n + 1
        );
        // Lazy: the start-up reads a few files; most of the image is never fetched.
        assert!(
            fetched < image_bytes / 2,
            "agent {} fetched {fetched} of {image_bytes} bytes: {report}",
            n + 1
        );
        assert!(agent["first_byte_seconds"].as_f64().unwrap() > 0.0);
        assert!(
            agent["ready_seconds"].as_f64().unwrap() >= agent["mount_seconds"].as_f64().unwrap()
        );
        assert_eq!(agent["verification_failures"], 0);
    }
    for agent in &agents[1..] {
        assert!(
            agent["peer_bytes"].as_u64().unwrap() > 0,
            "later agents fetch from peers: {report}"
        );
    }
    // The registry sent about one start-up's worth for all three.
    let total_origin = report["origin_bytes"].as_u64().unwrap();
    assert!(
        total_origin <= first_origin + first_origin / 10,
        "registry sent {total_origin} bytes for 3 start-ups, one needed {first_origin}: {report}"
    );
    for line in [
        "== report",
        "agent1",
        "agent3",
        "registry sent",
        "the scheduler's admin API",
        "origin_offload_ratio",
        "make demo-stop",
    ] {
        assert!(
            stdout.contains(line),
            "no {line:?} in the demo's output:\n{stdout}"
        );
    }
    for n in 1..=3 {
        let out =
            std::fs::read_to_string(demo.path().join(format!("agent{n}/startup.out"))).unwrap();
        assert!(out.contains("app ready"), "agent {n}'s start-up: {out}");
    }
    // Restore instead of boot: the checkpointed server came back from a lazy mount
    // with its state, its count going on.
    let restore = &report["restore"];
    assert_eq!(restore["same_state"], true, "{report}");
    assert_eq!(
        restore["count_after"].as_u64().unwrap(),
        restore["count_before"].as_u64().unwrap() + 1,
        "{report}"
    );
    assert!(
        restore["checkpoint_bytes_read"].as_u64().unwrap() > 32 << 20,
        "CRIU read the server's 32 MiB of state through the mount: {report}"
    );
    assert!(
        stdout.contains("restore: the server answered"),
        "no restore line in the demo's output:\n{stdout}"
    );
    // Still running until stopped: the mounts serve the image.
    assert!(demo.path().join("agent2/mnt/app/main.py").is_file());

    let stop = demo.script("stop");
    assert!(
        stop.status.success() && text(&stop.stdout).contains("demo stopped"),
        "stop: {}\n{}",
        text(&stop.stdout),
        text(&stop.stderr)
    );
    let left = demo.leftovers();
    assert!(left.is_empty(), "left after stop: {left:#?}");
    if let Some(prefix) = namespaces {
        let list = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let list = text(&list.stdout);
        assert!(
            !list.lines().any(|l| l.starts_with(&format!("{prefix}-"))),
            "namespaces left after stop:\n{list}"
        );
    }
    // Stopping twice is harmless.
    assert!(demo.script("stop").status.success());
}

#[test]
fn the_demo_cluster_starts_an_image_lazily_on_three_nodes_and_stops_clean() {
    // Names and a subnet of its own, so it runs beside a user's `make demo`.
    let demo = Demo::new(&[
        ("DEMO_NETNS", "1"),
        ("DEMO_NAME", "tdt"),
        ("DEMO_SUBNET", "253"),
    ]);
    run_demo(&demo, Some("tdt"));
}

#[test]
fn the_demo_runs_on_loopback_ports_where_there_are_no_namespaces() {
    let demo = Demo::new(&[("DEMO_NETNS", "0")]);
    run_demo(&demo, None);
}
