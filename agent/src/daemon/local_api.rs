//! Serving the local API ([`crate::api`]): one request line per connection, answered
//! by the [`Agent`]; on TCP only with the current token.

use std::collections::VecDeque;
use std::future::Future;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tessera_proto::listen::Gate;
use tokio::io::{
    AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader, ReadHalf,
    WriteHalf,
};
use tokio::net::{TcpListener, UnixListener};

use super::Agent;
use crate::api::{Envelope, Response};

/// Largest request accepted: most are a few hundred bytes; a working set's
/// `chunks_of` names a range per page the app faulted in (tens of bytes each).
const MAX_REQUEST: u64 = 8 << 20;

/// How long a TCP client may take over its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Who is calling, which decides whether a token is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp,
}

/// Connections of the unix API still waiting for their request, oldest first, each with
/// the task serving it.
type Waiting = VecDeque<(u64, tokio::task::JoinHandle<()>)>;

/// Serves the local API on its unix socket until dropped. Connections still waiting
/// for their request never fill more than half the listener's cap: past that the
/// oldest is closed to let the new one in, so local clients that connect and say
/// nothing can never lock `tessera status` (or the kubelet's probe) out.
pub async fn serve_unix(agent: Arc<Agent>, listener: UnixListener, gate: Gate) {
    let waiting: Arc<Mutex<Waiting>> = Arc::default();
    let room = (agent.connections().cap() / 2).max(1);
    for id in 0u64.. {
        // The oldest waiting connection is closed before the next is accepted, and the
        // accept waits until its task is gone: its slot under the cap is free again
        // before a burst of new connections could fill the rest and be refused.
        loop {
            let oldest = {
                let mut waiting = waiting.lock().unwrap_or_else(|p| p.into_inner());
                if waiting.len() < room {
                    break;
                }
                waiting.pop_front()
            };
            if let Some((_, task)) = oldest {
                task.abort();
                let _ = task.await;
            }
        }
        let stream = gate.accept(&listener).await;
        let mut waiting_now = waiting.lock().unwrap_or_else(|p| p.into_inner());
        let (agent, waiting) = (agent.clone(), waiting.clone());
        // Spawned under the lock, so the task cannot look for itself before it is listed.
        let task = tokio::spawn(async move {
            let request = read_request(&agent, stream).await;
            {
                let mut waiting = waiting.lock().unwrap_or_else(|p| p.into_inner());
                let Some(at) = waiting.iter().position(|(w, _)| *w == id) else {
                    return; // evicted while its request arrived
                };
                waiting.remove(at);
            }
            if let Some((line, rest, write)) = request {
                answer_then_drain(&agent, &line, rest, write, Transport::Unix).await;
            }
        });
        waiting_now.push_back((id, task));
    }
}

/// Serves the local API on TCP until dropped: over TLS with `tls` (certificate and
/// key, PEM), which are read first, so a bad one fails before anything is served.
pub fn serve_tcp(
    agent: Arc<Agent>,
    listener: TcpListener,
    gate: Gate,
    tls: Option<(&Path, &Path)>,
) -> crate::Result<impl Future<Output = ()>> {
    let tls = match tls {
        Some((cert, key)) => Some(tessera_proto::tls::acceptor(cert, key)?),
        None => None,
    };
    Ok(async move {
        loop {
            let stream = gate.accept(&listener).await;
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
    if let Some((line, rest, write)) = read_request(&agent, stream).await {
        answer_then_drain(&agent, &line, rest, write, transport).await;
    }
}

/// [`answer`]s, then, for a request refused unread, reads and drops what the client
/// still sends, for a moment, before the socket closes: closed with unread bytes it
/// would be reset, and a client still writing could lose the answer that says what
/// was wrong.
async fn answer_then_drain<R: AsyncRead + Unpin, W: AsyncWrite + Unpin>(
    agent: &Arc<Agent>,
    line: &Result<String, String>,
    rest: R,
    write: W,
    transport: Transport,
) {
    answer(agent, line, write, transport).await;
    if line.is_err() {
        let mut rest = rest.take(DRAIN_AFTER_REFUSAL);
        let mut sink = tokio::io::sink();
        let _ = tokio::time::timeout(DRAIN_TIMEOUT, tokio::io::copy(&mut rest, &mut sink)).await;
    }
}

/// At most this much of a refused request is read and dropped after the answer.
const DRAIN_AFTER_REFUSAL: u64 = 64 << 20;
/// For at most this long.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);

/// The connection's request line (up to [`MAX_REQUEST`] bytes), the rest of its read
/// half and its write half; `None` when the client sent none within the local API's
/// request timeout.
async fn read_request<S: AsyncRead + AsyncWrite + Unpin>(
    agent: &Agent,
    stream: S,
) -> Option<(Result<String, String>, BufReader<ReadHalf<S>>, WriteHalf<S>)> {
    let (read, write) = tokio::io::split(stream);
    let mut line = String::new();
    let mut reader = BufReader::new(read).take(MAX_REQUEST);
    // A client that does not send its request in time holds nothing for long.
    let wait = agent.connections().api_request();
    let read = tokio::time::timeout(wait, reader.read_line(&mut line)).await;
    let rest = reader.into_inner();
    match read {
        Err(_) => None,
        Ok(Err(e)) => Some((Err(format!("read request: {e}")), rest, write)),
        Ok(Ok(_)) if line.len() as u64 >= MAX_REQUEST && !line.ends_with('\n') => Some((
            Err(format!(
                "the request is larger than the {} MiB the local API reads",
                MAX_REQUEST >> 20
            )),
            rest,
            write,
        )),
        Ok(Ok(_)) => Some((Ok(line), rest, write)),
    }
}

/// Answers a request line on `write`.
async fn answer<W: AsyncWrite + Unpin>(
    agent: &Arc<Agent>,
    line: &Result<String, String>,
    mut write: W,
    transport: Transport,
) {
    let response = match line {
        Err(e) => failure(e.clone()),
        Ok(line) => match serde_json::from_str::<Envelope>(line) {
            Err(e) => failure(format!("bad request: {e}")),
            Ok(envelope) => match authorize(agent, &envelope, transport) {
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
