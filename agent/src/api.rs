//! The agent's local API: one JSON request per connection, one JSON answer, on a unix
//! socket (anyone who can open it may call) and optionally on TCP, where every request
//! must carry the token from `api_token_file`. `tessera mount`, `umount` and `status`
//! are its clients.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};

use crate::config::Prefetch;
use crate::daemon::Agent;
use crate::{Error, Result};

/// Largest request accepted (they are a few hundred bytes).
const MAX_REQUEST: u64 = 64 << 10;

/// What a client asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// Mount image `image` at `mountpoint` (an existing empty directory).
    Mount {
        image: String,
        mountpoint: PathBuf,
        /// Append the path of every file the workload reads, in first-read order.
        #[serde(default)]
        record: Option<PathBuf>,
        /// `os/arch[/variant]`; default the node's.
        #[serde(default)]
        platform: Option<String>,
        /// Overrides the agent's `prefetch` for this mount.
        #[serde(default)]
        prefetch: Option<Prefetch>,
    },
    Umount {
        mountpoint: PathBuf,
    },
    Status,
}

/// A request as sent: the token matters only on TCP.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(flatten)]
    pub request: Request,
}

/// The answer: `result` on success, `error` (what to do included) otherwise.
#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Who is calling, which decides whether a token is needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Unix,
    Tcp,
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
fn authorize(
    agent: &Agent,
    envelope: &Envelope,
    transport: Transport,
) -> std::result::Result<(), String> {
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

/// Sends `request` to the agent on `socket` and returns its result.
pub async fn call(socket: &Path, request: Request) -> Result<serde_json::Value> {
    let stream = tokio::net::UnixStream::connect(socket)
        .await
        .map_err(|e| Error::Config {
            path: socket.to_path_buf(),
            reason: format!(
            "cannot reach the agent ({e}); is `tessera agent` running? (--socket or TESSERA_SOCKET)"
        ),
        })?;
    let envelope = Envelope {
        token: None,
        request,
    };
    let (read, mut write) = tokio::io::split(stream);
    let mut text = serde_json::to_string(&envelope).map_err(|e| Error::Config {
        path: socket.to_path_buf(),
        reason: e.to_string(),
    })?;
    text.push('\n');
    write
        .write_all(text.as_bytes())
        .await
        .map_err(|e| Error::io("write to", socket, e))?;
    let mut line = String::new();
    BufReader::new(read)
        .read_line(&mut line)
        .await
        .map_err(|e| Error::io("read from", socket, e))?;
    let response: Response = serde_json::from_str(&line).map_err(|e| Error::Config {
        path: socket.to_path_buf(),
        reason: format!("the agent answered something unexpected: {e}"),
    })?;
    match (response.ok, response.result, response.error) {
        (true, Some(result), _) => Ok(result),
        (true, None, _) => Ok(serde_json::Value::Null),
        (false, _, error) => {
            Err(Error::Agent(error.unwrap_or_else(|| {
                "the agent failed without saying why".into()
            })))
        }
    }
}
