//! Bearer tokens on the gRPC services: the scheduler and every agent's peer service
//! accept a request only with `authorization: Bearer <token>` when a token is
//! configured. Clients add it with [`AddBearer`]; servers check it with [`RequireBearer`].
//!
//! The token is a shared secret of the cluster: it is compared in constant time, never
//! logged, and never part of an error message.
//!
//! Tokens configured as files are read again when the file changes ([`TokenFile`]), so
//! a token rotates without a restart. A file may hold several tokens, one per line:
//! servers accept any of them and clients send the first, so a cluster rotates by
//! adding the new token as a second line everywhere, then moving it first, then
//! removing the old one — no request is refused on the way.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::{Request, Status};

/// A configured token. Its `Debug` form hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

impl Token {
    /// A token from configuration text (surrounding whitespace, such as a file's final
    /// newline, is not part of it). `None` when empty.
    pub fn new(text: &str) -> Option<Token> {
        let t = text.trim();
        (!t.is_empty()).then(|| Token(t.to_string()))
    }

    /// Reads a token file; an empty file is an error (it would silently turn
    /// authentication off).
    pub fn from_file(path: &Path) -> std::io::Result<Token> {
        let text = std::fs::read_to_string(path)?;
        Token::new(&text).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "the token file is empty")
        })
    }
}

/// The tokens in a token file's text: one per non-empty line.
fn parse_tokens(text: &str) -> Vec<Token> {
    text.lines().filter_map(Token::new).collect()
}

/// Reads the tokens of a token file; an empty file is an error (it would silently turn
/// authentication off).
pub fn read_tokens(path: &Path) -> std::io::Result<Vec<Token>> {
    let tokens = parse_tokens(&std::fs::read_to_string(path)?);
    if tokens.is_empty() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the token file is empty",
        ));
    }
    Ok(tokens)
}

/// How often a [`TokenFile`] looks at its file at most.
const RECHECK: Duration = Duration::from_secs(1);

/// A token file, read again when it changes (looked at no more than once a second).
/// If a new version cannot be read or is empty, the last good tokens stay in use.
#[derive(Debug, Clone)]
pub struct TokenFile {
    path: Arc<PathBuf>,
    loaded: Arc<Mutex<Loaded>>,
}

#[derive(Debug)]
struct Loaded {
    tokens: Vec<Token>,
    modified: Option<SystemTime>,
    checked: Instant,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl TokenFile {
    /// Reads `path` now: a missing or empty file is an error at start.
    pub fn open(path: &Path) -> std::io::Result<TokenFile> {
        let tokens = read_tokens(path)?;
        Ok(TokenFile {
            path: Arc::new(path.to_path_buf()),
            loaded: Arc::new(Mutex::new(Loaded {
                tokens,
                modified: modified(path),
                checked: Instant::now(),
            })),
        })
    }

    /// The tokens now, the first being the one clients send.
    pub fn tokens(&self) -> Vec<Token> {
        let mut loaded = self.loaded.lock().unwrap_or_else(|p| p.into_inner());
        if loaded.checked.elapsed() >= RECHECK {
            loaded.checked = Instant::now();
            let now = modified(&self.path);
            if now != loaded.modified {
                if let Ok(tokens) = read_tokens(&self.path) {
                    loaded.tokens = tokens;
                    loaded.modified = now;
                }
            }
        }
        loaded.tokens.clone()
    }
}

impl Token {
    /// Whether `presented` is any of `tokens`; every one is compared, so the time
    /// taken does not tell which matched.
    pub fn matches_any(tokens: &[Token], presented: &str) -> bool {
        tokens.iter().fold(false, |ok, t| t.matches(presented) | ok)
    }

    /// Whether `presented` is this token (compared in constant time).
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq(presented.as_bytes(), self.0.as_bytes())
    }
}

/// Compares without stopping at the first difference, so the time taken does not tell
/// an attacker how much of a guess was right.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Client side: adds the token to every request (or nothing when none is configured).
#[derive(Debug, Clone, Default)]
pub struct AddBearer(Sending);

#[derive(Debug, Clone, Default)]
enum Sending {
    #[default]
    Nothing,
    Fixed(MetadataValue<tonic::metadata::Ascii>),
    /// The file's first token, as it is now.
    File(TokenFile),
}

fn header(token: &Token) -> Result<MetadataValue<tonic::metadata::Ascii>, InvalidToken> {
    format!("Bearer {}", token.0)
        .parse::<MetadataValue<_>>()
        .map_err(|_| InvalidToken)
}

impl AddBearer {
    pub fn new(token: Option<&Token>) -> Result<Self, InvalidToken> {
        Ok(AddBearer(match token {
            Some(t) => Sending::Fixed(header(t)?),
            None => Sending::Nothing,
        }))
    }

    /// Sends the first token of `file` as it is at each request.
    pub fn from_file(file: TokenFile) -> Result<Self, InvalidToken> {
        for t in file.tokens() {
            header(&t)?;
        }
        Ok(AddBearer(Sending::File(file)))
    }
}

/// A token that cannot be sent in a header (it has characters outside visible ASCII).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the token has characters that cannot be sent in a header (use visible ASCII)")]
pub struct InvalidToken;

impl Interceptor for AddBearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let value = match &self.0 {
            Sending::Nothing => None,
            Sending::Fixed(v) => Some(v.clone()),
            Sending::File(file) => match file.tokens().first().map(header) {
                Some(Ok(v)) => Some(v),
                _ => return Err(Status::unauthenticated(
                    "the token file's first token cannot be sent in a header (use visible ASCII)",
                )),
            },
        };
        if let Some(v) = value {
            request.metadata_mut().insert("authorization", v);
        }
        Ok(request)
    }
}

/// Server side: lets through only requests carrying the token (everything when none is
/// configured).
#[derive(Debug, Clone, Default)]
pub struct RequireBearer {
    token: Option<Accepted>,
    /// Names the service in the refusal, so the operator knows which token to set.
    service: &'static str,
}

#[derive(Debug, Clone)]
enum Accepted {
    Fixed(Token),
    /// Any token of the file, as it is at each request.
    File(TokenFile),
}

impl RequireBearer {
    pub fn new(token: Option<Token>, service: &'static str) -> Self {
        RequireBearer {
            token: token.map(Accepted::Fixed),
            service,
        }
    }

    /// Accepts any token of `file` as it is at each request (`None`: no check).
    pub fn from_file(file: Option<TokenFile>, service: &'static str) -> Self {
        RequireBearer {
            token: file.map(Accepted::File),
            service,
        }
    }
}

impl Interceptor for RequireBearer {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(accepted) = &self.token else {
            return Ok(request);
        };
        let tokens = match accepted {
            Accepted::Fixed(t) => vec![t.clone()],
            Accepted::File(file) => file.tokens(),
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(p) if Token::matches_any(&tokens, p) => Ok(request),
            Some(_) => Err(Status::unauthenticated(format!(
                "the {} refused the bearer token: configure the same token on every agent and the scheduler",
                self.service
            ))),
            None => Err(Status::unauthenticated(format!(
                "the {} requires a bearer token: configure its token on this client",
                self.service
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_right_token_passes() {
        let token = Token::new("s3cret\n").unwrap();
        assert_eq!(format!("{token:?}"), "Token(<redacted>)");
        let mut check = RequireBearer::new(Some(token.clone()), "scheduler");
        let send = |t: Option<&Token>| AddBearer::new(t).unwrap().call(Request::new(())).unwrap();
        assert!(check.call(send(Some(&token))).is_ok());
        let wrong = Token::new("s3cres").unwrap();
        let e = check.call(send(Some(&wrong))).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        assert!(!e.message().contains("s3cre"), "{}", e.message());
        let e = check.call(send(None)).unwrap_err();
        assert_eq!(e.code(), tonic::Code::Unauthenticated);
        // No token configured: everything passes.
        assert!(RequireBearer::new(None, "peer").call(send(None)).is_ok());
        assert!(Token::new("  \n").is_none());
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"abcd"));
    }

    #[test]
    fn a_token_file_rotates_without_a_restart() {
        let dir = std::env::temp_dir().join(format!("tessera-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        std::fs::write(&path, "old\n").unwrap();
        let file = TokenFile::open(&path).unwrap();
        let mut server = RequireBearer::from_file(Some(file.clone()), "scheduler");
        let mut client = AddBearer::from_file(file.clone()).unwrap();
        let fixed = |t: &str| {
            AddBearer::new(Token::new(t).as_ref())
                .unwrap()
                .call(Request::new(()))
                .unwrap()
        };
        assert!(server.call(client.call(Request::new(())).unwrap()).is_ok());
        assert!(server.call(fixed("new")).is_err());
        // Step 1: both accepted, the old one still sent.
        std::fs::write(&path, "old\nnew\n").unwrap();
        std::thread::sleep(RECHECK + Duration::from_millis(50));
        assert!(server.call(fixed("new")).is_ok());
        assert!(server.call(fixed("old")).is_ok());
        // Step 2: the new one alone; an empty or unreadable file keeps the last tokens.
        std::fs::write(&path, "new\n").unwrap();
        std::thread::sleep(RECHECK + Duration::from_millis(50));
        assert!(server.call(fixed("old")).is_err());
        assert!(server.call(client.call(Request::new(())).unwrap()).is_ok());
        std::fs::write(&path, "").unwrap();
        std::thread::sleep(RECHECK + Duration::from_millis(50));
        assert!(server.call(fixed("new")).is_ok());
        assert!(TokenFile::open(&path).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
