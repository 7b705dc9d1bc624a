//! `tessera-scheduler`: tells agents which peers hold which chunks and keeps the
//! origin registry from being hit once per node.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tessera_proto::pb::scheduler_server::SchedulerServer;
use tessera_scheduler::service::SchedulerService;
use tessera_scheduler::swarm::{Swarm, SwarmConfig};

/// Command-line interface of the scheduler.
#[derive(Debug, Parser)]
#[command(name = "tessera-scheduler", version, about)]
struct Cli {
    /// Address of the gRPC service agents talk to.
    #[arg(long, env = "TESSERA_SCHEDULER_LISTEN", default_value = "0.0.0.0:7080")]
    listen: std::net::SocketAddr,
    /// Seconds a host stays registered without a heartbeat.
    #[arg(long, default_value_t = 30)]
    lease_secs: u64,
    /// Hosts sent to the origin at once for a range nobody holds yet.
    #[arg(long, default_value_t = 2)]
    origin_fetchers: usize,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let swarm = Arc::new(Mutex::new(Swarm::new(SwarmConfig {
        lease: Duration::from_secs(cli.lease_secs),
        origin_fetchers: cli.origin_fetchers,
        ..SwarmConfig::default()
    })));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")?;
    runtime.block_on(async move {
        // Forget hosts whose lease ran out, once a second.
        let expiring = swarm.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let gone = expiring
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .expire(Instant::now());
                if gone > 0 {
                    tracing::info!(hosts = gone, "leases expired");
                }
            }
        });
        tracing::info!(listen = %cli.listen, "scheduler ready");
        tonic::transport::Server::builder()
            .add_service(SchedulerServer::new(SchedulerService::new(swarm)))
            .serve_with_shutdown(cli.listen, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .with_context(|| format!("serve on {}", cli.listen))
    })
}
