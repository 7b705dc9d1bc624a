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
    /// The CA certificate (PEM) an `https://` URL's certificate is checked against
    /// (default: the system's web roots).
    #[arg(long, env = "TESSERA_SCHEDULER_ADMIN_CA", value_name = "FILE")]
    ca_file: Option<PathBuf>,
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
    /// Blobs and how many hosts hold each (whole, when their size is known).
    Blobs,
    /// Images hosts use, and on how many each is complete.
    Images,
    /// Swarm totals: peer vs origin bytes, the offload ratio, lookups.
    Stats,
    /// Blocked hosts.
    Blocklist,
    /// Never offer this host as a peer again (kept across restarts).
    Block { id: String },
    /// Offer a blocked host as a peer again.
    Unblock { id: String },
    /// Stop offering a host as a peer until it registers again (before maintenance);
    /// its uploads under way finish.
    Drain { id: String },
    /// Offer a draining host as a peer again.
    Undrain { id: String },
    /// Have agents fetch a whole image into their caches now (they use their own
    /// registry credentials).
    Preheat {
        /// A Tessera image reference.
        image: String,
        /// How many hosts, at most 100000 (default: every host that matches).
        #[arg(long)]
        count: Option<usize>,
        /// Only hosts with this label (repeatable), e.g. `--label zone=eu-1a`.
        #[arg(long = "label", value_name = "KEY=VALUE")]
        labels: Vec<String>,
        /// `os/arch[/variant]` (default: each host's own).
        #[arg(long)]
        platform: Option<String>,
        /// Hosts that have not finished after this long fail: at most 86400, a day
        /// (default: an hour).
        #[arg(long, value_name = "SECONDS")]
        timeout_secs: Option<u64>,
        /// Wait for the job to finish, showing its progress; fail if it fails.
        #[arg(long)]
        wait: bool,
    },
    /// Preheat jobs, or one in full.
    Jobs { id: Option<String> },
}

/// The admin API over HTTP, with the bearer token.
struct Api {
    base: String,
    token: String,
    client: reqwest::Client,
}

impl Api {
    async fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let request = match method {
            "POST" => self.client.post(&url),
            _ => self.client.get(&url),
        };
        let request = match body {
            Some(b) => request.json(b),
            None => request,
        };
        let resp = request
            .bearer_auth(&self.token)
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
        Ok(body)
    }
}

pub fn run(args: AdminArgs) -> Result<()> {
    let token = std::fs::read_to_string(&args.token_file)
        .with_context(|| format!("read the token file {}", args.token_file.display()))?;
    let mut client = reqwest::Client::builder();
    if let Some(ca) = &args.ca_file {
        let pem = std::fs::read(ca).with_context(|| format!("read the CA {}", ca.display()))?;
        let cert = reqwest::Certificate::from_pem(&pem)
            .with_context(|| format!("{}: not a PEM certificate", ca.display()))?;
        client = client.add_root_certificate(cert);
    }
    let api = Api {
        base: args.url.trim_end_matches('/').to_string(),
        token: token.trim().to_string(),
        client: client.build().context("set up the HTTP client")?,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut body = None;
    let (method, path) = match &args.action {
        Action::Hosts => ("GET", "/api/v1/hosts".to_string()),
        Action::Host { id } => ("GET", format!("/api/v1/hosts/{id}")),
        Action::Blobs => ("GET", "/api/v1/blobs".to_string()),
        Action::Images => ("GET", "/api/v1/images".to_string()),
        Action::Stats => ("GET", "/api/v1/stats".to_string()),
        Action::Blocklist => ("GET", "/api/v1/blocklist".to_string()),
        Action::Block { id } => ("POST", format!("/api/v1/hosts/{id}/block")),
        Action::Unblock { id } => ("POST", format!("/api/v1/hosts/{id}/unblock")),
        Action::Drain { id } => ("POST", format!("/api/v1/hosts/{id}/drain")),
        Action::Undrain { id } => ("POST", format!("/api/v1/hosts/{id}/undrain")),
        Action::Jobs { id: None } => ("GET", "/api/v1/preheat".to_string()),
        Action::Jobs { id: Some(id) } => ("GET", format!("/api/v1/preheat/{id}")),
        Action::Preheat {
            image,
            count,
            labels,
            platform,
            timeout_secs,
            ..
        } => {
            let mut label_map = serde_json::Map::new();
            for l in labels {
                let (k, v) = l
                    .split_once('=')
                    .with_context(|| format!("--label {l:?}: expected KEY=VALUE"))?;
                label_map.insert(k.to_string(), Value::String(v.to_string()));
            }
            let mut request = serde_json::json!({ "image": image, "labels": label_map });
            if let Some(c) = count {
                request["count"] = (*c).into();
            }
            if let Some(p) = platform {
                request["platform"] = p.clone().into();
            }
            if let Some(t) = timeout_secs {
                request["timeout_secs"] = (*t).into();
            }
            body = Some(request);
            ("POST", "/api/v1/preheat".to_string())
        }
    };
    let mut value = runtime.block_on(api.call(method, &path, body.as_ref()))?;
    if let Action::Preheat { wait: true, .. } = args.action {
        value = runtime.block_on(wait_for(&api, &value))?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        match &args.action {
            Action::Hosts => print_hosts(&value),
            Action::Blobs => print_blobs(&value),
            Action::Images => print_images(&value),
            Action::Blocklist => {
                for id in value.as_array().into_iter().flatten() {
                    println!("{}", id.as_str().unwrap_or(""));
                }
            }
            Action::Block { id } => println!("{id}: blocked"),
            Action::Unblock { id } => println!("{id}: unblocked"),
            Action::Drain { id } => println!(
                "{id}: draining ({} uploads under way)",
                value["active_uploads"]
            ),
            Action::Undrain { id } => println!("{id}: no longer draining"),
            Action::Jobs { id: None } => print_jobs(&value),
            Action::Jobs { id: Some(_) } | Action::Preheat { .. } => print_job(&value),
            Action::Host { .. } | Action::Stats => print_fields(&value),
        }
    }
    if matches!(args.action, Action::Preheat { wait: true, .. }) && value["state"] != "succeeded" {
        bail!(
            "preheat job {} failed: {}",
            value["id"].as_str().unwrap_or("?"),
            value["error"].as_str().unwrap_or("no reason given")
        );
    }
    Ok(())
}

/// Polls a preheat job until it finishes, with a progress line on stderr.
async fn wait_for(api: &Api, job: &Value) -> Result<Value> {
    let id = job["id"]
        .as_str()
        .context("the answer has no job id")?
        .to_string();
    loop {
        let job = api
            .call("GET", &format!("/api/v1/preheat/{id}"), None)
            .await?;
        let (mut done, mut total) = (0, 0);
        for part in job["hosts"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(_, p)| p)
        {
            done += part["bytes_done"].as_u64().unwrap_or(0);
            total += part["bytes_total"].as_u64().unwrap_or(0);
        }
        let state = job["state"].as_str().unwrap_or("?");
        eprint!(
            "\rpreheat {id}: {state}, {} of {} MiB on {} host(s)   ",
            mib(&done.into()),
            mib(&total.into()),
            job["hosts"].as_object().map_or(0, serde_json::Map::len)
        );
        if state == "succeeded" || state == "failed" {
            eprintln!();
            return Ok(job);
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    }
}

fn print_jobs(jobs: &Value) {
    println!("{:<22} {:<10} {:>5}  IMAGE", "ID", "STATE", "HOSTS");
    for j in jobs.as_array().into_iter().flatten() {
        println!(
            "{:<22} {:<10} {:>5}  {}",
            j["id"].as_str().unwrap_or(""),
            j["state"].as_str().unwrap_or(""),
            j["hosts"].as_object().map_or(0, serde_json::Map::len),
            j["image"].as_str().unwrap_or("")
        );
    }
}

fn print_job(job: &Value) {
    println!(
        "job {} ({}): {}",
        job["id"].as_str().unwrap_or(""),
        job["image"].as_str().unwrap_or(""),
        job["state"].as_str().unwrap_or("")
    );
    println!(
        "{:<24} {:<10} {:>15} {:>12}  ERROR",
        "HOST", "STATE", "CHUNKS", "MiB"
    );
    for (host, p) in job["hosts"].as_object().into_iter().flatten() {
        println!(
            "{:<24} {:<10} {:>15} {:>12}  {}",
            host,
            p["state"].as_str().unwrap_or(""),
            format!("{}/{}", p["chunks_done"], p["chunks_total"]),
            format!("{}/{}", mib(&p["bytes_done"]), mib(&p["bytes_total"])),
            p["error"].as_str().unwrap_or("")
        );
    }
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
        } else if h["draining"] == true {
            "draining"
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
        "{:<71} {:>7} {:>6} {:>12} {:>8}",
        "BLOB", "HOLDERS", "WHOLE", "MAX HELD MiB", "FETCHES"
    );
    for b in blobs.as_array().into_iter().flatten() {
        println!(
            "{:<71} {:>7} {:>6} {:>12} {:>8}",
            b["blob"].as_str().unwrap_or(""),
            b["holders"],
            b["complete_holders"],
            mib(&b["max_bytes_held"]),
            b["origin_fetches"]
        );
    }
}

fn print_images(images: &Value) {
    println!("{:>5} {:>9} {:>9}  IMAGE", "HOSTS", "COMPLETE", "MiB");
    for i in images.as_array().into_iter().flatten() {
        println!(
            "{:>5} {:>9} {:>9}  {}",
            i["hosts"],
            i["complete_hosts"],
            if i["bytes"].is_null() {
                "-".to_string()
            } else {
                mib(&i["bytes"])
            },
            i["image"].as_str().unwrap_or("")
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
