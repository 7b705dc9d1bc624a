//! The agent's local API: one JSON request per connection, one JSON answer, on a unix
//! socket (anyone who can open it may call) and optionally on TCP, where every request
//! must carry the token from `api_token_file`. `tessera mount`, `umount`, `status`
//! and `cache` are its clients.
//!
//! This module is the protocol and its client; the daemon serves it
//! (`daemon::local_api`), so the protocol depends on nothing of the daemon.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::config::Prefetch;
use crate::{Error, Result};

/// What a client asks.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "lowercase")]
pub enum Request {
    /// Mount image `image` at `mountpoint` (an existing empty directory).
    Mount {
        image: String,
        mountpoint: PathBuf,
        /// `os/arch[/variant]`; default the node's.
        #[serde(default)]
        platform: Option<String>,
        #[serde(flatten)]
        plan: ReadPlan,
    },
    Umount {
        mountpoint: PathBuf,
    },
    /// The chunks of the image mounted at `mountpoint` that hold `ranges` of its
    /// files, each once, in the order of the ranges: a checkpoint's working set
    /// (docs/checkpoints.md).
    ChunksOf {
        mountpoint: PathBuf,
        ranges: Vec<FileRange>,
    },
    Status,
    /// Verify every cached chunk now (`tessera cache verify`), dropping what fails.
    CacheVerify,
    /// What the cache holds, what mounts pin, the disk against its watermarks
    /// (`tessera cache usage`).
    CacheUsage,
    /// Evict every chunk no mounted image pins, or only down to `keep` bytes
    /// (`tessera cache prune`).
    CachePrune {
        #[serde(default)]
        keep: Option<u64>,
    },
}

/// How a mount's reads are prefetched and recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReadPlan {
    /// Append the path of every file the workload reads, in first-read order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<PathBuf>,
    /// Overrides the agent's `prefetch` for this mount.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefetch: Option<Prefetch>,
    /// Chunks (by index in the image's chunk table) to fetch before anything else is
    /// prefetched, in this order: a checkpoint's recorded working set. Even with
    /// `prefetch: none`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first: Vec<u32>,
}

/// Bytes `offset..offset + len` of the file at `path` (from the image's root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileRange {
    pub path: String,
    pub offset: u64,
    pub len: u64,
}

/// Chunks of an image ([`Request::ChunksOf`]'s answer).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ChunkList {
    /// Chunk-table indices, each once, in first-read order.
    pub chunks: Vec<u32>,
    /// Their stored (compressed) bytes: what fetching them moves.
    pub compressed_bytes: u64,
    /// Their bytes once decompressed.
    pub bytes: u64,
    /// Ranges that name no regular file of the image (left out).
    pub unknown: usize,
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
