//! Serving the local API ([`crate::api`]): one request line per connection, answered
//! by the [`Agent`]; on TCP only with the current token.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, UnixListener};

use super::Agent;
use crate::api::{Envelope, Response};

/// Largest request accepted (they are a few hundred bytes).
const MAX_REQUEST: u64 = 64 << 10;

/// How long a TCP client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who is calling, which decides whether a token is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp,
}

/// Serves the local API on its unix socket until dropped.
pub async fn serve_unix(agent: Arc<Agent>, listener: UnixListener) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        tokio::spawn(serve_connection(agent.clone(), stream, Transport::Unix));
    }
}

/// Serves the local API on TCP until dropped: over TLS with `tls` (certificate and
/// key, PEM), which are read first, so a bad one fails before anything is served.
pub fn serve_tcp(
    agent: Arc<Agent>,
    listener: TcpListener,
    tls: Option<(&Path, &Path)>,
) -> crate::Result<impl Future<Output = ()>> {
    let tls = match tls {
        Some((cert, key)) => Some(tessera_proto::tls::acceptor(cert, key)?),
        None => None,
    };
    Ok(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let Some(tls) = tls.clone() else {
                tokio::spawn(serve_connection(agent.clone(), stream, Transport::Tcp));
                continue;
            };
            let agent = agent.clone();
            tokio::spawn(async move {
                // A client that never finishes its handshake must not hold a task.
                let handshake = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(stream));
                if let Ok(Ok(stream)) = handshake.await {
                    serve_connection(agent, stream, Transport::Tcp).await;
                }
            });
        }
    })
}

/// Serves one connection: reads a request line, answers it.
pub async fn serve_connection(
    agent: Arc<Agent>,
    stream: impl AsyncRead + AsyncWrite + Unpin,
    transport: Transport,
) {
    let (read, mut write) = tokio::io::split(stream);
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(MAX_REQUEST);
    let response = match reader.read_line(&mut line).await {
        Err(e) => failure(format!("read request: {e}")),
        Ok(_) => match serde_json::from_str::<Envelope>(&line) {
            Err(e) => failure(format!("bad request: {e}")),
            Ok(envelope) => match authorize(&agent, &envelope, transport) {
                Err(e) => failure(e),
                Ok(()) => match agent.handle(envelope.request).await {
                    Ok(result) => Response {
                        ok: true,
                        result: Some(result),
                        error: None,
                    },
                    Err(e) => failure(format!("{e:#}")),
                },
            },
        },
    };
    let mut text = serde_json::to_string(&response).unwrap_or_else(|_| "{\"ok\":false}".into());
    text.push('\n');
    let _ = write.write_all(text.as_bytes()).await;
    let _ = write.shutdown().await;
}

fn failure(error: String) -> Response {
    Response {
        ok: false,
        result: None,
        error: Some(error),
    }
}

/// TCP callers must present the current token (re-read each time, so it rotates).
fn authorize(agent: &Agent, envelope: &Envelope, transport: Transport) -> Result<(), String> {
    if transport == Transport::Unix {
        return Ok(());
    }
    let Some(path) = &agent.config().api_token_file else {
        return Err("the TCP API is disabled: no api_token_file".into());
    };
    let expected = std::fs::read_to_string(path)
        .map_err(|e| format!("the agent cannot read its token file: {e}"))?;
    let given = envelope.token.as_deref().unwrap_or("");
    // Compare all bytes whatever the first difference, so timing says nothing.
    let (a, b) = (expected.trim().as_bytes(), given.as_bytes());
    let same = a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
    if same && !a.is_empty() {
        Ok(())
    } else {
        Err("unauthorized: missing or wrong token".into())
    }
}
