//! The real `tessera-scheduler` binary on 127.0.0.1, driven with the generated gRPC
//! client: registration and leases, announcements, origin single-flight then peers,
//! and bad messages answered `invalid_argument` naming the field.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tessera_proto::pb;
use tessera_proto::pb::scheduler_client::SchedulerClient;

struct Scheduler {
    child: Child,
    addr: String,
}

impl Drop for Scheduler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Scheduler {
    start_with(&[])
}

fn start_with(extra: &[&str]) -> Scheduler {
    // The port is found free, then bound by the scheduler: another test may take it in
    // between, and that scheduler would answer the probe while this one has exited.
    // A scheduler that exits is started again on another port.
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera-scheduler"))
            .args(["--listen", &addr, "--origin-fetchers", "1"])
            .args(extra)
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "scheduler did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
        if child.try_wait().unwrap().is_none() {
            return Scheduler { child, addr };
        }
    }
    panic!("the scheduler kept exiting at start");
}

fn host(id: &str, port: u16) -> pb::Host {
    pb::Host {
        id: id.into(),
        address: format!("10.1.0.1:{port}"),
        labels: [("zone".to_string(), "a".to_string())].into(),
        upload_limit_bps: 0,
        max_uploads: 4,
    }
}

fn blob() -> String {
    format!("sha256:{}", "b".repeat(64))
}

#[test]
fn hosts_announce_and_find_each_other() {
    let scheduler = start();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut c = SchedulerClient::connect(format!("http://{}", scheduler.addr))
                .await
                .unwrap();
            for (id, port) in [("a", 1), ("b", 2), ("c", 3)] {
                let lease = c
                    .register(pb::RegisterRequest {
                        host: Some(host(id, port)),
                    })
                    .await
                    .unwrap()
                    .into_inner()
                    .lease_ms;
                assert!(lease > 0);
            }
            let find = |id: &str| pb::FindPeersRequest {
                host_id: id.into(),
                blob: blob(),
                range: Some(pb::ByteRange {
                    start: 0,
                    end: 1000,
                }),
            };
            // Nobody holds it: one goes to the origin, the next waits.
            let first = c.find_peers(find("a")).await.unwrap().into_inner();
            assert_eq!(first.action(), pb::Action::Origin);
            let second = c.find_peers(find("b")).await.unwrap().into_inner();
            assert_eq!(second.action(), pb::Action::Wait);
            assert!(second.wait_ms > 0);
            // The origin fetcher announces; the waiter is sent to it.
            c.announce(pb::AnnounceRequest {
                host_id: "a".into(),
                held: vec![pb::BlobRanges {
                    blob: blob(),
                    ranges: vec![pb::ByteRange {
                        start: 0,
                        end: 4096,
                    }],
                    size: 0,
                }],
                full: false,
                dropped: vec![],
                ..Default::default()
            })
            .await
            .unwrap();
            let third = c.find_peers(find("b")).await.unwrap().into_inner();
            assert_eq!(third.action(), pb::Action::Peers);
            assert_eq!(third.peers[0].host_id, "a");
            assert_eq!(third.peers[0].address, "10.1.0.1:1");

            // Bad messages name the field.
            let e = c
                .register(pb::RegisterRequest {
                    host: Some(pb::Host {
                        address: "nowhere".into(),
                        ..host("d", 4)
                    }),
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains("host.address"), "{}", e.message());
            let e = c
                .find_peers(pb::FindPeersRequest {
                    blob: "sha256:xyz".into(),
                    ..find("a")
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains("blob"), "{}", e.message());

            // Unknown hosts are told to register again.
            let hb = c
                .heartbeat(pb::HeartbeatRequest {
                    host_id: "stranger".into(),
                    active_uploads: 0,
                    upload_bps: 0,
                    preheats: Vec::new(),
                })
                .await
                .unwrap()
                .into_inner();
            assert!(hb.reregister);
            c.leave(pb::LeaveRequest {
                host_id: "a".into(),
            })
            .await
            .unwrap();
            let after = c.find_peers(find("b")).await.unwrap().into_inner();
            assert_ne!(
                after.action(),
                pb::Action::Peers,
                "a left but is still offered"
            );
        });
}

/// With `--token-file`, every call needs `authorization: Bearer <token>`; the refusal
/// says what to configure and never echoes a token.
#[test]
fn a_token_file_makes_the_token_required() {
    use tessera_proto::auth::{AddBearer, Token};
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("token");
    std::fs::write(&file, "swarm-secret\n").unwrap();
    let s = start_with(&["--token-file", file.to_str().unwrap()]);
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", s.addr))
                .unwrap()
                .connect()
                .await
                .unwrap();
            let register = pb::RegisterRequest {
                host: Some(host("h1", 7001)),
            };
            // Every call, without a token and with a wrong one.
            for token in [None, Token::new("guess")] {
                let mut client = SchedulerClient::with_interceptor(
                    channel.clone(),
                    AddBearer::new(token.as_ref()).unwrap(),
                );
                let answers = [
                    client.register(register.clone()).await.map(drop),
                    client
                        .heartbeat(pb::HeartbeatRequest {
                            host_id: "h1".into(),
                            ..Default::default()
                        })
                        .await
                        .map(drop),
                    client
                        .announce(pb::AnnounceRequest {
                            host_id: "h1".into(),
                            ..Default::default()
                        })
                        .await
                        .map(drop),
                    client
                        .find_peers(pb::FindPeersRequest {
                            host_id: "h1".into(),
                            blob: blob(),
                            range: Some(pb::ByteRange { start: 0, end: 1 }),
                        })
                        .await
                        .map(drop),
                    client
                        .report(pb::ReportRequest {
                            host_id: "h1".into(),
                            transfers: vec![],
                        })
                        .await
                        .map(drop),
                    client
                        .leave(pb::LeaveRequest {
                            host_id: "h1".into(),
                        })
                        .await
                        .map(drop),
                ];
                for (call, answer) in answers.into_iter().enumerate() {
                    let e = answer.unwrap_err();
                    assert_eq!(e.code(), tonic::Code::Unauthenticated, "call {call}: {e}");
                    assert!(!e.message().contains("swarm-secret"));
                    assert!(e.message().contains("token"), "{}", e.message());
                }
            }
            let token = Token::new("swarm-secret");
            let mut client =
                SchedulerClient::with_interceptor(channel, AddBearer::new(token.as_ref()).unwrap());
            client.register(register).await.unwrap();
        });
}
