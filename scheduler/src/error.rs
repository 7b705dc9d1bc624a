//! The scheduler library's error type (besides [`crate::swarm::UnknownHost`], the answer
//! to a host the swarm does not know, which the gRPC service turns into "register
//! again").

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The durable store (`--state-dir`) failed.
    #[error("scheduler state: {what}: {reason}")]
    Store { what: String, reason: String },
    /// The admin listener's certificate or key is unusable.
    #[error("admin API TLS: {reason}")]
    Tls { reason: String },
    /// A token file could not be read.
    #[error("read the token file {path}: {cause}")]
    TokenFile {
        path: std::path::PathBuf,
        cause: std::io::Error,
    },
}
