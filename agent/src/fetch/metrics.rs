//! Prometheus metrics of the chunk path, named `tessera_agent_<thing>_<unit>`.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Where a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Cache,
    Peer,
    Origin,
}

impl Source {
    pub fn label(self) -> SourceLabel {
        SourceLabel {
            source: match self {
                Source::Cache => "cache",
                Source::Peer => "peer",
                Source::Origin => "origin",
            },
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    source: &'static str,
}

impl SourceLabel {
    pub fn name(&self) -> &'static str {
        self.source
    }
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~3.3 s, doubling.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// Counters and histograms of chunk fetches, by source.
#[derive(Debug)]
pub struct FetchMetrics {
    /// Uncompressed, verified chunk bytes fetched, by source (cache: read from the
    /// node's disk), each counted once when it arrives; the memory layer's re-serving
    /// is not fetching.
    pub bytes: Family<SourceLabel, Counter>,
    pub chunks: Family<SourceLabel, Counter>,
    pub fetch_seconds: Family<SourceLabel, Histogram, fn() -> Histogram>,
    pub verification_failures: Family<SourceLabel, Counter>,
    /// Failed requests to a source (each already retried by the client).
    pub errors: Family<SourceLabel, Counter>,
    /// Range requests in flight.
    pub inflight: Gauge,
    /// FUSE read latency as the workload sees it (queueing and fetching included).
    pub fuse_read_seconds: Histogram,
    /// FUSE reads that waited longer than `fetch.slow_read_ms`.
    pub slow_reads: Counter,
    /// Bytes workloads read through every mount, counted where a FUSE read is
    /// answered (each mount also counts its own for `tessera status`).
    pub read_bytes: Counter,
    /// Units queued to be fetched ahead of a reader from a peer holding their blob.
    pub ahead_units: Counter,
}

impl Default for FetchMetrics {
    fn default() -> Self {
        FetchMetrics {
            bytes: Family::default(),
            chunks: Family::default(),
            fetch_seconds: Family::new_with_constructor(latency_histogram),
            verification_failures: Family::default(),
            errors: Family::default(),
            inflight: Gauge::default(),
            fuse_read_seconds: latency_histogram(),
            slow_reads: Counter::default(),
            read_bytes: Counter::default(),
            ahead_units: Counter::default(),
        }
    }
}

impl FetchMetrics {
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tessera_agent_bytes",
            "Uncompressed, verified chunk bytes fetched, by source (cache: from this node's disk)",
            self.bytes.clone(),
        );
        registry.register(
            "tessera_agent_chunks",
            "Chunks fetched, by source (cache: from this node's disk)",
            self.chunks.clone(),
        );
        registry.register(
            "tessera_agent_chunk_fetch_seconds",
            "Time to get one verified chunk, by source",
            self.fetch_seconds.clone(),
        );
        registry.register(
            "tessera_agent_verification_failures",
            "Chunks that failed digest verification, by source",
            self.verification_failures.clone(),
        );
        registry.register(
            "tessera_agent_fetch_errors",
            "Failed fetches from a source after the client's retries",
            self.errors.clone(),
        );
        registry.register(
            "tessera_agent_fuse_read_seconds",
            "Latency of FUSE reads, fetching included",
            self.fuse_read_seconds.clone(),
        );
        registry.register(
            "tessera_agent_read_bytes",
            "Bytes workloads read through mounts",
            self.read_bytes.clone(),
        );
        registry.register(
            "tessera_agent_slow_reads",
            "FUSE reads that waited longer than fetch.slow_read_ms for their data",
            self.slow_reads.clone(),
        );
        registry.register(
            "tessera_agent_fetched_ahead_chunks",
            "Chunks of listed files queued to be fetched from a peer holding their whole blob before they are read",
            self.ahead_units.clone(),
        );
        registry.register(
            "tessera_agent_fetches_in_flight",
            "Range requests in flight",
            self.inflight.clone(),
        );
    }

    pub(crate) fn record(&self, source: Source, bytes: u64, took: Duration) {
        let label = source.label();
        self.bytes.get_or_create(&label).inc_by(bytes);
        self.chunks.get_or_create(&label).inc();
        self.fetch_seconds
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }
}
