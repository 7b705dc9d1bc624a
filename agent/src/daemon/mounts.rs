//! One mount: the image's chunks as the filesystem reads them, its prefetch task, the
//! optional recorder of start-up reads, and its pull summary.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use rafs_format::reader::{Bootstrap, FileKind};
use serde::{Deserialize, Serialize};

use super::lifecycle::Mount;
use super::Agent;
use crate::config::Prefetch;
use crate::fetch::{Fetcher, ImageChunks, PullSummary, RegistryOrigin, Wanted};
use crate::fs::handover::Attach;
use crate::fs::{self, ChunkReader, MountOptions};
use crate::registry::image as registry_image;
use crate::registry::reference::{Platform, Reference};
use crate::{Error, Result};

/// What the filesystem reads through: the image's chunks, and the read statistics.
#[derive(Debug)]
pub struct MountedImage {
    pub chunks: Arc<ImageChunks>,
    fetcher: Arc<Fetcher>,
    /// `fetch.readahead_bytes`.
    readahead: u64,
    runtime: tokio::runtime::Handle,
    /// The image as the mount request named it.
    requested: String,
    /// Manifest digest, for status and logs.
    digest: String,
    /// When the mount was asked for (time to first byte is measured from it).
    started: Instant,
    bytes_read: AtomicU64,
    reads: AtomicU64,
    first_byte: OnceLock<Duration>,
    recorder: Option<Recorder>,
    /// `fetch.slow_read_ms`: a read waiting longer is a slow read.
    slow_read: Duration,
    slow_reads: AtomicU64,
    /// When a slow read was last logged (ms since `started`): one line a second at most.
    slow_logged_ms: AtomicU64,
}

impl ChunkReader for MountedImage {
    fn read_chunk(&self, chunk: u32) -> std::io::Result<Arc<Vec<u8>>> {
        // FUSE worker threads are not runtime threads: the fetcher's blocking bridge.
        self.fetcher
            .read_blocking(&self.runtime, &self.chunks, chunk, self.readahead)
            .map_err(|e| {
                tracing::error!(image = %self.chunks.reference, chunk, error = %e, "read failed");
                std::io::Error::other(e.to_string())
            })
    }

    fn observe_read(&self, ino: u32, _offset: u64, len: u64) {
        self.bytes_read.fetch_add(len, Ordering::Relaxed);
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.first_byte.get_or_init(|| self.started.elapsed());
        if let Some(r) = &self.recorder {
            r.saw(ino);
        }
    }

    fn read_done(&self, ino: u32, len: u64, waited: Duration) {
        if waited < self.slow_read {
            return;
        }
        let count = self.slow_reads.fetch_add(1, Ordering::Relaxed) + 1;
        self.fetcher.metrics.slow_reads.inc();
        let now_ms = self.started.elapsed().as_millis() as u64;
        let last = self.slow_logged_ms.load(Ordering::Relaxed);
        if (count == 1 || now_ms >= last + 1000)
            && self
                .slow_logged_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                image = %self.requested,
                ino,
                len,
                waited_ms = waited.as_millis() as u64,
                slow_reads = count,
                "slow read: the workload waited over fetch.slow_read_ms for data (see tessera status: bytes by source)"
            );
        }
    }
}

/// Writes the path of each regular file the workload reads, once, in first-read order:
/// a prefetch list for `tessera convert --prefetch-list`.
#[derive(Debug)]
pub struct Recorder {
    /// Path (from the root, with a leading `/`) of each regular file, by inode.
    paths: HashMap<u32, Vec<u8>>,
    seen: Mutex<(HashSet<u32>, std::fs::File)>,
}

impl Recorder {
    fn new(bootstrap: &Bootstrap, out: &Path) -> Result<Self> {
        let mut paths = HashMap::new();
        rafs_format::image::for_each_entry(bootstrap, |path, inode, first| {
            if first && inode.kind == FileKind::Regular {
                let mut p = Vec::with_capacity(path.len() + 1);
                p.push(b'/');
                p.extend_from_slice(path);
                paths.insert(inode.ino, p);
            }
        })?;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(out)
            .map_err(|e| Error::io("open record file", out, e))?;
        Ok(Recorder {
            paths,
            seen: Mutex::new((HashSet::new(), file)),
        })
    }

    fn saw(&self, ino: u32) {
        let mut guard = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        let (seen, file) = &mut *guard;
        if !seen.insert(ino) {
            return;
        }
        if let Some(path) = self.paths.get(&ino) {
            let mut line = path.clone();
            line.push(b'\n');
            if let Err(e) = file.write_all(&line) {
                tracing::warn!(error = %e, "could not record a read");
            }
        }
    }
}

/// One mount in `tessera status`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MountStatus {
    pub image: String,
    pub digest: String,
    pub mountpoint: PathBuf,
    /// Seconds since the epoch.
    pub mounted_at: u64,
    pub mount_seconds: f64,
    pub first_byte_seconds: Option<f64>,
    /// Reads that waited longer than `fetch.slow_read_ms`.
    #[serde(default)]
    pub slow_reads: u64,
    /// Bytes the workload read through the mount.
    pub bytes_read: u64,
    pub reads: u64,
    pub pull: PullSummary,
    /// Origin bytes per second since the mount.
    pub origin_mib_per_s: f64,
}

impl std::fmt::Display for MountStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b as f64 / f64::from(1 << 20);
        write!(
            f,
            "image {} at {}: {:.1} MiB read, {:.1} MiB fetched from origin ({:.1} MiB on the wire, {:.1} MiB/s), {:.1} MiB from peers, {:.1} MiB from cache; mounted in {:.0} ms",
            self.image,
            self.mountpoint.display(),
            mib(self.bytes_read),
            mib(self.pull.origin_bytes),
            mib(self.pull.origin_wire_bytes),
            self.origin_mib_per_s,
            mib(self.pull.peer_bytes),
            mib(self.pull.cache_bytes),
            self.mount_seconds * 1000.0
        )?;
        if let Some(t) = self.first_byte_seconds {
            write!(f, "; first byte {:.0} ms", t * 1000.0)?;
        }
        if self.slow_reads > 0 {
            write!(f, "; {} slow reads", self.slow_reads)?;
        }
        if self.pull.verification_failures > 0 {
            write!(
                f,
                "; {} chunks failed verification",
                self.pull.verification_failures
            )?;
        }
        Ok(())
    }
}

impl Mount {
    pub fn status(&self) -> MountStatus {
        let pull = self.image.chunks.stats.summary();
        let since = self
            .mounted_at
            .elapsed()
            .unwrap_or_default()
            .as_secs_f64()
            .max(0.001);
        MountStatus {
            image: self.image.requested.clone(),
            digest: self.image.digest.clone(),
            mountpoint: self.mountpoint.clone(),
            mounted_at: self
                .mounted_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs(),
            mount_seconds: self.mount_seconds,
            first_byte_seconds: self.image.first_byte.get().map(Duration::as_secs_f64),
            slow_reads: self.image.slow_reads.load(Ordering::Relaxed),
            bytes_read: self.image.bytes_read.load(Ordering::Relaxed),
            reads: self.image.reads.load(Ordering::Relaxed),
            origin_mib_per_s: pull.origin_wire_bytes as f64 / f64::from(1 << 20) / since,
            pull,
        }
    }
}

impl Agent {
    /// Mounts `image` at `mountpoint`: resolves it, fetches and verifies its bootstrap,
    /// and serves it at once; data is fetched as it is read.
    pub async fn mount(
        self: &Arc<Self>,
        image: &str,
        mountpoint: &Path,
        record: Option<PathBuf>,
        platform: Option<String>,
        prefetch: Option<Prefetch>,
    ) -> Result<MountStatus> {
        self.mount_with(image, mountpoint, record, platform, prefetch, Attach::Mount)
            .await
    }

    /// [`mount`](Self::mount), or taking over a mount an earlier agent left (then
    /// `mountpoint` must be canonical: it is not looked at before it is served).
    #[tracing::instrument(skip_all, fields(image = %image, mountpoint = %mountpoint.display()))]
    pub async fn mount_with(
        self: &Arc<Self>,
        image: &str,
        mountpoint: &Path,
        record: Option<PathBuf>,
        platform: Option<String>,
        prefetch: Option<Prefetch>,
        attach: Attach,
    ) -> Result<MountStatus> {
        let started = Instant::now();
        let mountpoint = match attach {
            Attach::TakeOver { .. } => mountpoint.to_path_buf(),
            _ => Self::canonical(mountpoint)?,
        };
        if self
            .mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(&mountpoint)
        {
            return Err(Error::Agent(format!(
                "{} is already a Tessera mount; unmount it first",
                mountpoint.display()
            )));
        }
        let reference = Reference::parse(image)?;
        let (resolved, chunks) = self.open_image(&reference, platform.as_deref()).await?;
        let bootstrap = chunks.bootstrap.clone();
        let recorder = match &record {
            Some(path) => Some(Recorder::new(&bootstrap, path)?),
            None => None,
        };
        let mounted_image = Arc::new(MountedImage {
            chunks,
            fetcher: self.fetcher.clone(),
            readahead: self.config.fetch.readahead_bytes,
            runtime: self.runtime.clone(),
            requested: image.to_string(),
            digest: resolved.raw.digest.clone(),
            started,
            bytes_read: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            first_byte: OnceLock::new(),
            recorder,
            slow_read: Duration::from_millis(self.config.fetch.slow_read_ms),
            slow_reads: AtomicU64::new(0),
            slow_logged_ms: AtomicU64::new(0),
        });
        let opts = MountOptions {
            fsname: format!("{}{reference}", super::stale::source_prefix(&self.owner)),
            workers: self.config.fetch.workers,
            allow_other: true,
            read_latency: Some(self.fetcher.metrics.fuse_read_seconds.clone()),
        };
        let mount = Mount::attach(
            mounted_image.clone(),
            bootstrap,
            mountpoint.clone(),
            opts,
            attach,
            started,
        )
        .await?;
        let mode = prefetch.unwrap_or(self.config.prefetch);
        if mode != Prefetch::None {
            let task = tokio::spawn(prefetch_image(
                self.fetcher.clone(),
                mounted_image,
                mode,
                self.config.fetch.prefetch_concurrency,
            ));
            mount.set_prefetch(task);
        }
        self.mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(mountpoint, mount.clone());
        let status = mount.status();
        tracing::info!(digest = %status.digest, seconds = status.mount_seconds, "mounted");
        Ok(status)
    }

    pub async fn umount(&self, mountpoint: &Path) -> Result<MountStatus> {
        let key = Self::canonical(mountpoint).unwrap_or_else(|_| mountpoint.to_path_buf());
        let mount = self
            .mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key)
            .ok_or_else(|| {
                Error::Agent(format!(
                    "{} is not a Tessera mount of this agent",
                    key.display()
                ))
            })?;
        Ok(mount.unmount().await)
    }

    /// `reference` resolved for `platform` (the host's when `None`), with its verified
    /// bootstrap and its chunks; what this node already holds of it is announced to the
    /// swarm in the background.
    pub(super) async fn open_image(
        &self,
        reference: &Reference,
        platform: Option<&str>,
    ) -> Result<(registry_image::PlatformImage, Arc<ImageChunks>)> {
        let platform = match platform {
            Some(p) => p.parse::<Platform>().map_err(Error::Agent)?,
            None => Platform::host(),
        };
        let resolved = registry_image::resolve_platform(&self.client, reference, &platform).await?;
        let bootstrap = Arc::new(self.bootstrap_for(&resolved).await?);
        let origin = Arc::new(RegistryOrigin {
            client: self.client.clone(),
            reference: resolved.reference.clone(),
        });
        let chunks = Arc::new(ImageChunks::new(
            bootstrap,
            resolved.reference.clone(),
            origin,
        )?);
        if let Some(network) = self.network.clone() {
            let (store, chunks) = (self.fetcher.store().clone(), chunks.clone());
            // Blocking: an index probe per chunk.
            tokio::task::spawn_blocking(move || chunks.announce_stored(store.as_ref(), &network));
        }
        Ok((resolved, chunks))
    }

    /// The image's bootstrap: from the local store if this layer was fetched before
    /// (it is named by its verified digest), else fetched, verified and stored.
    pub(super) async fn bootstrap_for(
        &self,
        image: &registry_image::PlatformImage,
    ) -> Result<Bootstrap> {
        let layer = registry_image::bootstrap_layer(image)?;
        let digest = layer.digest().to_string();
        let name = digest.replace(':', "-");
        let stored = self.bootstrap_dir.join(&name);
        if !stored.is_file() {
            let tmp = tempfile::tempdir_in(&self.bootstrap_dir)
                .map_err(|e| Error::io("create temp dir in", &self.bootstrap_dir, e))?;
            let path = registry_image::fetch_bootstrap(&self.client, image, tmp.path()).await?;
            std::fs::rename(&path, &stored)
                .map_err(|e| Error::io("store bootstrap", &stored, e))?;
        }
        let bootstrap = Bootstrap::open(&stored)?;
        bootstrap.validate_all()?;
        Ok(bootstrap)
    }
}

/// Fetches the image's prefetch list (and, for `all`, every other chunk, in blob
/// order) with at most `concurrency` chunks at a time, so on-demand reads keep going.
async fn prefetch_image(
    fetcher: Arc<Fetcher>,
    image: Arc<MountedImage>,
    mode: Prefetch,
    concurrency: usize,
) {
    let started = Instant::now();
    let b = &image.chunks.bootstrap;
    let mut chunks: Vec<u32> = Vec::new();
    let mut seen = HashSet::new();
    if let Ok(entries) = b.prefetch() {
        for e in entries {
            let Ok(inode) = b.inode(e.ino) else { continue };
            let Ok(pieces) = b.file_chunks(&inode) else {
                continue;
            };
            chunks.extend(
                pieces
                    .iter()
                    .filter_map(|p| p.chunk)
                    .filter(|c| seen.insert(*c)),
            );
        }
    }
    if mode == Prefetch::All {
        let mut rest: Vec<(u32, u64, u32)> = (0..b.chunk_count())
            .filter(|c| !seen.contains(c))
            .filter_map(|c| {
                b.chunk(c)
                    .ok()
                    .map(|i| (i.blob_index, i.compressed_offset, c))
            })
            .collect();
        rest.sort_unstable();
        chunks.extend(rest.into_iter().map(|(_, _, c)| c));
    }
    let total = chunks.len();
    let mut failed = 0usize;
    let units: Vec<_> = chunks
        .into_iter()
        .filter_map(|c| image.chunks.unit(c).ok())
        .collect();
    let wanted: Arc<dyn Wanted> = image.chunks.clone();
    fetcher
        .fetch_all(&wanted, units, concurrency, |_, outcome| {
            failed += usize::from(outcome.is_err());
        })
        .await;
    tracing::info!(
        image = %image.chunks.reference,
        chunks = total,
        failed,
        seconds = started.elapsed().as_secs_f64(),
        "prefetch done"
    );
}

/// Prometheus view of the cache and the mounts, read at scrape time.
#[derive(Debug)]
pub(super) struct AgentCollector {
    pub agent: Weak<Agent>,
}

impl Collector for AgentCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::result::Result<(), std::fmt::Error> {
        let Some(agent) = self.agent.upgrade() else {
            return Ok(());
        };
        let cache = agent.cache.stats();
        let counters = [
            ("tessera_agent_cache_hits", "Chunk cache hits", cache.hits),
            (
                "tessera_agent_cache_misses",
                "Chunk cache misses",
                cache.misses,
            ),
            (
                "tessera_agent_cache_evictions",
                "Chunks evicted from the cache",
                cache.evictions,
            ),
            (
                "tessera_agent_cache_verification_failures",
                "Cached chunks that failed re-verification and were dropped",
                cache.verification_failures,
            ),
        ];
        let uploaded = agent
            .network
            .as_ref()
            .map_or(0, |n| n.server().uploaded_bytes());
        let counters = counters.into_iter().chain([(
            "tessera_agent_peer_upload_bytes",
            "Chunk bytes served to peers",
            uploaded,
        )]);
        for (name, help, value) in counters {
            let c = ConstCounter::new(value);
            c.encode(encoder.encode_descriptor(name, help, None, c.metric_type())?)?;
        }
        let mounts: Vec<Arc<Mount>> = agent
            .mounts
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        let gauges = [
            (
                "tessera_agent_cache_bytes",
                "Bytes in the chunk cache",
                cache.bytes as i64,
            ),
            (
                "tessera_agent_cache_capacity_bytes",
                "Chunk cache capacity",
                cache.capacity as i64,
            ),
            (
                "tessera_agent_cache_chunks",
                "Chunks in the cache",
                cache.entries as i64,
            ),
            (
                "tessera_agent_mounts",
                "Mounted images",
                mounts.len() as i64,
            ),
            (
                "tessera_agent_swarm_registered",
                "1 while the scheduler knows this agent (P2P on and reachable), else 0",
                agent
                    .network
                    .as_ref()
                    .map_or(0, |n| i64::from(n.registered())),
            ),
            (
                "tessera_agent_peer_uploads",
                "Uploads to peers in progress",
                agent
                    .network
                    .as_ref()
                    .map_or(0, |n| n.server().active_uploads() as i64),
            ),
        ];
        for (name, help, value) in gauges {
            let g = ConstGauge::new(value);
            g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
        let read: u64 = mounts
            .iter()
            .map(|m| m.image.bytes_read.load(Ordering::Relaxed))
            .sum();
        let c = ConstCounter::new(read);
        c.encode(encoder.encode_descriptor(
            "tessera_agent_read_bytes",
            "Bytes workloads read through mounts",
            None,
            c.metric_type(),
        )?)?;
        for (op, value) in fs::sum_stats(mounts.iter().filter_map(|m| m.fs_stats())) {
            let c = ConstCounter::new(value);
            let name = format!("tessera_agent_fuse_{op}");
            c.encode(encoder.encode_descriptor(
                &name,
                "FUSE operations",
                None,
                c.metric_type(),
            )?)?;
        }
        Ok(())
    }
}
