//! Flags shared by the subcommands that talk to registries (`convert`, `index`, and
//! `inspect`, `check`, `unpack` with `--ref`): where credentials and registry settings
//! come from, the client built from them, and which platforms to work on.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tessera_agent::registry::client::{ClientOptions, Credential, RegistryClient};
use tessera_agent::registry::credentials::{
    default_auth_file, load_registry_config, DockerConfig, RegistryConfig,
};
use tessera_agent::registry::reference::{Platform, Reference};

/// Which platforms of a multi-platform image a command works on (`convert`, `index`).
#[derive(Debug, Args)]
pub struct PlatformArgs {
    /// Platform to take from a multi-platform image [default: this machine's].
    #[arg(
        long,
        value_name = "OS/ARCH[/VARIANT]",
        conflicts_with = "all_platforms"
    )]
    platform: Option<Platform>,
    /// Every platform of a multi-platform image (`convert` pushes an index of them,
    /// `index` one index per manifest).
    #[arg(long)]
    all_platforms: bool,
}

impl PlatformArgs {
    /// The platform asked for, or this machine's.
    pub fn platform(&self) -> Platform {
        self.platform.clone().unwrap_or_else(Platform::host)
    }

    pub fn all(&self) -> bool {
        self.all_platforms
    }
}

#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// Tessera config file; its `[registry]` section lists insecure registries and
    /// the credentials file.
    #[arg(long, env = "TESSERA_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// docker `config.json` to take credentials from [default: $DOCKER_CONFIG/config.json
    /// or ~/.docker/config.json].
    #[arg(long, env = "TESSERA_AUTHFILE", value_name = "FILE")]
    authfile: Option<PathBuf>,
    /// Speak plain HTTP to the registries of this command (loopback registries always are).
    #[arg(long)]
    plain_http: bool,
    /// A registry (`host[:port]`) to speak plain HTTP to; repeatable.
    #[arg(long, value_name = "HOST")]
    insecure_registry: Vec<String>,
    /// Seconds one request may take.
    #[arg(long, default_value_t = 60)]
    timeout: u64,
    /// Retries after a 5xx, a 429, a reset or a refused connection.
    #[arg(long, default_value_t = 4)]
    retries: u32,
    /// Blobs up to this size are uploaded in one request, larger ones in chunks of it
    /// (lower it for proxies that limit request bodies); accepts K/M suffixes.
    #[arg(long, default_value = "16M", value_parser = super::parse_size)]
    upload_chunk_size: u32,
}

impl RegistryArgs {
    fn registry_config(&self) -> Result<RegistryConfig> {
        let path = self.config.clone().or_else(|| {
            let default = PathBuf::from("/etc/tessera/agent.toml");
            default.is_file().then_some(default)
        });
        match path {
            Some(p) => load_registry_config(&p).context("read registry settings"),
            None => Ok(RegistryConfig::default()),
        }
    }

    /// A client for `references`, with credentials from `creds` (a flag, for the
    /// first reference's registry) or else the credentials file.
    pub fn client(
        &self,
        references: &[&Reference],
        creds: Option<&Credential>,
    ) -> Result<Arc<RegistryClient>> {
        let config = self.registry_config()?;
        let auth_file = self
            .authfile
            .clone()
            .or(config.auth_file.clone())
            .or_else(default_auth_file);
        let docker = match &auth_file {
            Some(p) => DockerConfig::load(p).context("read registry credentials")?,
            None => DockerConfig::default(),
        };
        let mut opts = ClientOptions {
            timeout: std::time::Duration::from_secs(self.timeout),
            retries: self.retries,
            chunk_size: u64::from(self.upload_chunk_size),
            ..ClientOptions::default()
        };
        opts.plain_http.extend(config.insecure.iter().cloned());
        opts.plain_http
            .extend(self.insecure_registry.iter().cloned());
        for (i, r) in references.iter().enumerate() {
            if self.plain_http {
                opts.plain_http.push(r.registry.clone());
            }
            let credential = match creds {
                Some(c) if i == 0 => Some(c.clone()),
                _ => docker.credential(&r.registry)?,
            };
            if let Some(c) = credential {
                opts.credentials.entry(r.registry.clone()).or_insert(c);
            }
        }
        Ok(Arc::new(
            RegistryClient::new(opts).context("create the HTTP client")?,
        ))
    }
}

/// A runtime for the registry work of one command.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("start the async runtime")
}
