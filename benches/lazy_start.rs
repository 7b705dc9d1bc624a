//! The lazy-start benchmark: how long until a realistic image's application has started
//! on a cold node, side by side in one run, with the registry's egress capped:
//!
//! 1. `skopeo copy` + `umoci unpack`, then the start-up (the baseline);
//! 2. `ctr image pull` (containerd fetches and unpacks), then the start-up;
//! 3. `tessera mount` of the converted image, then the start-up reading through the
//!    lazy mount, with an empty cache;
//! 4. the same with the image converted with the start-up's prefetch list (recorded by
//!    `tessera mount --record` in a first run), fetched in the background at mount;
//! 5. the Kubernetes path: the plain image pulled through containerd's CRI image
//!    service (as the kubelet pulls it) with the default overlayfs snapshotter, then
//!    the start-up in a container (`ctr run`, runc);
//! 6. and 7. the same with the converted image (without, then with, the prefetch list)
//!    and the Tessera agent as containerd's snapshotter: nothing is downloaded at pull.
//!
//! The start-up is the image's own `/app/start.py` run with `chroot` in an overlay
//! whose lower layer is what each method produced (a directory, containerd's snapshot,
//! the lazy mount): the same program on the same kind of root for every method. Every
//! repetition is cold: new caches, new containerd, the page cache dropped. Prints a
//! Markdown table (median seconds, ratios against the baseline) and, with
//! `TESSERA_BENCH_JSON=FILE`, writes the figures as JSON.
//!
//! The image is `benches/image.sh`'s (~1 GB: Debian + a Python data stack), built once
//! and cached (`TESSERA_BENCH_IMAGE_DIR` names another build);
//! `TESSERA_BENCH_IMAGE_SMALL=1` uses its smoke-size variant. Knobs:
//! `TESSERA_BENCH_LAZY_CAP` (registry egress, default `200mbit`),
//! `TESSERA_BENCH_REPS` (default 3), `TESSERA_BENCH_LAZY_AGENT_CONFIG` (TOML added to
//! the agents' config, for experiments), `TESSERA_BENCH_LAZY_CONVERT_ARGS` (more
//! `tessera convert` arguments, e.g. `--chunk-size 256K`), `TESSERA_BENCH_LAZY_ONLY` (run only the
//! methods whose name contains it, e.g. `tessera`, for experiments: no ratios, no
//! JSON without the baseline). `make bench-lazy-start` (root).

#![allow(clippy::unwrap_used)] // A benchmark fails loudly.

#[path = "../agent/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use support::agent::AgentProcess;
use support::containerd::{plain_http_hosts, Containerd, PullOptions, Snapshotter};
use support::cri::cri_pull;
use support::netns::{Cluster, NetHost};
use support::oci::run_output as run;
use support::registry::Registry;
use support::{repo_root, s, tessera};

/// The benchmark image's OCI layout (built by `benches/image.sh` if not cached).
fn image_layout() -> (PathBuf, u64, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(repo_root().join("benches/image.sh"));
    // An image built before (benches/image.sh DIR) instead of the cached default.
    if let Some(dir) = std::env::var_os("TESSERA_BENCH_IMAGE_DIR") {
        cmd.arg(dir);
    }
    let out = run(&mut cmd);
    let dir = PathBuf::from(out.trim());
    let unpacked = std::fs::read_to_string(dir.join("unpacked-bytes"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let description = std::fs::read_to_string(dir.join("description"))
        .unwrap_or_default()
        .trim()
        .to_string();
    (dir.join("layout"), unpacked, description)
}

/// Empties the page cache, so a repetition reads from disk as a cold node would.
fn drop_caches() {
    let _ = Command::new("sync").status();
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Runs the image's start-up in an overlay over `lower` (read-only for every method);
/// returns how long it took.
fn start_up(lower: &Path, work: &Path) -> Duration {
    let [upper, scratch, merged] = ["upper", "scratch", "merged"].map(|d| work.join(d));
    for d in [&upper, &scratch, &merged] {
        std::fs::create_dir_all(d).unwrap();
    }
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        scratch.display()
    );
    run(Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged));
    let started = Instant::now();
    let out = Command::new("chroot")
        .arg(&merged)
        .args(["/usr/bin/python3", "/app/start.py"])
        .env_clear()
        .env("HOME", "/tmp")
        .env("MPLCONFIGDIR", "/tmp/matplotlib")
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .unwrap();
    let took = started.elapsed();
    let _ = Command::new("umount").arg(&merged).status();
    assert!(
        out.status.success(),
        "start-up failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

struct Bed {
    _cluster: Cluster,
    registry_host: NetHost,
    node: NetHost,
    registry: Registry,
    /// `[registry] insecure` for the agents and convert.
    config: PathBuf,
    work: tempfile::TempDir,
}

impl Bed {
    fn reference(&self, tag: &str) -> String {
        format!("{}/bench/app:{tag}", self.registry.addr)
    }

    fn convert(&self, src: &str, dst: &str, extra: &[&str]) {
        let knob = std::env::var("TESSERA_BENCH_LAZY_CONVERT_ARGS").unwrap_or_default();
        run(tessera()
            .args(["convert", "--config", s(&self.config)])
            .args(knob.split_whitespace())
            .args(extra)
            .args([&self.reference(src), &self.reference(dst)])
            .env("DOCKER_CONFIG", self.work.path()));
    }

    /// A fresh agent on the node, its cache empty.
    fn agent(&self, name: &str) -> AgentProcess {
        AgentProcess::start_in(
            &self.work.path().join(name),
            &self.node,
            &["--config", s(&self.config)],
        )
    }
}

/// One method's phases, in seconds.
#[derive(Default, Clone)]
struct Timing {
    fetch: f64,
    start: f64,
    origin: u64,
    /// Time FUSE reads waited for data during the start-up (the agent's
    /// `tessera_agent_fuse_read_seconds` sum): where a lazy start's time goes.
    read_wait: Option<f64>,
}

impl Timing {
    fn total(&self) -> f64 {
        self.fetch + self.start
    }
}

fn skopeo_umoci(bed: &Bed, rep: usize) -> Timing {
    let dir = bed.work.path().join(format!("skopeo-{rep}"));
    std::fs::create_dir_all(&dir).unwrap();
    let before = bed.registry_host.tx_bytes();
    let t = Instant::now();
    run(Command::new("skopeo")
        .args(["copy", "-q", "--insecure-policy", "--src-tls-verify=false"])
        .arg(format!("docker://{}", bed.reference("v1")))
        .arg(format!("oci:{}:v1", dir.join("layout").display())));
    run(Command::new("umoci")
        .args(["unpack", "--image"])
        .arg(format!("{}:v1", dir.join("layout").display()))
        .arg(dir.join("bundle")));
    let fetch = t.elapsed().as_secs_f64();
    let origin = bed.registry_host.tx_bytes() - before;
    let start = start_up(&dir.join("bundle/rootfs"), &dir.join("run")).as_secs_f64();
    let _ = std::fs::remove_dir_all(&dir);
    Timing {
        fetch,
        start,
        origin,
        read_wait: None,
    }
}

fn ctr_pull(bed: &Bed, rep: usize) -> Timing {
    let dir = bed.work.path().join(format!("containerd-{rep}"));
    let containerd = Containerd::start_in(&dir, &bed.node);
    let before = bed.registry_host.tx_bytes();
    let t = Instant::now();
    containerd.pull_ok(&bed.reference("v1"), &PullOptions::plain_http());
    let fetch = t.elapsed().as_secs_f64();
    let origin = bed.registry_host.tx_bytes() - before;
    let rootfs = dir.join("rootfs");
    containerd.rootfs(&bed.reference("v1"), &rootfs);
    let start = start_up(&rootfs, &dir.join("run")).as_secs_f64();
    containerd.unmount(&rootfs);
    drop(containerd);
    let _ = std::fs::remove_dir_all(&dir);
    Timing {
        fetch,
        start,
        origin,
        read_wait: None,
    }
}

fn tessera_mount(bed: &Bed, tag: &str, rep: usize) -> Timing {
    let name = format!("agent-{tag}-{rep}");
    let agent = bed.agent(&name);
    let mnt = bed.work.path().join(&name).join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let before = bed.registry_host.tx_bytes();
    let t = Instant::now();
    agent.ok(&["mount", &bed.reference(tag), s(&mnt)]);
    let fetch = t.elapsed().as_secs_f64();
    let start = start_up(&mnt, &bed.work.path().join(&name).join("run")).as_secs_f64();
    let origin = bed.registry_host.tx_bytes() - before;
    let read_wait = agent.fuse_read_seconds();
    agent.ok(&["umount", s(&mnt)]);
    drop(agent);
    let _ = std::fs::remove_dir_all(bed.work.path().join(&name));
    Timing {
        fetch,
        start,
        origin,
        read_wait,
    }
}

/// The Kubernetes path: the image pulled through containerd's CRI image service (as
/// the kubelet pulls), then the start-up as a container (`ctr run`, runc) from it;
/// with the CRI plugin's default snapshotter (overlayfs: containerd downloads and
/// unpacks every layer) or the Tessera agent's (the converted image is mounted).
fn cri_run(bed: &Bed, tag: &str, tessera_snapshotter: bool, rep: usize) -> Timing {
    let kind = if tessera_snapshotter {
        "tessera"
    } else {
        "overlayfs"
    };
    let name = format!("cri-{kind}-{rep}");
    let dir = bed.work.path().join(&name);
    let hosts = dir.join("certs.d");
    plain_http_hosts(&hosts, &bed.registry.addr);
    let socket = dir.join("agent/snap.sock");
    let agent = tessera_snapshotter.then(|| {
        let agent = AgentProcess::start_in(
            &dir.join("agent"),
            &bed.node,
            &[
                "--config",
                s(&bed.config),
                "--snapshotter-socket",
                s(&socket),
                "--snapshotter-root",
                s(&dir.join("agent/snapshotter")),
            ],
        );
        agent.wait_for_socket(&socket);
        agent
    });
    let snapshotter = if tessera_snapshotter {
        Snapshotter::Tessera
    } else {
        Snapshotter::Overlayfs
    };
    let proxy = socket.clone();
    let containerd = Containerd::start_cri(
        &dir.join("containerd"),
        Some(&bed.node),
        snapshotter,
        &hosts,
        move |config| {
            if tessera_snapshotter {
                run(tessera()
                    .args(["containerd-config", "--snapshotter-socket", s(&proxy)])
                    .args(["--containerd-config", s(config)]));
            }
        },
    );
    let reference = bed.reference(tag);
    let before = bed.registry_host.tx_bytes();
    let t = Instant::now();
    cri_pull(&containerd, &reference)
        .unwrap_or_else(|e| panic!("CRI pull: {e}\n{}", containerd.log()));
    let fetch = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let out = containerd.ctr_k8s(&[
        "run",
        "--rm",
        "--snapshotter",
        snapshotter.name(),
        "--env",
        "HOME=/tmp",
        "--env",
        "MPLCONFIGDIR=/tmp/matplotlib",
        "--env",
        "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
        &reference,
        &name,
        "/usr/bin/python3",
        "/app/start.py",
    ]);
    let start = t.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "the start-up in a container failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let origin = bed.registry_host.tx_bytes() - before;
    let read_wait = agent.as_ref().and_then(AgentProcess::fuse_read_seconds);
    drop(containerd);
    drop(agent);
    let _ = std::fs::remove_dir_all(&dir);
    Timing {
        fetch,
        start,
        origin,
        read_wait,
    }
}

/// Seconds a link of `cap` (`200mbit`, `1gbit`, `800kbit`) needs for `bytes`: the
/// least time any method can fetch them in.
fn link_seconds(bytes: f64, cap: &str) -> f64 {
    let (number, unit) = cap.split_at(cap.find(|c: char| c.is_alphabetic()).unwrap_or(cap.len()));
    let scale = match unit {
        "kbit" => 1e3,
        "mbit" => 1e6,
        "gbit" => 1e9,
        other => panic!("TESSERA_BENCH_LAZY_CAP: unit {other:?} (kbit, mbit or gbit)"),
    };
    bytes * 8.0
        / (number
            .parse::<f64>()
            .expect("TESSERA_BENCH_LAZY_CAP: a rate")
            * scale)
}

/// The Kubernetes baseline's name (benches/scenarios/lazy_start.py compares the
/// snapshotter's rows with it).
const CRI_OVERLAYFS: &str = "containerd CRI pull + container (overlayfs)";

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let env = |name: &str, default: &str| std::env::var(name).unwrap_or_else(|_| default.into());
    let cap = env("TESSERA_BENCH_LAZY_CAP", "200mbit");
    let reps: usize = env("TESSERA_BENCH_REPS", "3")
        .parse()
        .expect("TESSERA_BENCH_REPS: a number");
    let (layout, unpacked, description) = image_layout();

    let mut cluster = Cluster::new();
    let registry_host = cluster.add_host("registry");
    let node = cluster.add_host("node");
    let registry = Registry::start_in(&registry_host);
    let work = tempfile::tempdir().unwrap();
    let config = work.path().join("tessera.toml");
    // Extra agent configuration for experiments (TOML, e.g. "[fetch]\nmerge_bytes = 0").
    let extra = std::env::var("TESSERA_BENCH_LAZY_AGENT_CONFIG").unwrap_or_default();
    std::fs::write(
        &config,
        format!("{extra}\n[registry]\ninsecure = [\"{}\"]\n", registry.addr),
    )
    .unwrap();
    let bed = Bed {
        _cluster: cluster,
        registry_host,
        node,
        registry,
        config,
        work,
    };
    bed.registry.push_layout(&layout, "v1", "bench/app");
    bed.convert("v1", "v1-tessera", &[]);
    // The start-up's files, in first-read order, recorded through a lazy mount.
    let record = bed.work.path().join("startup.txt");
    {
        let agent = bed.agent("record");
        let mnt = bed.work.path().join("record/mnt");
        std::fs::create_dir_all(&mnt).unwrap();
        agent.ok(&[
            "mount",
            &bed.reference("v1-tessera"),
            s(&mnt),
            "--record",
            s(&record),
        ]);
        start_up(&mnt, &bed.work.path().join("record/run"));
        agent.ok(&["umount", s(&mnt)]);
    }
    let recorded = std::fs::read_to_string(&record).unwrap().lines().count();
    bed.convert("v1", "v1-prefetch", &["--prefetch-list", s(&record)]);
    // Capped only now: setting up is not what is measured.
    bed.registry_host.cap_egress(&cap);

    let methods: [(&str, &dyn Fn(usize) -> Timing); 7] = [
        ("skopeo copy + umoci unpack", &|rep| skopeo_umoci(&bed, rep)),
        ("ctr image pull", &|rep| ctr_pull(&bed, rep)),
        ("tessera mount (cold)", &|rep| {
            tessera_mount(&bed, "v1-tessera", rep)
        }),
        ("tessera mount + prefetch list", &|rep| {
            tessera_mount(&bed, "v1-prefetch", rep)
        }),
        (CRI_OVERLAYFS, &|rep| cri_run(&bed, "v1", false, rep)),
        ("tessera snapshotter: CRI pull + container", &|rep| {
            cri_run(&bed, "v1-tessera", true, rep)
        }),
        (
            "tessera snapshotter + prefetch list: CRI pull + container",
            &|rep| cri_run(&bed, "v1-prefetch", true, rep),
        ),
    ];
    let only = std::env::var("TESSERA_BENCH_LAZY_ONLY").unwrap_or_default();
    let methods: Vec<_> = methods
        .into_iter()
        .filter(|(label, _)| label.contains(only.as_str()))
        .collect();
    let with_baseline = only.is_empty();
    let mut runs: Vec<Vec<Timing>> = vec![Vec::new(); methods.len()];
    // Interleaved, so a machine that slows down slows every method alike.
    for rep in 0..reps {
        for (i, (_, method)) in methods.iter().enumerate() {
            drop_caches();
            runs[i].push(method(rep));
        }
    }
    let summary: Vec<(f64, f64, f64, f64)> = runs
        .iter()
        .map(|r| {
            (
                median(r.iter().map(|t| t.fetch).collect()),
                median(r.iter().map(|t| t.start).collect()),
                median(r.iter().map(Timing::total).collect()),
                median(r.iter().map(|t| t.origin as f64).collect()),
            )
        })
        .collect();
    let read_waits: Vec<Option<f64>> = runs
        .iter()
        .map(|r| {
            let waits: Vec<f64> = r.iter().filter_map(|t| t.read_wait).collect();
            (!waits.is_empty()).then(|| median(waits))
        })
        .collect();
    let baseline = if with_baseline {
        summary[0].2
    } else {
        f64::NAN
    };
    let mib = |b: f64| b / f64::from(1 << 20);
    println!(
        "lazy start: a {:.0} MiB image ({description}), registry egress capped at {cap}, median of {reps}; the start-up reads {recorded} files",
        mib(unpacked as f64)
    );
    println!(
        "| method | fetch / mount s | start-up s | total s | vs skopeo+umoci | registry sent |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for ((label, _), (fetch, start, total, origin)) in methods.iter().zip(&summary) {
        println!(
            "| {label} | {fetch:.2} | {start:.2} | {total:.2} | {:.2}x | {:.1} MiB |",
            baseline / total.max(1e-9),
            mib(*origin)
        );
    }
    println!("ratio: baseline total / this total (above 1: faster than skopeo + umoci)");
    for (((label, _), (_, start, _, origin)), wait) in methods.iter().zip(&summary).zip(&read_waits)
    {
        if let Some(wait) = wait {
            println!(
                "{label}: the start-up waited {wait:.2} s of its {start:.2} s for data; the capped link needs {:.2} s for the {:.1} MiB sent",
                link_seconds(*origin, &cap),
                mib(*origin)
            );
        }
    }
    if let (Ok(path), true) = (std::env::var("TESSERA_BENCH_JSON"), with_baseline) {
        let rows: Vec<serde_json::Value> = methods
            .iter()
            .zip(&summary)
            .zip(&read_waits)
            .map(|(((label, _), (fetch, start, total, origin)), wait)| {
                let mut row = serde_json::json!({
                    "method": label,
                    "fetch_seconds": fetch,
                    "start_seconds": start,
                    "total_seconds": total,
                    "vs_baseline": baseline / total.max(1e-9),
                    "registry_bytes": origin,
                    "link_seconds": link_seconds(*origin, &cap),
                });
                if let Some(wait) = wait {
                    row["read_wait_seconds"] = serde_json::json!(wait);
                }
                row
            })
            .collect();
        let json = serde_json::json!({
            "scenario": "lazy_start",
            "image": description,
            "image_unpacked_bytes": unpacked,
            "registry_cap": cap,
            "repetitions": reps,
            "startup_files": recorded,
            "rows": rows,
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    }
}
