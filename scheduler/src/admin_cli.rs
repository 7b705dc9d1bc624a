//! `tessera-scheduler admin …`: the admin API from a shell, as tables for people or
//! `--json` for scripts.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

#[derive(Debug, Args)]
pub struct AdminArgs {
    /// The scheduler's admin API.
    #[arg(
        long,
        env = "TESSERA_SCHEDULER_ADMIN_URL",
        default_value = "http://127.0.0.1:7090",
        value_name = "URL"
    )]
    url: String,
    /// A file with the admin (or, for reading, the read-only) token.
    #[arg(long, env = "TESSERA_SCHEDULER_ADMIN_TOKEN_FILE", value_name = "FILE")]
    token_file: PathBuf,
    /// Print the API's JSON instead of a table.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Registered hosts: address, zone, what they hold, load, reliability.
    Hosts,
    /// One host in full.
    Host { id: String },
    /// Blobs and how many hosts hold each.
    Blobs,
    /// Swarm totals: peer vs origin bytes, the offload ratio, lookups.
    Stats,
    /// Blocked hosts.
    Blocklist,
    /// Never offer this host as a peer again (kept across restarts).
    Block { id: String },
    /// Offer a blocked host as a peer again.
    Unblock { id: String },
}

pub fn run(args: AdminArgs) -> Result<()> {
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("read the token file {}", args.token_file.display()))?;
    let (method, path) = match &args.action {
        Action::Hosts => ("GET", "/api/v1/hosts".to_string()),
        Action::Host { id } => ("GET", format!("/api/v1/hosts/{id}")),
        Action::Blobs => ("GET", "/api/v1/blobs".to_string()),
        Action::Stats => ("GET", "/api/v1/stats".to_string()),
        Action::Blocklist => ("GET", "/api/v1/blocklist".to_string()),
        Action::Block { id } => ("POST", format!("/api/v1/hosts/{id}/block")),
        Action::Unblock { id } => ("POST", format!("/api/v1/hosts/{id}/unblock")),
    };
    let url = format!("{}{path}", args.url.trim_end_matches('/'));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let value: Value = runtime.block_on(async {
        let client = reqwest::Client::new();
        let request = match method {
            "POST" => client.post(&url),
            _ => client.get(&url),
        };
        let resp = request
            .bearer_auth(token.trim())
            .send()
            .await
            .with_context(|| format!("call {url} (is --url the scheduler's --admin-listen?)"))?;
        let status = resp.status();
        let body: Value = resp
            .json()
            .await
            .with_context(|| format!("{url}: the answer is not JSON"))?;
        if !status.is_success() {
            let why = body["error"].as_str().unwrap_or("no reason given");
            bail!("{method} {url}: HTTP {status}: {why}");
        }
        Ok::<_, anyhow::Error>(body)
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    match args.action {
        Action::Hosts => print_hosts(&value),
        Action::Blobs => print_blobs(&value),
        Action::Blocklist => {
            for id in value.as_array().into_iter().flatten() {
                println!("{}", id.as_str().unwrap_or(""));
            }
        }
        Action::Block { id } => println!("{id}: blocked"),
        Action::Unblock { id } => println!("{id}: unblocked"),
        Action::Host { .. } | Action::Stats => print_fields(&value),
    }
    Ok(())
}

fn mib(v: &Value) -> String {
    format!("{:.1}", v.as_u64().unwrap_or(0) as f64 / f64::from(1 << 20))
}

fn print_hosts(hosts: &Value) {
    println!(
        "{:<24} {:<22} {:<10} {:>6} {:>10} {:>8} {:>8}  STATE",
        "ID", "ADDRESS", "ZONE", "BLOBS", "HELD MiB", "UPLOADS", "SUCCESS"
    );
    for h in hosts.as_array().into_iter().flatten() {
        let state = if h["blocked"] == true {
            "blocked"
        } else if h["excluded"] == true {
            "excluded (bad bytes)"
        } else if h["resting"] == true {
            "resting"
        } else {
            "ok"
        };
        let success = h["success_rate"]
            .as_f64()
            .map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0));
        println!(
            "{:<24} {:<22} {:<10} {:>6} {:>10} {:>8} {:>8}  {state}",
            h["id"].as_str().unwrap_or(""),
            h["address"].as_str().unwrap_or(""),
            h["labels"]["zone"].as_str().unwrap_or("-"),
            h["blobs_held"],
            mib(&h["bytes_held"]),
            format!("{}/{}", h["active_uploads"], h["max_uploads"]),
            success,
        );
    }
}

fn print_blobs(blobs: &Value) {
    println!(
        "{:<71} {:>7} {:>12} {:>8}",
        "BLOB", "HOLDERS", "MAX HELD MiB", "FETCHES"
    );
    for b in blobs.as_array().into_iter().flatten() {
        println!(
            "{:<71} {:>7} {:>12} {:>8}",
            b["blob"].as_str().unwrap_or(""),
            b["holders"],
            mib(&b["max_bytes_held"]),
            b["origin_fetches"]
        );
    }
}

fn print_fields(value: &Value) {
    for (k, v) in value.as_object().into_iter().flatten() {
        let shown = match v {
            Value::String(s) => s.clone(),
            Value::Null => "-".to_string(),
            other => other.to_string(),
        };
        println!("{k:<24} {shown}");
    }
}
