//! Debian's Podman 4.3 with storage, state and configuration of its own under one
//! directory, optionally with the agent's additional layer store named in its
//! `storage.conf`, and the settings this machine needs
//! (docs/research/podman-additional-layer-store.md §4: ulimits below the sandbox's hard
//! limits, cgroupfs, events to a file, no network namespace set-up). Used by the layer
//! store's test and the lazy-start benchmark's Podman rows.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use super::netns::NetHost;
use super::oci;

/// Podman configured under `dir`. Dropped: its containers and images removed, whatever
/// it left mounted under `dir` detached, also after a failed assertion.
pub struct Podman {
    dir: PathBuf,
    /// Runs in this cluster host's network namespace, if set (the benchmark's node,
    /// behind the capped link).
    host: Option<NetHost>,
}

impl Podman {
    /// Podman with its files under `dir`; `store`: the additional layer store (a
    /// `tessera agent --store-root` mount) its `storage.conf` names, if any. Fails
    /// saying how to install podman when it is missing.
    pub fn new(dir: &Path, store: Option<&Path>) -> Podman {
        Podman::require();
        std::fs::create_dir_all(dir.join("tmp")).expect("podman dir");
        let options = store.map_or_else(String::new, |store| {
            format!(
                "[storage.options]\nadditionallayerstores = [\"{}:ref\"]\n",
                store.display()
            )
        });
        let files = [
            (
                "storage.conf",
                format!(
                    "[storage]\ndriver = \"overlay\"\ngraphroot = \"{0}/storage\"\n\
                     runroot = \"{0}/run\"\n{options}",
                    dir.display()
                ),
            ),
            (
                "containers.conf",
                format!(
                    "[containers]\nnetns = \"none\"\n\
                     default_ulimits = [\"nofile=16384:16384\", \"nproc=32768:32768\"]\n\
                     [engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
                     events_logfile_path = \"{0}/events.log\"\ntmp_dir = \"{0}/tmp\"\n\
                     image_copy_tmp_dir = \"{0}/tmp\"\n",
                    dir.display()
                ),
            ),
            (
                "registries.conf",
                "unqualified-search-registries = []\n".to_string(),
            ),
        ];
        for (name, text) in files {
            std::fs::write(dir.join(name), text).expect("podman config");
        }
        Podman {
            dir: dir.to_path_buf(),
            host: None,
        }
    }

    /// Fails saying how to install podman when it is missing (a benchmark calls it
    /// before its long set-up).
    pub fn require() {
        assert!(
            oci::tool_available("podman"),
            "`podman` not found: run `make test-deps` (apt-get install podman)"
        );
    }

    /// As [`new`](Self::new), every podman command run in `host`'s network namespace.
    pub fn new_in(dir: &Path, store: Option<&Path>, host: &NetHost) -> Podman {
        let mut podman = Podman::new(dir, store);
        podman.host = Some(host.clone());
        podman
    }

    /// `podman ARGS` with this configuration (`podman` alone: the caller adds them).
    pub fn command(&self) -> Command {
        let mut c = match &self.host {
            Some(h) => h.command("podman"),
            None => Command::new("podman"),
        };
        c.env("CONTAINERS_STORAGE_CONF", self.dir.join("storage.conf"))
            .env("CONTAINERS_CONF", self.dir.join("containers.conf"))
            .env(
                "CONTAINERS_REGISTRIES_CONF",
                self.dir.join("registries.conf"),
            );
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command().args(args).output().expect("run podman")
    }

    /// `podman ARGS`' stdout, panicking with its stderr if it fails.
    pub fn ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "podman {args:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }
}

impl Drop for Podman {
    /// Not `podman system reset`: it removes networks too, and a root Podman's network
    /// configurations are this machine's, not this directory's.
    fn drop(&mut self) {
        let _ = self.run(&["rm", "--all", "--force"]);
        let _ = self.run(&["rmi", "--all", "--force"]);
        let table = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut inside: Vec<&str> = table
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|mp| Path::new(mp).starts_with(&self.dir))
            .collect();
        inside.sort_by_key(|mp| std::cmp::Reverse(mp.len()));
        for mp in inside {
            let _ = Command::new("umount").args(["-l", mp]).status();
        }
    }
}
