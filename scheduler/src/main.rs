//! `tessera-scheduler`: tells agents which peers hold which chunks and keeps the
//! origin registry from being hit once per node.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use tessera_proto::auth::{RequireBearer, TokenFile};
use tessera_proto::domain::HostId;
use tessera_proto::listen;
use tessera_proto::pb::scheduler_server::SchedulerServer;
use tessera_scheduler::admin::{Admin, AdminTokens};
use tessera_scheduler::preheat::Preheats;
use tessera_scheduler::service::SchedulerService;
use tessera_scheduler::store::Store;
use tessera_scheduler::swarm::{Swarm, SwarmConfig};
use tonic::transport::{Identity, ServerTlsConfig};

mod admin_cli;

/// Command-line interface of the scheduler.
#[derive(Debug, Parser)]
#[command(
    name = "tessera-scheduler",
    version,
    about,
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Call a running scheduler's admin API (hosts, blobs, stats, blocking hosts,
    /// preheat jobs).
    Admin(admin_cli::AdminArgs),
}

/// Running the scheduler (the default).
#[derive(Debug, clap::Args)]
struct ServeArgs {
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
    /// Serve TLS with this certificate (PEM), on the gRPC service and the admin API;
    /// agents then use `https://` and trust its CA (`p2p.tls_ca`).
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
    /// Serve the admin API (HTTP/JSON, health, readiness, metrics) on this address.
    #[arg(
        long,
        env = "TESSERA_SCHEDULER_ADMIN_LISTEN",
        value_name = "ADDR",
        requires = "admin_token_file"
    )]
    admin_listen: Option<std::net::SocketAddr>,
    /// The admin API's token (every endpoint but health and readiness); re-read at
    /// every request, so it can be rotated.
    #[arg(long, env = "TESSERA_SCHEDULER_ADMIN_TOKEN_FILE", value_name = "FILE")]
    admin_token_file: Option<std::path::PathBuf>,
    /// A second token that may only read (`GET`s): for dashboards and scrapers.
    #[arg(
        long,
        env = "TESSERA_SCHEDULER_ADMIN_READ_TOKEN_FILE",
        value_name = "FILE"
    )]
    admin_read_token_file: Option<std::path::PathBuf>,
    /// Where what outlives a restart (the blocklist, preheat jobs) is kept; used only
    /// with --admin-listen.
    #[arg(
        long,
        env = "TESSERA_SCHEDULER_STATE_DIR",
        value_name = "DIR",
        default_value = "/var/lib/tessera-scheduler"
    )]
    state_dir: std::path::PathBuf,
    /// Connections each listener (gRPC, admin) holds at once; one past it is closed at
    /// once and counted. 0: derived from the open-file limit.
    #[arg(long, default_value_t = 0, value_name = "N")]
    max_connections: usize,
    /// A connection that sends nothing for this long is closed; on the admin API also
    /// one whose request head takes longer, or idle between requests.
    #[arg(long, default_value_t = 30, value_name = "SECS")]
    idle_timeout_secs: u64,
    /// gRPC connections are closed gracefully at this age; agents reconnect.
    #[arg(long, default_value_t = 600, value_name = "SECS")]
    max_connection_age_secs: u64,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TESSERA_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        // Colours only for a person at a terminal: a daemon's log goes to a file or
        // the journal, where escape codes are noise to read and to search.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Admin(args)) => admin_cli::run(args),
        None => serve(cli.serve),
    }
}

fn serve(cli: ServeArgs) -> anyhow::Result<()> {
    let token = match &cli.token_file {
        Some(path) => Some(
            TokenFile::open(path)
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
    // Without the admin API nobody can start a preheat job, so nothing is kept.
    let preheats = Arc::new(Mutex::new(Preheats::open(None)?));
    let admin = match (&cli.admin_listen, &cli.admin_token_file) {
        (Some(_), Some(token)) => {
            let store = Store::open(&cli.state_dir).context(
                "open the scheduler's state (--state-dir must be writable; it keeps the blocklist)",
            )?;
            let tokens = AdminTokens {
                admin: token.clone(),
                read: cli.admin_read_token_file.clone(),
            };
            let jobs = Preheats::open(Some(store.clone()))?;
            *preheats.lock().unwrap_or_else(|p| p.into_inner()) = jobs;
            Some(Admin::new(swarm.clone(), preheats.clone(), store, tokens)?)
        }
        _ => None,
    };
    // Every agent is a connection: use all the descriptors the system allows.
    let fd_limit = match listen::raise_fd_limit() {
        Ok(limit) => {
            tracing::info!(open_files = limit, "open-file limit");
            limit
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not raise the open-file limit");
            listen::fd_limit()
        }
    };
    let cap = match cli.max_connections {
        0 => listen::default_cap(fd_limit, 2),
        n => n,
    };
    let idle = Duration::from_secs(cli.idle_timeout_secs.max(1));
    let grpc_gate = listen::Gate::new("grpc", cap, idle);
    let admin_gate = listen::Gate::new("admin", cap, idle);
    if let Some(admin) = &admin {
        admin.count_refusals(vec![grpc_gate.clone(), admin_gate.clone()]);
    }
    tracing::info!(
        per_listener = cap,
        idle_timeout_secs = idle.as_secs(),
        "connection limits"
    );
    runtime.block_on(async move {
        if let (Some(addr), Some(admin)) = (cli.admin_listen, &admin) {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("admin API: listen on {addr}"))?;
            match (&cli.tls_cert, &cli.tls_key) {
                (Some(cert), Some(key)) => {
                    let tls = tessera_scheduler::admin::tls_acceptor(cert, key)?;
                    tracing::info!(listen = %addr, tls = true, "admin API ready");
                    tokio::spawn(admin.clone().serve_tls(listener, admin_gate, idle, tls));
                }
                _ => {
                    tracing::info!(listen = %addr, tls = false, "admin API ready");
                    tokio::spawn(admin.clone().serve(listener, admin_gate, idle));
                }
            }
        }
        // Forget hosts whose lease ran out, and fail their preheat parts, once a second.
        let (expiring, jobs) = (swarm.clone(), preheats.clone());
        // A host gone this long (two leases) is not coming back soon.
        let grace = Duration::from_secs(cli.lease_secs.saturating_mul(2));
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let now = Instant::now();
                let mut swarm = expiring.lock().unwrap_or_else(|p| p.into_inner());
                let gone = swarm.expire(now);
                jobs.lock().unwrap_or_else(|p| p.into_inner()).tick(
                    |host| swarm.is_registered(&HostId(host.to_string()), now),
                    grace,
                    now,
                );
                drop(swarm);
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
        // A flood is bounded: requests at once per connection, streams per connection,
        // and time per request (every call is small; a stuck one must not pile up).
        let max_age = Duration::from_secs(cli.max_connection_age_secs.max(1));
        let mut server = listen::grpc_server(256, max_age).timeout(Duration::from_secs(10));
        if let Some(tls) = tls {
            server = server.tls_config(tls).context("configure TLS")?;
        }
        let service = SchedulerServer::with_interceptor(
            SchedulerService::new(swarm, preheats),
            RequireBearer::from_file(token, "scheduler"),
        );
        let listener = tokio::net::TcpListener::bind(cli.listen)
            .await
            .with_context(|| format!("listen on {}", cli.listen))?;
        if let Some(admin) = &admin {
            admin
                .ready
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        server
            .add_service(service)
            .serve_with_incoming_shutdown(
                // Nagle is off on every admitted connection: small answers go at once.
                grpc_gate.incoming(listener),
                async {
                    shutdown_signal().await;
                    tracing::info!("shutting down");
                    if let Some(admin) = &admin {
                        admin
                            .ready
                            .store(false, std::sync::atomic::Ordering::Relaxed);
                    }
                },
            )
            .await
            .with_context(|| format!("serve on {}", cli.listen))
    })
}

/// SIGTERM (what Kubernetes and systemd send; as PID 1 in a container nothing else would
/// stop the process) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}
