//! `tessera-scheduler`: tells agents which peers hold which chunks and keeps the
//! origin registry from being hit once per node.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tessera_proto::auth::{RequireBearer, Token};
use tessera_proto::pb::scheduler_server::SchedulerServer;
use tessera_scheduler::service::SchedulerService;
use tessera_scheduler::swarm::{Swarm, SwarmConfig};
use tonic::transport::{Identity, ServerTlsConfig};

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
    /// Hosts sent to the origin at once for a range nobody holds yet (1: the origin
    /// sends each range about once; more: redundancy against a slow first fetcher).
    #[arg(long, default_value_t = 1)]
    origin_fetchers: usize,
    /// A file holding the bearer token every agent must present (the agents'
    /// `p2p.token_file`). Without it, any client may use the service.
    #[arg(long, env = "TESSERA_SCHEDULER_TOKEN_FILE", value_name = "FILE")]
    token_file: Option<std::path::PathBuf>,
    /// Serve TLS with this certificate (PEM); agents then use `https://` and trust its
    /// CA (`p2p.tls_ca`).
    #[arg(
        long,
        env = "TESSERA_SCHEDULER_TLS_CERT",
        value_name = "FILE",
        requires = "tls_key"
    )]
    tls_cert: Option<std::path::PathBuf>,
    #[arg(
        long,
        env = "TESSERA_SCHEDULER_TLS_KEY",
        value_name = "FILE",
        requires = "tls_cert"
    )]
    tls_key: Option<std::path::PathBuf>,
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
    let token = match &cli.token_file {
        Some(path) => Some(
            Token::from_file(path)
                .with_context(|| format!("read the token file {}", path.display()))?,
        ),
        None => None,
    };
    let tls = match (&cli.tls_cert, &cli.tls_key) {
        (Some(cert), Some(key)) => {
            let cert = std::fs::read(cert).with_context(|| format!("read {}", cert.display()))?;
            let key = std::fs::read(key).with_context(|| format!("read {}", key.display()))?;
            Some(ServerTlsConfig::new().identity(Identity::from_pem(cert, key)))
        }
        _ => None,
    };
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
        tracing::info!(
            listen = %cli.listen,
            token = token.is_some(),
            tls = tls.is_some(),
            "scheduler ready"
        );
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            server = server.tls_config(tls).context("configure TLS")?;
        }
        let service = SchedulerServer::with_interceptor(
            SchedulerService::new(swarm),
            RequireBearer::new(token, "scheduler"),
        );
        server
            .add_service(service)
            .serve_with_shutdown(cli.listen, async {
                let _ = tokio::signal::ctrl_c().await;
            })
            .await
            .with_context(|| format!("serve on {}", cli.listen))
    })
}
