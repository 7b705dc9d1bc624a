//! Bearer tokens on the gRPC services: the scheduler and every agent's peer service
//! accept a request only with `authorization: Bearer <token>` when a token is
//! configured. Clients add it with [`AddBearer`]; servers check it with [`RequireBearer`].
//!
//! The token is a shared secret of the cluster: it is compared in constant time, never
//! logged, and never part of an error message.

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
    pub fn from_file(path: &std::path::Path) -> std::io::Result<Token> {
        let text = std::fs::read_to_string(path)?;
        Token::new(&text).ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidData, "the token file is empty")
        })
    }
}

impl Token {
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
pub struct AddBearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl AddBearer {
    pub fn new(token: Option<&Token>) -> Result<Self, InvalidToken> {
        token
            .map(|t| {
                format!("Bearer {}", t.0)
                    .parse::<MetadataValue<_>>()
                    .map_err(|_| InvalidToken)
            })
            .transpose()
            .map(AddBearer)
    }
}

/// A token that cannot be sent in a header (it has characters outside visible ASCII).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the token has characters that cannot be sent in a header (use visible ASCII)")]
pub struct InvalidToken;

impl Interceptor for AddBearer {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(v) = &self.0 {
            request.metadata_mut().insert("authorization", v.clone());
        }
        Ok(request)
    }
}

/// Server side: lets through only requests carrying the token (everything when none is
/// configured).
#[derive(Debug, Clone, Default)]
pub struct RequireBearer {
    token: Option<Token>,
    /// Names the service in the refusal, so the operator knows which token to set.
    service: &'static str,
}

impl RequireBearer {
    pub fn new(token: Option<Token>, service: &'static str) -> Self {
        RequireBearer { token, service }
    }
}

impl Interceptor for RequireBearer {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.token else {
            return Ok(request);
        };
        let presented = request
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        match presented {
            Some(p) if constant_time_eq(p.as_bytes(), token.0.as_bytes()) => Ok(request),
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
}
