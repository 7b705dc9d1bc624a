//! The agent's configuration: `agent.toml`, every key with a default so `tessera agent`
//! runs without a file, the same keys overridable by flags and `TESSERA_*` variables
//! (in `commands/agent.rs`), and `validate()` that lists every problem at once.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::registry::credentials::RegistryConfig;
use crate::{Error, Result};

/// Where the daemon listens by default, and where the client commands look for it.
pub const DEFAULT_SOCKET: &str = "/run/tessera/agent.sock";

#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentConfig {
    /// The local API's unix socket (`tessera mount`, `umount`, `status` talk to it).
    pub socket: PathBuf,
    /// Also serve the local API on TCP (`host:port`); requires `api_token_file`.
    pub api_listen: Option<String>,
    /// A file holding the token TCP clients must present (re-read on every request, so
    /// it can be rotated without a restart).
    pub api_token_file: Option<PathBuf>,
    /// TLS for the TCP API: certificate chain and key (PEM). When set, the TCP API
    /// speaks only TLS, so the token never crosses the network in the clear.
    pub api_tls_cert: Option<PathBuf>,
    pub api_tls_key: Option<PathBuf>,
    /// Verified chunks, kept across restarts.
    pub cache_dir: PathBuf,
    /// Bytes the cache may hold (`10G`, `512M`, or a number); least recently used
    /// chunks are evicted beyond it.
    #[serde(with = "size")]
    pub cache_capacity: u64,
    /// When the filesystem holding the cache (often shared with the node) is more than
    /// this percent full, the cache evicts chunks no mounted image pins, least recently
    /// used first, until it is below `cache_disk_low_percent`. 100: off (only
    /// `cache_capacity` bounds the cache).
    pub cache_disk_high_percent: u8,
    pub cache_disk_low_percent: u8,
    /// Prometheus metrics (`/metrics`) on this address, if set.
    pub metrics_listen: Option<String>,
    /// What to fetch in the background after a mount.
    pub prefetch: Prefetch,
    /// On SIGTERM or SIGINT, how long reads in flight may go on before what is left
    /// fails with EIO and the agent unmounts and exits (seconds).
    pub shutdown_grace_secs: u64,
    /// FUSE passthrough (Linux 6.9+): a file whose data is all in the cache is read by
    /// the kernel straight from disk, at the disk's speed. Files of several chunks get a
    /// copy for it (within `cache_capacity`, at most a quarter of it).
    pub passthrough: bool,
    pub scrub: ScrubConfig,
    pub fetch: FetchConfig,
    pub p2p: P2pConfig,
    pub mirror: MirrorConfig,
    pub snapshotter: SnapshotterConfig,
    /// Serve containers/storage's additional layer store (Podman, Buildah, CRI-O) at
    /// this directory: `additionallayerstores = ["PATH:ref"]` in `storage.conf`. Off
    /// when unset.
    pub store_root: Option<PathBuf>,
    pub cri: CriConfig,
    pub connections: ConnectionsConfig,
    #[serde(skip_serializing)]
    pub registry: RegistryConfig,
}

/// The containerd snapshotter (`[proxy_plugins.tessera]` in containerd's config names
/// its socket; `tessera containerd-config --snapshotter` writes that).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct SnapshotterConfig {
    /// Serve containerd's snapshots API on this unix socket; off when unset.
    pub socket: Option<PathBuf>,
    /// Snapshot metadata and directories (layers unpacked by containerd, containers'
    /// writable layers, Tessera images' mount points). Kept across restarts.
    pub root: PathBuf,
}

impl Default for SnapshotterConfig {
    fn default() -> Self {
        SnapshotterConfig {
            socket: None,
            root: PathBuf::from("/var/lib/tessera/snapshotter"),
        }
    }
}

/// The CRI image-service proxy: the kubelet's `--image-service-endpoint` names its
/// socket, every call goes on to containerd unchanged, and the credentials of each
/// `PullImage` (the pod's pull secrets) stay in the agent's memory for that image's
/// repository, for its lazy mounts.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct CriConfig {
    /// Serve CRI's image service on this unix socket; off when unset.
    pub listen: Option<PathBuf>,
    /// containerd's socket, where every call goes on to.
    pub containerd: PathBuf,
    /// Keep the pulls' credentials across an agent restart in this file (opt-in; off
    /// when unset): written only by root, readable only by root (mode 0600), as the
    /// kubelet keeps `/var/lib/kubelet/config.json`. Not encrypted: the key would have
    /// to sit on the same disk for the agent to read it after a restart.
    pub credentials_file: Option<PathBuf>,
}

impl Default for CriConfig {
    fn default() -> Self {
        CriConfig {
            listen: None,
            containerd: PathBuf::from("/run/containerd/containerd.sock"),
            credentials_file: None,
        }
    }
}

/// What every listener of the agent (peer port, mirror, local API, metrics,
/// snapshotter) lets clients hold: no client, idle or hostile, may take the agent's
/// descriptors.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConnectionsConfig {
    /// Connections each listener holds at once; one past it is closed at once (counted
    /// in `tessera_agent_connections_refused_total`). 0: derived from the open-file
    /// limit, keeping a quarter of it for the cache, FUSE and outgoing connections.
    pub per_listener: usize,
    /// A connection that sends nothing for this long is closed; on HTTP/1 listeners
    /// also one whose request head takes longer, or that sits idle between requests
    /// (seconds). The local API allows at most 5 s for its one-line request.
    pub idle_timeout_secs: u64,
    /// gRPC connections (the peer port) are closed gracefully at this age; clients
    /// reconnect (seconds).
    pub max_age_secs: u64,
    /// Requests (gRPC streams) at once on one peer connection.
    pub streams_per_connection: u32,
}

impl Default for ConnectionsConfig {
    fn default() -> Self {
        ConnectionsConfig {
            per_listener: 0,
            idle_timeout_secs: 30,
            max_age_secs: 600,
            streams_per_connection: 256,
        }
    }
}

/// The registry mirror containerd pulls through (`tessera containerd-config` names it
/// in containerd's `hosts.toml`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct MirrorConfig {
    /// Serve the mirror on this address (`127.0.0.1:7082`); off when unset.
    pub listen: Option<String>,
    /// The upstream for requests without containerd's `ns` parameter.
    pub default_registry: String,
    /// How long a blob waits for another agent's origin fetch of it before fetching it
    /// from the origin too (a whole layer can take minutes on a slow link).
    pub max_wait_secs: u64,
    /// How long the upstream's "yes, these credentials may read this blob" is trusted.
    pub access_ttl_secs: u64,
    /// How long a manifest fetched by digest is kept (per credential).
    pub manifest_ttl_secs: u64,
    /// Tags are resolved at the upstream on every pull (a tag can move). With this set,
    /// while the upstream cannot be reached (no connection, or a 5xx after retries),
    /// the mirror answers from what it last said to the same credential within this
    /// many seconds: a tag's digest, manifests by digest, its yes to reading a blob. So
    /// nodes start from the swarm while the registry is down. 0: off.
    pub last_known_secs: u64,
}

impl Default for MirrorConfig {
    fn default() -> Self {
        MirrorConfig {
            listen: None,
            default_registry: "docker.io".to_string(),
            max_wait_secs: 300,
            access_ttl_secs: 60,
            manifest_ttl_secs: 300,
            last_known_secs: 0,
        }
    }
}

/// Peer-to-peer: the scheduler to join, the peer service other agents fetch from, and
/// how long to wait for peers. P2P is on when `scheduler` is set and `enabled` is true.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct P2pConfig {
    /// `false` (`--no-p2p`): every missing chunk comes from the origin, and nothing is
    /// served to peers — for comparisons and for nodes that must not upload.
    pub enabled: bool,
    /// The scheduler's URL (`http://host:port`), or several replicas' URLs separated
    /// by commas: the same list, in any order, on every agent (blobs are placed on
    /// replicas by hashing over it).
    pub scheduler: Option<String>,
    /// Where this agent's peer service listens.
    pub peer_listen: String,
    /// `host:port` other agents reach the peer service at; needed when `peer_listen`
    /// is a wildcard address.
    pub advertise: Option<String>,
    /// This host's id in the swarm (e.g. the Kubernetes node name); default: the
    /// hostname and the advertised address.
    pub host_id: Option<String>,
    /// Topology labels: peers in the same zone (then rack) are preferred.
    pub zone: Option<String>,
    pub rack: Option<String>,
    /// A file holding the bearer token the scheduler and peers require (the same on
    /// every agent and the scheduler).
    pub token_file: Option<PathBuf>,
    /// TLS: the CA certificate (PEM) that signed the scheduler's and the peers'
    /// certificates. Needed for an `https://` scheduler and for peer TLS.
    pub tls_ca: Option<PathBuf>,
    /// TLS for the peer service: this agent's certificate and key (PEM). When set, the
    /// peer service speaks only TLS and this agent dials peers with TLS too, so set it
    /// on every agent or none.
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// The name peers' certificates are checked against (peers are dialled by IP; a
    /// cluster-wide peer certificate usually carries one DNS name). Default: the IP.
    pub tls_server_name: Option<String>,
    /// Uploads served to peers at once.
    pub max_uploads: u32,
    /// Send chunks to peers zstd-compressed: `auto` when `upload_bytes_per_sec` is set
    /// (the link is the limit, not the CPU), `always`, or `never`. Cached chunks are
    /// stored uncompressed (reads take any part of them), so this compresses per upload.
    pub compress_uploads: CompressUploads,
    /// Upload bandwidth to peers (`100M` bytes per second; 0: unlimited).
    #[serde(with = "size")]
    pub upload_bytes_per_sec: u64,
    /// Milliseconds a peer may take to connect or between two chunks before it is
    /// abandoned (and reported) for another source.
    pub peer_timeout_ms: u64,
    /// Seconds a read may go without progress (rests between rounds whose holders were
    /// all busy) before fetching its chunks from the origin itself. Waiting for another
    /// agent's origin fetch the scheduler still sees alive is progress, bounded only by
    /// 15 times this in all (agent/src/fetch/peers.rs).
    pub max_wait_secs: u64,
    /// Test-only fault switch: serve peers corrupted bytes (to test that requesters
    /// verify, report and exclude such a peer). Never set it in production.
    pub fault_corrupt_uploads: bool,
}

impl Default for P2pConfig {
    fn default() -> Self {
        P2pConfig {
            enabled: true,
            scheduler: None,
            peer_listen: "0.0.0.0:7081".to_string(),
            advertise: None,
            host_id: None,
            zone: None,
            rack: None,
            token_file: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            tls_server_name: None,
            max_uploads: 32,
            compress_uploads: CompressUploads::Auto,
            upload_bytes_per_sec: 0,
            peer_timeout_ms: 3000,
            max_wait_secs: 20,
            fault_corrupt_uploads: false,
        }
    }
}

impl P2pConfig {
    /// Whether this agent joins a swarm.
    pub fn active(&self) -> bool {
        self.enabled && self.scheduler.is_some()
    }

    /// The address peers reach this agent at.
    pub fn advertised(&self) -> Option<std::net::SocketAddr> {
        match &self.advertise {
            Some(a) => a.parse().ok(),
            None => self
                .peer_listen
                .parse::<std::net::SocketAddr>()
                .ok()
                .filter(|a| !a.ip().is_unspecified()),
        }
    }

    /// The scheduler replicas' URLs, sorted (so the order in the setting does not
    /// matter) and without repeats.
    pub fn scheduler_urls(&self) -> Vec<String> {
        let mut urls: Vec<String> = self
            .scheduler
            .as_deref()
            .unwrap_or("")
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_string())
            .filter(|u| !u.is_empty())
            .collect();
        urls.sort();
        urls.dedup();
        urls
    }

    fn problems(&self, problems: &mut Vec<String>) {
        if !self.active() {
            return;
        }
        for url in self.scheduler_urls() {
            if !(url.starts_with("http://") || url.starts_with("https://")) {
                problems.push(format!(
                    "p2p.scheduler: {url:?} is not a URL like http://scheduler:7080"
                ));
            }
        }
        if self.scheduler.is_some() && self.scheduler_urls().is_empty() {
            problems.push("p2p.scheduler: no URL in it".to_string());
        }
        if self.peer_listen.parse::<std::net::SocketAddr>().is_err() {
            problems.push(format!(
                "p2p.peer_listen: {:?} is not host:port (e.g. 0.0.0.0:7081)",
                self.peer_listen
            ));
        }
        match &self.advertise {
            Some(a) if a.parse::<std::net::SocketAddr>().is_err() => problems.push(format!(
                "p2p.advertise: {a:?} is not ip:port (the address other nodes reach this one at)"
            )),
            None if self.advertised().is_none() => problems.push(
                "p2p.advertise: needed when p2p.peer_listen is a wildcard address: the ip:port other nodes reach this one at"
                    .to_string(),
            ),
            _ => {}
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            problems.push("p2p.tls_cert, p2p.tls_key: set both or neither".to_string());
        }
        let https = self
            .scheduler_urls()
            .iter()
            .any(|u| u.starts_with("https://"));
        if (self.tls_cert.is_some() || https) && self.tls_ca.is_none() {
            problems.push(
                "p2p.tls_ca: needed to verify an https:// scheduler and TLS peers".to_string(),
            );
        }
        if self.max_uploads == 0 {
            problems.push("p2p.max_uploads: at least 1".to_string());
        }
        if self.peer_timeout_ms < 10 {
            problems.push("p2p.peer_timeout_ms: at least 10".to_string());
        }
    }
}

/// Background fetching after a mount.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Prefetch {
    /// Nothing: only what is read.
    None,
    /// The image's prefetch list (`--prefetch-list` at build time).
    List,
    /// The prefetch list first, then every other chunk of the image.
    All,
}

/// When uploads to peers are compressed (`p2p.compress_uploads`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CompressUploads {
    Auto,
    Always,
    Never,
}

/// The background scrub: cached chunks are verified when they enter the cache and
/// trusted after (shared/MISSION.md); the scrub re-reads every one at a bounded rate and
/// drops what no longer matches its digest (disk rot, a tampered file).
/// `tessera cache verify` does the same at once, at full speed.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct ScrubConfig {
    /// Bytes read per second (`16M`); 0 turns the scrub off.
    #[serde(with = "size")]
    pub bytes_per_sec: u64,
    /// Hours from the start of one pass to the next (the first starts this long after
    /// the agent does, so restarts do not re-read the disk).
    pub every_hours: u64,
}

impl Default for ScrubConfig {
    fn default() -> Self {
        ScrubConfig {
            bytes_per_sec: 16 << 20,
            every_hours: 24,
        }
    }
}

/// How chunks are fetched.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct FetchConfig {
    /// Adjacent missing chunks of a blob are fetched in one Range request up to this
    /// many bytes (the requested chunk is always fetched whole). 256K: small files
    /// that sit together are fetched together, but a start-up is not sent megabytes
    /// of neighbours it will not read (on the lazy-start benchmark, 1M sent 137 MiB
    /// and took 7.7 s, 256K 103 MiB and 6.7 s).
    #[serde(with = "size")]
    pub merge_bytes: u64,
    /// When a file is read sequentially, its next chunks up to this many bytes are
    /// fetched in the background (0: off), so the network works while the reader reads.
    /// 16M: a cold sequential read behind a 1 Gbit/s link ran at 0.83x curl's speed
    /// with 8M and 0.96x with 16M (32M no better); start-ups fetch the same bytes.
    #[serde(with = "size")]
    pub readahead_bytes: u64,
    /// Attempts at a chunk (each already retried by the registry client) before a read
    /// fails with EIO.
    pub attempts: u32,
    /// Seconds a registry request may wait for headers or stall in a body.
    pub timeout_secs: u64,
    /// Retries of one registry request (5xx, 429, resets).
    pub retries: u32,
    /// Threads serving FUSE reads of each mount.
    pub workers: usize,
    /// Requests a prefetch or preheat keeps in flight at once (on-demand reads are
    /// never limited by it). 8: in a swarm each request's slices come from up to 4
    /// peers that each share their uplink among up to 32 downloads, so filling one
    /// node's downlink takes many sources at once (the swarm simulation, Kraken's
    /// set-up at 260 nodes: p99 32 s with 2, 23 s with 4, 16 s with 8).
    pub prefetch_concurrency: usize,
    /// A prefetch or preheat fetches missing neighbours together up to this many bytes
    /// per request (a reader's misses use `merge_bytes`): a prefetch list arrives in a
    /// few large requests, and reads of its chunks wait for them.
    #[serde(with = "size")]
    pub stream_bytes: u64,
    /// Recently read chunks kept in memory (the kernel reads a chunk in several
    /// requests; each should not cost a disk read and a digest).
    #[serde(with = "size")]
    pub memory_bytes: u64,
    /// A FUSE read that waits longer than this for its data is a *slow read*: counted
    /// (`tessera_agent_slow_reads_total`, `slow_reads` in `tessera status`) and logged.
    pub slow_read_ms: u64,
}

impl Default for FetchConfig {
    fn default() -> Self {
        FetchConfig {
            merge_bytes: 256 << 10,
            readahead_bytes: 16 << 20,
            attempts: 3,
            timeout_secs: 30,
            retries: 4,
            workers: 16,
            prefetch_concurrency: 8,
            stream_bytes: 4 << 20,
            memory_bytes: 64 << 20,
            slow_read_ms: 1000,
        }
    }
}

impl Default for AgentConfig {
    fn default() -> Self {
        AgentConfig {
            socket: PathBuf::from(DEFAULT_SOCKET),
            api_listen: None,
            api_token_file: None,
            api_tls_cert: None,
            api_tls_key: None,
            cache_dir: PathBuf::from("/var/lib/tessera/cache"),
            cache_capacity: 10 << 30,
            cache_disk_high_percent: 90,
            cache_disk_low_percent: 80,
            metrics_listen: None,
            prefetch: Prefetch::List,
            shutdown_grace_secs: 10,
            passthrough: true,
            scrub: ScrubConfig::default(),
            fetch: FetchConfig::default(),
            p2p: P2pConfig::default(),
            mirror: MirrorConfig::default(),
            snapshotter: SnapshotterConfig::default(),
            store_root: None,
            cri: CriConfig::default(),
            connections: ConnectionsConfig::default(),
            registry: RegistryConfig::default(),
        }
    }
}

impl AgentConfig {
    /// Reads `agent.toml`; unknown keys are errors (a typo must not be ignored).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("read config", path, e))?;
        toml::from_str(&text).map_err(|e| Error::Config {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })
    }

    /// Every problem with the configuration, each saying which key and why.
    pub fn validate(&self) -> std::result::Result<(), Vec<String>> {
        let mut problems = Vec::new();
        if self.socket.as_os_str().is_empty() {
            problems.push("socket: must be a path".to_string());
        }
        if self.cache_capacity < 16 << 20 {
            problems.push(format!(
                "cache_capacity: {} bytes is less than the 16 MiB one large chunk needs",
                self.cache_capacity
            ));
        }
        let (high, low) = (self.cache_disk_high_percent, self.cache_disk_low_percent);
        if high > 100 || low == 0 || low >= high {
            problems.push(format!(
                "cache_disk_high_percent, cache_disk_low_percent: {high} and {low}; need 0 < low < high <= 100"
            ));
        }
        if self.scrub.bytes_per_sec > 0 && self.scrub.every_hours == 0 {
            problems.push(
                "scrub.every_hours: must be at least 1 (or scrub.bytes_per_sec 0: off)".to_string(),
            );
        }
        if self.api_tls_cert.is_some() != self.api_tls_key.is_some() {
            problems.push("api_tls_cert, api_tls_key: set both or neither".to_string());
        }
        if let Some(root) = self.store_root.as_ref().filter(|r| !r.is_absolute()) {
            problems.push(format!(
                "store_root: {} is not an absolute path (storage.conf's additionallayerstores must name it so)",
                root.display()
            ));
        }
        let c = &self.connections;
        if c.idle_timeout_secs == 0 || c.max_age_secs == 0 || c.streams_per_connection == 0 {
            problems.push(
                "connections: idle_timeout_secs, max_age_secs and streams_per_connection must be at least 1"
                    .to_string(),
            );
        }
        if self.cri.listen.is_some() && self.cri.listen.as_ref() == Some(&self.cri.containerd) {
            problems.push(
                "cri.listen: must not be containerd's own socket (cri.containerd); the kubelet's --image-service-endpoint names the agent's"
                    .to_string(),
            );
        }
        if self.api_listen.is_some() && self.api_token_file.is_none() {
            problems.push(
                "api_listen: the TCP API needs api_token_file (the unix socket needs none)"
                    .to_string(),
            );
        }
        for (key, addr) in [
            ("api_listen", &self.api_listen),
            ("metrics_listen", &self.metrics_listen),
            ("mirror.listen", &self.mirror.listen),
        ] {
            if let Some(a) = addr {
                if a.parse::<std::net::SocketAddr>().is_err() {
                    problems.push(format!(
                        "{key}: {a:?} is not host:port (e.g. 127.0.0.1:9464)"
                    ));
                }
            }
        }
        let f = &self.fetch;
        if f.merge_bytes > 64 << 20 {
            problems.push("fetch.merge_bytes: at most 64M".to_string());
        }
        if f.attempts == 0 {
            problems.push("fetch.attempts: at least 1".to_string());
        }
        if f.timeout_secs == 0 {
            problems.push("fetch.timeout_secs: at least 1".to_string());
        }
        if f.workers == 0 || f.workers > 1024 {
            problems.push("fetch.workers: 1..=1024".to_string());
        }
        if f.prefetch_concurrency == 0 {
            problems.push("fetch.prefetch_concurrency: at least 1".to_string());
        }
        self.p2p.problems(&mut problems);
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

/// Parses `4096`, `64K`, `512M`, `10G`, `1T` (binary units; `KiB`, `MB`… spellings too).
pub fn parse_size(s: &str) -> std::result::Result<u64, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits_end);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 4096, 512M or 10G"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K, M, G or T)")),
    };
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Sizes in TOML as `"10G"` or a plain number of bytes.
mod size {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(*v)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Size {
            Bytes(u64),
            Text(String),
        }
        match Size::deserialize(d)? {
            Size::Bytes(n) => Ok(n),
            Size::Text(t) => super::parse_size(&t).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_files_override_them() {
        AgentConfig::default().validate().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "cache_capacity = \"2G\"\nprefetch = \"all\"\n[fetch]\nmerge_bytes = 262144\n[registry]\ninsecure = [\"r:5000\"]\n",
        )
        .unwrap();
        let c = AgentConfig::load(&path).unwrap();
        assert_eq!(c.cache_capacity, 2 << 30);
        assert_eq!(c.prefetch, Prefetch::All);
        assert_eq!(c.fetch.merge_bytes, 256 << 10);
        assert_eq!(c.fetch.workers, 16);
        assert_eq!(c.registry.insecure, ["r:5000"]);
    }

    #[test]
    fn problems_are_all_reported_by_key() {
        let c = AgentConfig {
            cache_capacity: 1,
            cache_disk_high_percent: 80,
            cache_disk_low_percent: 85,
            api_listen: Some("nope".into()),
            store_root: Some("var/lib/tessera/store".into()),
            fetch: FetchConfig {
                workers: 0,
                ..FetchConfig::default()
            },
            ..AgentConfig::default()
        };
        let problems = c.validate().unwrap_err();
        for key in [
            "cache_capacity",
            "cache_disk_high_percent, cache_disk_low_percent",
            "api_listen: the TCP",
            "api_listen: \"nope\"",
            "fetch.workers",
            "store_root",
        ] {
            assert!(
                problems.iter().any(|p| p.starts_with(key)),
                "{key}: {problems:?}"
            );
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(&path, "cache_capacty = 5\n").unwrap();
        let e = AgentConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("cache_capacty"), "{e}");
    }

    #[test]
    fn p2p_is_checked_only_when_active() {
        let p2p = |p: P2pConfig| AgentConfig {
            p2p: p,
            ..AgentConfig::default()
        };
        // A wildcard peer_listen without advertise is fine while P2P is off…
        p2p(P2pConfig::default()).validate().unwrap();
        p2p(P2pConfig {
            enabled: false,
            scheduler: Some("nope".into()),
            ..P2pConfig::default()
        })
        .validate()
        .unwrap();
        // …and reported, with the other mistakes, once a scheduler is set.
        let problems = p2p(P2pConfig {
            scheduler: Some("scheduler:7080".into()),
            max_uploads: 0,
            ..P2pConfig::default()
        })
        .validate()
        .unwrap_err();
        for key in ["p2p.scheduler", "p2p.advertise", "p2p.max_uploads"] {
            assert!(
                problems.iter().any(|p| p.starts_with(key)),
                "{key}: {problems:?}"
            );
        }
        let c = P2pConfig {
            scheduler: Some("http://10.0.0.9:7080".into()),
            peer_listen: "10.0.0.1:7081".into(),
            ..P2pConfig::default()
        };
        assert!(c.active());
        assert_eq!(c.advertised(), Some("10.0.0.1:7081".parse().unwrap()));
        p2p(c).validate().unwrap();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("10G"), Ok(10 << 30));
        assert_eq!(parse_size("512 MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("5X").is_err());
        assert!(parse_size("99999999999T").is_err());
    }
}
