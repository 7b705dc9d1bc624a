//! The peer service serving this node's verified cache to another agent over real
//! gRPC on 127.0.0.1: chunks by digest, missing ones skipped, bad requests named,
//! uploads bounded in number and bandwidth.

#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use rafs_format::chunk::DigestAlgo;
use tessera_agent::cache::{ChunkCache, ChunkKey};
use tessera_agent::peer::server::{PeerServer, UploadLimits};
use tessera_proto::pb;
use tessera_proto::pb::peer_service_client::PeerServiceClient;
use tessera_proto::pb::peer_service_server::PeerServiceServer;

fn chunk(seed: u8, len: usize) -> (ChunkKey, Vec<u8>) {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    let key = ChunkKey {
        algo: DigestAlgo::Sha256,
        digest: DigestAlgo::Sha256.digest(&data),
    };
    (key, data)
}

async fn serve(cache: Arc<ChunkCache>, limits: UploadLimits) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PeerServiceServer::new(PeerServer::new(cache, limits)))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    format!("http://{addr}")
}

fn request(keys: &[&ChunkKey]) -> pb::FetchChunksRequest {
    pb::FetchChunksRequest {
        digest_algorithm: "sha256".into(),
        digests: keys.iter().map(|k| k.digest.to_vec()).collect(),
        accept_encodings: Vec::new(),
        access: None,
    }
}

#[test]
fn peers_get_verified_chunks_within_limits() {
    let t = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(t.path(), 64 << 20).unwrap());
    let (a, da) = chunk(1, 1 << 20);
    let (b, db) = chunk(2, 1 << 20);
    let (missing, _) = chunk(3, 100);
    cache.put(&a, &da).unwrap();
    cache.put(&b, &db).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let url = serve(
                cache.clone(),
                UploadLimits {
                    max_uploads: 4,
                    bytes_per_sec: Some(2 << 20),
                    corrupt: false,
                    compress: false,
                },
            )
            .await;
            let mut client = PeerServiceClient::connect(url).await.unwrap();
            let started = Instant::now();
            let mut stream = client
                .fetch_chunks(request(&[&a, &missing, &b]))
                .await
                .unwrap()
                .into_inner();
            let mut got = Vec::new();
            while let Some(c) = stream.message().await.unwrap() {
                got.push(c);
            }
            // What it has, in order; what it lacks, skipped.
            assert_eq!(got.len(), 2);
            assert_eq!(got[0].digest, a.digest.to_vec());
            assert!(got[0].data == da && got[1].data == db);
            // 2 MiB at 2 MiB/s: the first MiB goes at once, the second waits its turn.
            assert!(
                started.elapsed() >= Duration::from_millis(400),
                "{:?}",
                started.elapsed()
            );

            let e = client
                .fetch_chunks(pb::FetchChunksRequest {
                    digest_algorithm: "md5".into(),
                    digests: vec![vec![0; 32]],
                    accept_encodings: Vec::new(),
                    access: None,
                })
                .await
                .unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument);
            assert!(e.message().contains("digest_algorithm"), "{}", e.message());
        });
}

/// A peer that compresses uploads sends zstd to requesters that decode it, when it
/// pays (the byte pattern compresses; random bytes go plain), and plain bytes to the
/// others.
#[test]
fn compressed_uploads_go_to_those_who_decode_them() {
    let t = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(t.path(), 64 << 20).unwrap());
    let (a, da) = chunk(1, 1 << 20);
    let random = support::oci::pseudo_random(1 << 20, 77);
    let b = ChunkKey {
        algo: DigestAlgo::Sha256,
        digest: DigestAlgo::Sha256.digest(&random),
    };
    cache.put(&a, &da).unwrap();
    cache.put(&b, &random).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let url = serve(
                cache.clone(),
                UploadLimits {
                    max_uploads: 4,
                    bytes_per_sec: None,
                    corrupt: false,
                    compress: true,
                },
            )
            .await;
            let mut client = PeerServiceClient::connect(url).await.unwrap();
            let fetch = |accept: Vec<String>| {
                let mut client = client.clone();
                let request = pb::FetchChunksRequest {
                    accept_encodings: accept,
                    ..request(&[&a, &b])
                };
                async move {
                    let mut stream = client.fetch_chunks(request).await.unwrap().into_inner();
                    let mut got = Vec::new();
                    while let Some(c) = stream.message().await.unwrap() {
                        got.push(c);
                    }
                    got
                }
            };
            let packed = fetch(vec!["br".into(), "zstd".into()]).await;
            assert_eq!(packed[0].encoding, "zstd");
            assert!(
                packed[0].data.len() < da.len() / 10,
                "{}",
                packed[0].data.len()
            );
            assert_eq!(
                zstd::bulk::decompress(&packed[0].data, 1 << 20).unwrap(),
                da
            );
            assert_eq!(packed[1].encoding, "", "random bytes do not pay");
            assert!(packed[1].data == random);
            let plain = fetch(vec![]).await;
            assert_eq!(
                (plain[0].encoding.as_str(), plain[1].encoding.as_str()),
                ("", "")
            );
            assert!(plain[0].data == da);
            let _ = &mut client;
        });
}

#[test]
fn a_busy_peer_says_so() {
    let t = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(t.path(), 64 << 20).unwrap());
    let (a, da) = chunk(9, 1 << 20);
    cache.put(&a, &da).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            // One upload at a time, slowly: a second request meanwhile is refused.
            let url = serve(
                cache,
                UploadLimits {
                    max_uploads: 1,
                    bytes_per_sec: Some(1 << 20),
                    corrupt: false,
                    compress: false,
                },
            )
            .await;
            let mut first = PeerServiceClient::connect(url.clone()).await.unwrap();
            let mut slow = first
                .fetch_chunks(request(&[&a, &a, &a]))
                .await
                .unwrap()
                .into_inner();
            let _ = slow.message().await.unwrap();
            let mut second = PeerServiceClient::connect(url).await.unwrap();
            let e = second.fetch_chunks(request(&[&a])).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::ResourceExhausted, "{e}");
        });
}

/// With a token configured, the peer service (as the agent serves it) answers only
/// requests carrying it; the test-only corruption switch really corrupts what it sends.
#[test]
fn the_token_is_required_and_the_fault_switch_corrupts() {
    use tessera_proto::auth::{AddBearer, Token};
    let t = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(t.path(), 64 << 20).unwrap());
    let (a, da) = chunk(4, 64 << 10);
    cache.put(&a, &da).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let token = Token::new("cluster-secret").unwrap();
            let token_dir = tempfile::tempdir().unwrap();
            let token_path = token_dir.path().join("token");
            std::fs::write(&token_path, "cluster-secret\n").unwrap();
            let token_file = tessera_proto::auth::TokenFile::open(&token_path).unwrap();
            let mut urls = Vec::new();
            for corrupt in [false, true] {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                urls.push(format!("http://{}", listener.local_addr().unwrap()));
                let server = PeerServer::new(
                    cache.clone(),
                    UploadLimits {
                        max_uploads: 2,
                        bytes_per_sec: None,
                        corrupt,
                        compress: false,
                    },
                );
                tokio::spawn(server.serve(
                    listener,
                    gate(),
                    grpc(),
                    Some(token_file.clone()),
                    None,
                ));
            }
            let channel = |url: String| async move {
                tonic::transport::Endpoint::from_shared(url)
                    .unwrap()
                    .connect()
                    .await
                    .unwrap()
            };
            let mut anonymous = PeerServiceClient::new(channel(urls[0].clone()).await);
            let e = anonymous.fetch_chunks(request(&[&a])).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
            assert!(!e.message().contains("cluster-secret"));
            let wrong = AddBearer::new(Token::new("guess").as_ref()).unwrap();
            let mut guessing =
                PeerServiceClient::with_interceptor(channel(urls[0].clone()).await, wrong);
            let e = guessing.fetch_chunks(request(&[&a])).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
            // The piece tables too.
            let table = || pb::PieceTableRequest {
                blob: format!("sha256:{}", "a".repeat(64)),
            };
            let e = anonymous.piece_table(table()).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);
            let e = guessing.piece_table(table()).await.unwrap_err();
            assert_eq!(e.code(), tonic::Code::Unauthenticated);

            let mut got = Vec::new();
            for url in &urls {
                let auth = AddBearer::new(Some(&token)).unwrap();
                let mut client =
                    PeerServiceClient::with_interceptor(channel(url.clone()).await, auth);
                let mut stream = client
                    .fetch_chunks(request(&[&a]))
                    .await
                    .unwrap()
                    .into_inner();
                got.push(stream.message().await.unwrap().unwrap().data);
            }
            assert!(got[0] == da, "an honest peer sends the cached bytes");
            assert_eq!(got[1].len(), da.len());
            assert!(
                got[1] != da && DigestAlgo::Sha256.digest(&got[1]) != a.digest,
                "the fault switch sends bytes that fail verification"
            );
        });
}

/// With a TLS identity the peer service speaks only TLS: a client trusting the CA (and
/// checking the peer's name) gets chunks; a plain-text client gets nothing.
#[test]
fn the_peer_service_speaks_tls_when_configured() {
    use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity, ServerTlsConfig};
    let t = tempfile::tempdir().unwrap();
    let certs =
        support::tls::make_certs(&t.path().join("certs"), &["tessera-peer"], &["127.0.0.1"]);
    let cache = Arc::new(ChunkCache::open(&t.path().join("cache"), 64 << 20).unwrap());
    let (a, da) = chunk(6, 300 << 10);
    cache.put(&a, &da).unwrap();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            let identity = Identity::from_pem(
                std::fs::read(&certs.cert).unwrap(),
                std::fs::read(&certs.key).unwrap(),
            );
            let server = PeerServer::new(
                cache.clone(),
                UploadLimits {
                    max_uploads: 2,
                    bytes_per_sec: None,
                    corrupt: false,
                    compress: false,
                },
            );
            tokio::spawn(server.serve(
                listener,
                gate(),
                grpc(),
                None,
                Some(ServerTlsConfig::new().identity(identity)),
            ));
            let ca = Certificate::from_pem(std::fs::read(&certs.ca).unwrap());
            let channel = Endpoint::from_shared(format!("https://{addr}"))
                .unwrap()
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(ca)
                        .domain_name("tessera-peer"),
                )
                .unwrap()
                .connect()
                .await
                .unwrap();
            let mut client = PeerServiceClient::new(channel);
            let mut stream = client
                .fetch_chunks(request(&[&a]))
                .await
                .unwrap()
                .into_inner();
            assert!(stream.message().await.unwrap().unwrap().data == da);

            let plain = Endpoint::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect()
                .await;
            if let Ok(channel) = plain {
                let mut client = PeerServiceClient::new(channel);
                assert!(client.fetch_chunks(request(&[&a])).await.is_err());
            }
        });
}

/// The peer port's gate and gRPC limits as the agent's defaults set them.
fn gate() -> tessera_proto::listen::Gate {
    tessera_proto::listen::Gate::new("peer", 1024, Duration::from_secs(30))
}

fn grpc() -> tonic::transport::Server {
    tessera_proto::listen::grpc_server(256, Duration::from_secs(600))
}
