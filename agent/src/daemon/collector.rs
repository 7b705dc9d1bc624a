//! The agent's Prometheus collector: the cache's figures, the swarm's, and the
//! mounts' (reads, FUSE operations), read at scrape time. The fetcher, the mirror and
//! the snapshotter register metrics of their own; the endpoint is `daemon::metrics`.

use std::sync::{Arc, Weak};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::lifecycle::Mount;
use super::Agent;
use crate::fs;

/// Prometheus view of the cache and the mounts, read at scrape time.
#[derive(Debug)]
pub(super) struct AgentCollector {
    pub agent: Weak<Agent>,
}

impl Collector for AgentCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
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
                "tessera_agent_cache_stored_bytes",
                "Chunk bytes written to the cache (each chunk once, when stored)",
                cache.stored_bytes,
            ),
            (
                "tessera_agent_cache_verification_failures",
                "Cached chunks that failed re-verification and were dropped",
                cache.verification_failures,
            ),
            (
                "tessera_agent_cache_verified_bytes",
                "Cached bytes re-verified by the scrub and `tessera cache verify`",
                cache.verified_bytes,
            ),
            (
                "tessera_agent_cache_warmed_bytes",
                "Cached bytes read into the page cache ahead of a walk of a mount",
                cache.warmed_bytes,
            ),
        ];
        let uploaded = agent
            .network
            .as_ref()
            .map_or(0, |n| n.server().uploaded_bytes());
        let sent = agent
            .network
            .as_ref()
            .map_or(0, |n| n.server().sent_bytes());
        let refused = agent
            .network
            .as_ref()
            .map_or(0, |n| n.server().refused_requests());
        let counters = counters.into_iter().chain([
            (
                "tessera_agent_peer_requests_refused",
                "Peers' requests for chunks of a restricted image (private repository, checkpoint) refused for lack of a proof of access",
                refused,
            ),
            (
                "tessera_agent_peer_upload_bytes",
                "Chunk bytes handed to peers' streams (uncompressed)",
                uploaded,
            ),
            (
                "tessera_agent_peer_sent_bytes",
                "Chunk bytes handed to peers' streams as sent (compressed where p2p.compress_uploads)",
                sent,
            ),
        ]);
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
                "tessera_agent_cache_backing_bytes",
                "Bytes of FUSE passthrough backing files (copies of cached chunks, within the capacity)",
                cache.backing_bytes as i64,
            ),
            (
                "tessera_agent_cache_unverified_chunks",
                "Chunks written after the last checkpoint before a crash, verified when first read",
                cache.unverified as i64,
            ),
            (
                "tessera_agent_cache_pinned_bytes",
                "Bytes of cached chunks that mounted images pin (never evicted while mounted)",
                cache.pinned_bytes as i64,
            ),
            (
                "tessera_agent_cache_pinned_over_capacity",
                "1 while pinned chunks alone exceed the cache capacity (it grows past it)",
                i64::from(cache.pinned_over_capacity),
            ),
            (
                "tessera_agent_cache_degraded",
                "1 while the cache disk is full and chunks are served without being cached",
                i64::from(cache.degraded),
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
