//! A node as `tessera run` and `tessera checkpoint --container` use it: an agent serving
//! the Tessera snapshotter and a containerd (CRI plugin, runc) on it, both in a
//! [`NetHost`]'s network namespace. The container-restore test and the restore
//! benchmark start their nodes so.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::agent::AgentProcess;
use super::containerd::{plain_http_hosts, Containerd, Snapshotter, NAMESPACE};
use super::netns::NetHost;
use super::s;

/// An agent with its snapshotter, and containerd on it. Fields drop in order:
/// containerd before the agent it mounts through.
pub struct TesseraNode {
    pub containerd: Containerd,
    pub agent: AgentProcess,
    pub host: NetHost,
    /// The agent's, containerd's and `tessera run`'s files.
    pub dir: PathBuf,
}

impl TesseraNode {
    /// Starts the agent in `host` with `agent_args` (its `--config` among them) and
    /// the snapshotter under `dir`, then containerd on it, reaching `registry`
    /// (`host:port`) over plain HTTP.
    pub fn start(dir: &Path, host: &NetHost, registry: &str, agent_args: &[&str]) -> TesseraNode {
        let (socket, root) = (dir.join("agent/snap.sock"), dir.join("agent/snapshotter"));
        let snapshotter = [
            "--snapshotter-socket",
            s(&socket),
            "--snapshotter-root",
            s(&root),
        ];
        let agent = AgentProcess::start_in(
            &dir.join("agent"),
            host,
            &[&snapshotter[..], agent_args].concat(),
        );
        agent.wait_for_socket(&socket);
        let containerd = containerd_in(dir, host, registry, Some(&socket));
        TesseraNode {
            containerd,
            agent,
            host: host.clone(),
            dir: dir.to_path_buf(),
        }
    }

    /// `tessera run --json` against this node, in its network namespace: the agent's
    /// and containerd's sockets, containerd's test namespace, `config`, `criu`, and a
    /// state dir under the node's; `args` add the image, the id and any flag.
    pub fn run_command(&self, config: &Path, criu: &Path, args: &[&str]) -> Command {
        let mut cmd = self.host.command(env!("CARGO_BIN_EXE_tessera"));
        cmd.args(["run", "--json", "--config", s(config), "--criu", s(criu)])
            .args([
                "--address",
                s(&self.containerd.socket),
                "--namespace",
                NAMESPACE,
            ])
            .args(["--socket", s(&self.agent.socket)])
            .arg("--state-dir")
            .arg(self.dir.join("run"))
            .args(args);
        cmd
    }

    /// Kills container `id` and removes it with its snapshot.
    pub fn remove(&self, id: &str) {
        let _ = self.containerd.ctr(&["task", "kill", "-s", "SIGKILL", id]);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.containerd.ctr(&["task", "rm", id]).status.success() {
            assert!(Instant::now() < deadline, "task {id} is not removed");
            std::thread::sleep(Duration::from_millis(100));
        }
        self.containerd.ctr_ok(&["container", "rm", id]);
    }
}

/// containerd with its CRI plugin and runc in `host`, its files under `dir`, reaching
/// `registry` over plain HTTP; on the Tessera snapshotter at `tessera_socket` (made
/// CRI's as `tessera containerd-config` does), else on overlayfs.
pub fn containerd_in(
    dir: &Path,
    host: &NetHost,
    registry: &str,
    tessera_socket: Option<&Path>,
) -> Containerd {
    let hosts = dir.join("certs.d");
    plain_http_hosts(&hosts, registry);
    let socket = tessera_socket.map(Path::to_path_buf);
    let snapshotter = match socket {
        Some(_) => Snapshotter::Tessera,
        None => Snapshotter::Overlayfs,
    };
    Containerd::start_cri(
        &dir.join("containerd"),
        Some(host),
        snapshotter,
        &hosts,
        move |config| {
            if let Some(socket) = socket {
                super::tessera_ok(&[
                    "containerd-config",
                    "--snapshotter-socket",
                    s(&socket),
                    "--containerd-config",
                    s(config),
                ]);
            }
        },
    )
}
