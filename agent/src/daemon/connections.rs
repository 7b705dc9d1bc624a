//! The connection limits of the agent's listeners, from `[connections]`: one
//! [`Gate`] per listener (a cap, a first-byte deadline), the refusals counted in
//! `tessera_agent_connections_refused_total{listener}`, and the idle timeout the
//! HTTP/1 servers give hyper. See `tessera_proto::listen` for why each limit exists.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tessera_proto::listen::{default_cap, fd_limit, Gate};

use crate::config::ConnectionsConfig;

/// Listeners an agent may have: peer, mirror, metrics, API on TCP, API on its unix
/// socket, snapshotter (and one spare), for sharing the descriptor limit.
const LISTENERS: u64 = 8;

/// The longest the local API waits for its one-line request.
const API_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabel {
    listener: &'static str,
}

/// The limits every listener of this agent applies.
#[derive(Debug)]
pub struct Connections {
    config: ConnectionsConfig,
    /// Connections per listener.
    cap: usize,
    refused: Family<ListenerLabel, Counter>,
}

impl Connections {
    pub fn new(config: &ConnectionsConfig) -> Connections {
        let cap = match config.per_listener {
            0 => default_cap(fd_limit(), LISTENERS),
            n => n,
        };
        Connections {
            config: config.clone(),
            cap,
            refused: Family::default(),
        }
    }

    /// Connections each listener holds at once.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// The gate of the listener `name` (`peer`, `mirror`, `metrics`, `api-tcp`,
    /// `api-unix`, `snapshotter`).
    pub fn gate(&self, name: &'static str) -> Gate {
        let refused = self
            .refused
            .get_or_create(&ListenerLabel { listener: name })
            .clone();
        Gate::new(name, self.cap, self.idle()).on_refused(move || {
            refused.inc();
        })
    }

    /// No bytes, no complete HTTP/1 request head, or an idle keep-alive connection for
    /// this long: the connection is closed.
    pub fn idle(&self) -> Duration {
        Duration::from_secs(self.config.idle_timeout_secs)
    }

    /// How long the local API waits for its request line.
    pub fn api_request(&self) -> Duration {
        self.idle().min(API_REQUEST_TIMEOUT)
    }

    /// gRPC connections are closed gracefully at this age.
    pub fn max_age(&self) -> Duration {
        Duration::from_secs(self.config.max_age_secs)
    }

    /// gRPC streams at once on one connection.
    pub fn streams_per_connection(&self) -> u32 {
        self.config.streams_per_connection
    }

    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tessera_agent_connections_refused",
            "Connections closed at once because their listener was at its cap",
            self.refused.clone(),
        );
    }
}
