//! The real `tessera-scheduler` binary with its admin API on 127.0.0.1: tokens and
//! scopes, blocking hosts (kept across a restart, and a blocked host never offered as
//! a peer), preheat jobs handed to hosts in heartbeat answers and finished by their
//! reports, malformed and oversized requests, metrics, health and readiness, the
//! `admin` CLI, and no token in the logs.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tessera_proto::pb;
use tessera_proto::pb::scheduler_client::SchedulerClient;

const ADMIN_TOKEN: &str = "admin-token-5b1d0c7e";
const READ_TOKEN: &str = "read-token-93fa2e11";

struct Scheduler {
    child: Option<Child>,
    grpc: String,
    admin: String,
    state: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Scheduler {
    fn start() -> Scheduler {
        Scheduler::start_with(&[])
    }

    /// Started with `extra` flags too.
    fn start_with(extra: &[&str]) -> Scheduler {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("admin.token"), format!("{ADMIN_TOKEN}\n")).unwrap();
        std::fs::write(dir.path().join("read.token"), READ_TOKEN).unwrap();
        let mut s = Scheduler {
            child: None,
            grpc: format!("127.0.0.1:{}", free_port()),
            admin: format!("127.0.0.1:{}", free_port()),
            state: dir.path().join("state"),
            log: dir.path().join("scheduler.log"),
            dir,
            extra: extra.iter().map(|a| a.to_string()).collect(),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
            .args(["--listen", &self.grpc, "--admin-listen", &self.admin])
            .arg("--admin-token-file")
            .arg(self.dir.path().join("admin.token"))
            .arg("--admin-read-token-file")
            .arg(self.dir.path().join("read.token"))
            .arg("--state-dir")
            .arg(&self.state)
            .args(&self.extra)
            .env("TESSERA_LOG", "debug")
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while request(&self.admin, "GET", "/readyz", None, b"").0 != 200 {
            assert!(
                Instant::now() < deadline,
                "scheduler not ready:\n{}",
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn get(&self, path: &str, token: &str) -> (u16, Value) {
        let (status, body) = request(&self.admin, "GET", path, Some(token), b"");
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    fn post(&self, path: &str, token: &str, body: &str) -> (u16, Value) {
        let (status, body) = request(&self.admin, "POST", path, Some(token), body.as_bytes());
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    }

    async fn client(&self) -> SchedulerClient<tonic::transport::Channel> {
        SchedulerClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One HTTP/1.1 request over a fresh connection: (status, body).
fn request(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String) {
    let (status, _, body) = exchange(addr, method, path, token, body);
    (status, body)
}

/// One HTTP/1.1 request over a fresh connection: (status, head, body).
fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: &[u8],
) -> (u16, String, String) {
    let Ok(mut stream) = std::net::TcpStream::connect(addr) else {
        return (0, String::new(), String::new());
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    if stream.write_all(head.as_bytes()).is_err() {
        return (0, String::new(), String::new());
    }
    // The server may answer (413) before reading all of a huge body.
    let _ = stream.write_all(body);
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_lowercase(), body.to_string())
}

fn host(id: &str, zone: &str) -> pb::Host {
    pb::Host {
        id: id.into(),
        address: format!("10.1.0.{}:7081", id.len()),
        labels: [("zone".to_string(), zone.to_string())].into(),
        upload_limit_bps: 0,
        max_uploads: 4,
    }
}

fn blob() -> String {
    format!("sha256:{}", "c".repeat(64))
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
}

/// Registers `ids`; the first announces the blob.
async fn populate(c: &mut SchedulerClient<tonic::transport::Channel>, ids: &[&str]) {
    for id in ids {
        c.register(pb::RegisterRequest {
            host: Some(host(id, "z1")),
        })
        .await
        .unwrap();
    }
    c.announce(pb::AnnounceRequest {
        host_id: ids[0].into(),
        held: vec![pb::BlobRanges {
            blob: blob(),
            ranges: vec![pb::ByteRange {
                start: 0,
                end: 1 << 20,
            }],
            size: 0,
        }],
        full: false,
        dropped: vec![],
        ..Default::default()
    })
    .await
    .unwrap();
}

async fn peers_for(c: &mut SchedulerClient<tonic::transport::Channel>, asker: &str) -> Vec<String> {
    let answer = c
        .find_peers(pb::FindPeersRequest {
            host_id: asker.into(),
            blob: blob(),
            range: Some(pb::ByteRange {
                start: 0,
                end: 4096,
            }),
        })
        .await
        .unwrap()
        .into_inner();
    answer.peers.into_iter().map(|p| p.host_id).collect()
}

#[test]
fn every_endpoint_but_health_refuses_a_missing_or_wrong_token() {
    let s = Scheduler::start();
    assert_eq!(request(&s.admin, "GET", "/healthz", None, b"").0, 200);
    assert_eq!(request(&s.admin, "GET", "/readyz", None, b"").0, 200);
    let endpoints = [
        ("GET", "/metrics"),
        ("GET", "/api/v1/hosts"),
        ("GET", "/api/v1/hosts/a"),
        ("GET", "/api/v1/blobs"),
        ("GET", "/api/v1/stats"),
        ("GET", "/api/v1/blocklist"),
        ("GET", "/api/v1/preheat"),
        ("GET", "/api/v1/preheat/ph-1"),
        ("POST", "/api/v1/hosts/a/block"),
        ("POST", "/api/v1/hosts/a/unblock"),
        ("POST", "/api/v1/hosts/a/drain"),
        ("POST", "/api/v1/hosts/a/undrain"),
        ("POST", "/api/v1/preheat"),
    ];
    let preheat = br#"{"image": "127.0.0.1:5000/app:v1"}"#;
    for (method, path) in endpoints {
        for token in [None, Some("wrong"), Some("")] {
            let (status, body) = request(&s.admin, method, path, token, preheat);
            assert_eq!(status, 401, "{method} {path} with {token:?}: {body}");
            let why: Value = serde_json::from_str(&body).unwrap();
            assert!(why["error"].as_str().unwrap().contains("token"), "{body}");
        }
    }
    let (_, head, _) = exchange(&s.admin, "GET", "/api/v1/hosts", None, b"");
    assert!(head.contains("www-authenticate: bearer"), "{head}");
    // The read token reads but changes nothing.
    assert_eq!(s.get("/api/v1/hosts", READ_TOKEN).0, 200);
    let (status, head, _) = exchange(&s.admin, "GET", "/metrics", Some(READ_TOKEN), b"");
    assert_eq!(status, 200);
    assert!(
        head.contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    // HEAD is a read.
    assert_eq!(
        request(&s.admin, "HEAD", "/api/v1/stats", Some(READ_TOKEN), b"").0,
        200
    );
    for (method, path) in endpoints.iter().filter(|(m, _)| *m == "POST") {
        let (status, body) = request(&s.admin, method, path, Some(READ_TOKEN), preheat);
        assert_eq!(status, 403, "{method} {path}: {body}");
    }
    assert_eq!(
        s.get("/api/v1/preheat", ADMIN_TOKEN).1,
        serde_json::json!([])
    );
    // Rotating a token file takes effect at the next request.
    std::fs::write(s.dir.path().join("read.token"), "rotated-read-token").unwrap();
    assert_eq!(s.get("/api/v1/hosts", READ_TOKEN).0, 401);
    assert_eq!(s.get("/api/v1/hosts", "rotated-read-token").0, 200);
    let log = s.log_text();
    for secret in [ADMIN_TOKEN, READ_TOKEN, "rotated-read-token"] {
        assert!(!log.contains(secret), "a token is in the log:\n{log}");
    }
}

#[test]
fn a_blocked_host_is_not_offered_as_a_peer_even_after_a_restart() {
    let mut s = Scheduler::start();
    let rt = runtime();
    rt.block_on(async {
        let mut c = s.client().await;
        populate(&mut c, &["holder", "asker"]).await;
        assert_eq!(peers_for(&mut c, "asker").await, vec!["holder"]);
    });
    let (status, hosts) = s.get("/api/v1/hosts", ADMIN_TOKEN);
    assert_eq!(status, 200);
    let ids: Vec<&str> = hosts
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["asker", "holder"]);
    let holder = &hosts[1];
    assert_eq!(holder["labels"]["zone"], "z1");
    assert_eq!(holder["bytes_held"], 1 << 20);
    assert_eq!(holder["blocked"], false);
    let (_, blobs) = s.get("/api/v1/blobs", READ_TOKEN);
    assert_eq!(blobs[0]["blob"], blob());
    assert_eq!(blobs[0]["holders"], 1);

    let (status, answer) = s.post("/api/v1/hosts/holder/block", ADMIN_TOKEN, "");
    assert_eq!(status, 200, "{answer}");
    assert_eq!(answer["blocked"], true);
    assert_eq!(s.get("/api/v1/hosts/holder", READ_TOKEN).1["blocked"], true);
    assert_eq!(
        s.get("/api/v1/blocklist", READ_TOKEN).1,
        serde_json::json!(["holder"])
    );
    rt.block_on(async {
        let mut c = s.client().await;
        assert!(peers_for(&mut c, "asker").await.is_empty());
    });

    // The blocklist outlives the process; the hosts come back on their own.
    s.restart();
    assert_eq!(
        s.get("/api/v1/blocklist", READ_TOKEN).1,
        serde_json::json!(["holder"])
    );
    rt.block_on(async {
        let mut c = s.client().await;
        populate(&mut c, &["holder", "asker"]).await;
        assert!(peers_for(&mut c, "asker").await.is_empty());
    });
    let (_, stats) = s.get("/api/v1/stats", READ_TOKEN);
    assert_eq!(stats["blocked_hosts"], 1, "{stats}");
    assert_eq!(stats["hosts"], 2, "{stats}");

    let (status, _) = s.post("/api/v1/hosts/holder/unblock", ADMIN_TOKEN, "");
    assert_eq!(status, 200);
    rt.block_on(async {
        let mut c = s.client().await;
        assert_eq!(peers_for(&mut c, "asker").await, vec!["holder"]);
    });
    let (status, why) = s.post("/api/v1/hosts/holder/unblock", ADMIN_TOKEN, "");
    assert_eq!(status, 404, "{why}");
    assert!(why["error"].as_str().unwrap().contains("not blocked"));

    // Draining: not offered until undrained or registered again; not kept.
    let (status, view) = s.post("/api/v1/hosts/holder/drain", ADMIN_TOKEN, "");
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["draining"], true);
    rt.block_on(async {
        let mut c = s.client().await;
        assert!(peers_for(&mut c, "asker").await.is_empty());
    });
    let (status, view) = s.post("/api/v1/hosts/holder/undrain", ADMIN_TOKEN, "");
    assert_eq!((status, &view["draining"]), (200, &Value::Bool(false)));
    s.post("/api/v1/hosts/holder/drain", ADMIN_TOKEN, "");
    rt.block_on(async {
        let mut c = s.client().await;
        populate(&mut c, &["holder"]).await;
        assert_eq!(peers_for(&mut c, "asker").await, vec!["holder"]);
    });
    let (status, why) = s.post("/api/v1/hosts/nobody/drain", ADMIN_TOKEN, "");
    assert_eq!(status, 404, "{why}");
}

#[test]
fn malformed_unknown_and_oversized_requests_get_4xx_with_a_reason() {
    let s = Scheduler::start();
    let cases: [(&str, &str, &str, u16, &str); 9] = [
        (
            "POST",
            "/api/v1/hosts/nobody/block",
            "",
            404,
            "no registered host",
        ),
        ("GET", "/api/v1/hosts/nobody", "", 404, "no registered host"),
        ("GET", "/api/v1/preheat/ph-none", "", 404, "no preheat job"),
        ("GET", "/api/v1/nothing", "", 404, "no such endpoint"),
        (
            "POST",
            "/api/v1/preheat",
            "{not json",
            400,
            "preheat request",
        ),
        ("POST", "/api/v1/preheat", r#"{"count": 1}"#, 400, "image"),
        (
            "POST",
            "/api/v1/preheat",
            r#"{"image": "reg/app:v1", "colour": "red"}"#,
            400,
            "colour",
        ),
        (
            "POST",
            "/api/v1/preheat",
            r#"{"image": "reg/a pp:v1"}"#,
            400,
            "cannot appear",
        ),
        // Nobody registered: the job could not run anywhere.
        (
            "POST",
            "/api/v1/preheat",
            r#"{"image": "reg/app:v1", "count": 2}"#,
            409,
            "0 registered",
        ),
    ];
    for (method, path, body, want, reason) in cases {
        let (status, answer) = request(&s.admin, method, path, Some(ADMIN_TOKEN), body.as_bytes());
        assert_eq!(status, want, "{method} {path} {body}: {answer}");
        let why: Value = serde_json::from_str(&answer).unwrap();
        let why = why["error"].as_str().unwrap();
        assert!(why.contains(reason), "{method} {path} {body}: {why}");
    }
    let huge = vec![b'x'; 1 << 20];
    let (status, answer) = request(
        &s.admin,
        "POST",
        "/api/v1/preheat",
        Some(ADMIN_TOKEN),
        &huge,
    );
    assert_eq!(status, 413, "{answer}");
    // Still serving.
    assert_eq!(s.get("/api/v1/stats", ADMIN_TOKEN).0, 200);
}

#[test]
fn preheat_requests_with_nonsense_values_get_400_naming_the_field_and_value() {
    let s = Scheduler::start();
    let rt = runtime();
    rt.block_on(async {
        let mut c = s.client().await;
        populate(&mut c, &["h1", "h2"]).await;
    });
    // Hosts are there, so each of these would have been a job had it not been refused.
    let cases = [
        (
            r#"{"image": "../../etc/passwd"}"#,
            r#"image: invalid image reference "../../etc/passwd": the registry host"#,
        ),
        (
            r#"{"image": "reg.example/App:v1"}"#,
            "image: invalid image reference \"reg.example/App:v1\": repository components",
        ),
        (
            r#"{"image": "reg.example/app:v1", "timeout_secs": 18446744073709551615}"#,
            "timeout_secs: must be 1 to 86400 (24 h), not 18446744073709551615",
        ),
        (
            r#"{"image": "reg.example/app:v1", "timeout_secs": 0}"#,
            "timeout_secs: must be 1 to 86400 (24 h), not 0",
        ),
        (
            r#"{"image": "reg.example/app:v1", "count": 100001}"#,
            "count: must be 1 to 100000, not 100001",
        ),
    ];
    for (body, reason) in cases {
        let (status, answer) = s.post("/api/v1/preheat", ADMIN_TOKEN, body);
        assert_eq!(status, 400, "{body}: {answer}");
        let why = answer["error"].as_str().unwrap_or_default();
        assert!(why.contains(reason), "{body}: {why}");
    }
    assert_eq!(
        s.get("/api/v1/preheat", ADMIN_TOKEN).1,
        serde_json::json!([])
    );
    // At the bound it is a job.
    let (status, job) = s.post(
        "/api/v1/preheat",
        ADMIN_TOKEN,
        r#"{"image": "reg.example/app:v1", "timeout_secs": 86400}"#,
    );
    assert_eq!(status, 202, "{job}");
    assert_eq!(job["timeout_secs"], 86400);
}

#[test]
fn preheat_jobs_reach_the_chosen_hosts_and_end_with_their_reports() {
    let mut s = Scheduler::start();
    let rt = runtime();
    rt.block_on(async {
        let mut c = s.client().await;
        populate(&mut c, &["h1", "h2", "h3", "h4", "h5"]).await;
    });
    let (status, job) = s.post(
        "/api/v1/preheat",
        ADMIN_TOKEN,
        r#"{"image": "reg.example:5000/app:v1", "count": 3}"#,
    );
    assert_eq!(status, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    assert_eq!(job["state"], "pending");
    let chosen: Vec<String> = job["hosts"].as_object().unwrap().keys().cloned().collect();
    assert_eq!(chosen.len(), 3);

    let grpc = format!("http://{}", s.grpc);
    let beat = |host: &str, preheats: Vec<pb::PreheatProgress>| {
        rt.block_on(async {
            let mut c = SchedulerClient::connect(grpc.clone()).await.unwrap();
            c.heartbeat(pb::HeartbeatRequest {
                host_id: host.into(),
                active_uploads: 0,
                upload_bps: 0,
                preheats,
            })
            .await
            .unwrap()
            .into_inner()
            .preheats
        })
    };
    let progress = |state: pb::PreheatState, done: u64| pb::PreheatProgress {
        job_id: id.clone(),
        state: state.into(),
        chunks_done: done,
        chunks_total: 8,
        bytes_done: done << 20,
        bytes_total: 8 << 20,
        error: String::new(),
    };
    for host in ["h1", "h2", "h3", "h4", "h5"] {
        let tasks = beat(host, vec![]);
        if chosen.iter().any(|c| c == host) {
            assert_eq!(tasks.len(), 1, "{host}");
            assert_eq!(tasks[0].job_id, id);
            assert_eq!(tasks[0].image, "reg.example:5000/app:v1");
        } else {
            assert!(tasks.is_empty(), "{host} was not chosen but got {tasks:?}");
        }
    }
    // Picked up: no longer handed out; progress shows.
    assert!(beat(&chosen[0], vec![progress(pb::PreheatState::Running, 2)]).is_empty());
    let (_, now) = s.get(&format!("/api/v1/preheat/{id}"), READ_TOKEN);
    assert_eq!(now["state"], "running");
    assert_eq!(now["hosts"][&chosen[0]]["chunks_done"], 2);

    // The job is kept: after a restart it is still there and handed out again to hosts
    // that have not reported it.
    s.restart();
    rt.block_on(async {
        let mut c = s.client().await;
        populate(&mut c, &["h1", "h2", "h3", "h4", "h5"]).await;
    });
    assert_eq!(beat(&chosen[1], vec![]).len(), 1);
    for host in &chosen {
        beat(host, vec![progress(pb::PreheatState::Succeeded, 8)]);
    }
    let (_, done) = s.get(&format!("/api/v1/preheat/{id}"), READ_TOKEN);
    assert_eq!(done["state"], "succeeded", "{done}");
    for host in &chosen {
        assert_eq!(done["hosts"][host]["bytes_done"], 8 << 20);
    }

    // A job that fails says why, host by host; the CLI exits non-zero for it.
    let token_file = s.dir.path().join("admin.token");
    let cli = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
            .args(["admin", "--url", &format!("http://{}", s.admin)])
            .arg("--token-file")
            .arg(&token_file)
            .args(args)
            .output()
            .unwrap()
    };
    let out = cli(&[
        "--json",
        "preheat",
        "reg.example:5000/missing:v1",
        "--count",
        "1",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failing: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failing_id = failing["id"].as_str().unwrap().to_string();
    let target = failing["hosts"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    beat(
        &target,
        vec![pb::PreheatProgress {
            job_id: failing_id.clone(),
            state: pb::PreheatState::Failed.into(),
            error: "manifest unknown: reg.example:5000/missing:v1".into(),
            ..Default::default()
        }],
    );
    let (_, failed) = s.get(&format!("/api/v1/preheat/{failing_id}"), READ_TOKEN);
    assert_eq!(failed["state"], "failed");
    let error = failed["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("{target}: manifest unknown")),
        "{error}"
    );

    let out = cli(&["jobs"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        table.contains(&id) && table.contains("succeeded"),
        "{table}"
    );
    assert!(
        table.contains(&failing_id) && table.contains("failed"),
        "{table}"
    );
    let out = cli(&["hosts"]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("h5") && table.contains("z1"), "{table}");
    let out = cli(&["block", "nobody"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("404") && err.contains("no registered host"),
        "{err}"
    );

    // Metrics count jobs and lookups.
    let (status, text) = request(&s.admin, "GET", "/metrics", Some(READ_TOKEN), b"");
    assert_eq!(status, 200);
    for line in [
        "tessera_scheduler_hosts 5",
        "tessera_scheduler_preheat_jobs{state=\"succeeded\"} 1",
        "tessera_scheduler_preheat_jobs{state=\"failed\"} 1",
        "# TYPE tessera_scheduler_lookups counter",
    ] {
        assert!(text.contains(line), "no {line:?} in\n{text}");
    }
}

#[test]
fn with_a_certificate_the_admin_api_speaks_only_tls() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
        ])
        .args(["-nodes", "-days", "1", "-subj", "/CN=127.0.0.1"])
        .args(["-addext", "subjectAltName=IP:127.0.0.1"])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl is needed (apt-get install openssl; make test installs it)");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let token = dir.path().join("admin.token");
    std::fs::write(&token, ADMIN_TOKEN).unwrap();
    let (grpc, admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args(["--listen", &grpc, "--admin-listen", &admin])
        .arg("--admin-token-file")
        .arg(&token)
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .arg("--tls-cert")
        .arg(&cert)
        .arg("--tls-key")
        .arg(&key)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let cli = |ca: Option<&std::path::Path>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"));
        c.args([
            "admin",
            "--url",
            &format!("https://{admin}"),
            "--token-file",
        ])
        .arg(&token);
        if let Some(ca) = ca {
            c.arg("--ca-file").arg(ca);
        }
        c.args(["--json", "stats"]).output().unwrap()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = cli(Some(&cert));
        if out.status.success() || Instant::now() > deadline {
            break out;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stats: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    // Plain HTTP gets no answer, and a client that does not trust the CA is refused.
    let plain = request(&admin, "GET", "/healthz", None, b"");
    let untrusted = cli(None);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        out.status.success() && stats["hosts"] == 0,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_ne!(plain.0, 200, "plain HTTP was answered: {plain:?}");
    assert!(!untrusted.status.success());
    let err = String::from_utf8_lossy(&untrusted.stderr);
    assert!(err.contains("call https://"), "{err}");
}

/// SIGTERM stops the scheduler in order even as PID 1 of its own PID namespace, as in a
/// container, where a signal without a handler is ignored; the state is closed cleanly
/// (a new scheduler opens it at once).
#[test]
fn sigterm_stops_it_even_as_pid_1() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admin.token"), ADMIN_TOKEN).unwrap();
    let (grpc, admin) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let log_path = dir.path().join("pid1.log");
    let log = std::fs::File::create(&log_path).unwrap();
    let mut unshare = Command::new("unshare")
        .args(["--pid", "--fork", "--kill-child", "--"])
        .arg(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args(["--listen", &grpc, "--admin-listen", &admin])
        .arg("--admin-token-file")
        .arg(dir.path().join("admin.token"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .env("TESSERA_LOG", "info")
        .stderr(Stdio::from(log))
        .spawn()
        .expect("run unshare (Debian util-linux)");
    let log_text = || std::fs::read_to_string(&log_path).unwrap_or_default();
    // unshare's only child is the scheduler, PID 1 inside; ready when its admin API is.
    let deadline = Instant::now() + Duration::from_secs(10);
    let scheduler = loop {
        let children =
            std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", unshare.id()))
                .unwrap_or_default();
        if let Some(pid) = children.split_whitespace().next() {
            if request(&admin, "GET", "/readyz", None, b"").0 == 200 {
                break pid.to_string();
            }
        }
        assert!(
            unshare.try_wait().unwrap().is_none() && Instant::now() < deadline,
            "the scheduler as PID 1 never became ready:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    let sent = Command::new("kill")
        .args(["-TERM", &scheduler])
        .status()
        .unwrap();
    assert!(sent.success());
    let deadline = Instant::now() + Duration::from_secs(5);
    let status = loop {
        if let Some(status) = unshare.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = unshare.kill();
            panic!("SIGTERM did not stop the scheduler running as PID 1");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "exit: {status}\n{}", log_text());
    assert!(log_text().contains("shutting down"), "{}", log_text());

    // The state was closed: a scheduler on the same directory starts at once.
    let admin = format!("127.0.0.1:{}", free_port());
    let mut again = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
        .args(["--listen", &format!("127.0.0.1:{}", free_port())])
        .args(["--admin-listen", &admin])
        .arg("--admin-token-file")
        .arg(dir.path().join("admin.token"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while request(&admin, "GET", "/readyz", None, b"").0 != 200 {
        if Instant::now() > deadline || again.try_wait().unwrap().is_some() {
            let _ = again.kill();
            panic!("a scheduler on the same state directory did not start");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = again.kill();
    let _ = again.wait();
}

/// Idle and slow clients cannot hold the scheduler's listeners: 30 idle connections to
/// each of the gRPC port and the admin API (capped at 20) are refused past the cap and
/// counted, closed after the 2 s idle timeout (its descriptors back to where they
/// were), and then agents and operators are served again; a request head sent one byte
/// a second is cut off.
#[test]
fn idle_connection_floods_are_bounded_and_reclaimed() {
    let s = Scheduler::start_with(&["--max-connections", "20", "--idle-timeout-secs", "2"]);
    let pid = s.child.as_ref().unwrap().id();
    let fds = || {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .count()
    };
    let before = fds();
    let mut held = Vec::new();
    for addr in [&s.grpc, &s.admin] {
        for _ in 0..30 {
            held.push(std::net::TcpStream::connect(addr.as_str()).unwrap());
        }
    }
    std::thread::sleep(Duration::from_secs(4));
    let after = fds();
    assert!(
        after <= before + 4,
        "{after} descriptors with idle connections held past the timeout, {before} before"
    );
    drop(held);

    let (status, metrics) = request(&s.admin, "GET", "/metrics", Some(READ_TOKEN), b"");
    assert_eq!(status, 200, "{metrics}");
    for listener in ["grpc", "admin"] {
        let line =
            format!("tessera_scheduler_connections_refused_total{{listener=\"{listener}\"}}");
        let refused: u64 = metrics
            .lines()
            .find_map(|l| l.strip_prefix(&line))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {line} in:\n{metrics}"));
        assert!(
            refused >= 10,
            "{listener}: {refused} refused of 30 over a cap of 20"
        );
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let mut client = s.client().await;
        let answer = client
            .register(pb::RegisterRequest {
                host: Some(host("after-flood", "z1")),
            })
            .await;
        assert!(answer.is_ok(), "{answer:?}");
    });

    let mut slow = std::net::TcpStream::connect(s.admin.as_str()).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let started = Instant::now();
    let mut cut_off = false;
    for b in "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n".bytes() {
        if slow.write_all(&[b]).is_err() {
            cut_off = true;
            break;
        }
        match slow.read(&mut [0u8; 64]) {
            Ok(0) => {
                cut_off = true;
                break;
            }
            Err(e)
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::TimedOut =>
            {
                cut_off = true;
                break;
            }
            _ => {}
        }
    }
    assert!(cut_off, "a one-byte-a-second request head was not cut off");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(!s.log_text().contains("panicked"), "{}", s.log_text());
}
