//! A reverse proxy in front of a registry that breaks chosen requests the ways
//! networks and registries do: error statuses, rate limits, connections reset in the
//! middle of a body, bodies trickling in, tokens rejected as expired.
//!
//! ```ignore
//! let proxy = FaultProxy::start(&registry.addr);
//! proxy.inject(Rule::new(Fault::Status(500)).path("/manifests/").times(2));
//! // Point the client at `proxy.addr` instead of `registry.addr`.
//! assert_eq!(proxy.log()[0].fault, Some(Fault::Status(500)));
//! ```
//!
//! Each client connection carries one request: the proxy reads it whole (a chunked body
//! is de-chunked and sent on with `Content-Length`; `Expect: 100-continue` is not
//! supported), sends it upstream with `Connection: close`, reads the whole response to
//! the end, then answers the client with `Connection: close`. Whole bodies in memory are
//! fine for test images and let a fault cut a body at an exact byte.
//!
//! The `Host` header goes upstream untouched: the registry builds upload `Location`s
//! from it, and they must lead back through the proxy. So do credentials: the client
//! keys them by the proxy's address.

use std::io::{self, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::http::{self, Request, Server};

/// What to do to a request a [`Rule`] picks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// Answer this status with an empty body; the registry never sees the request.
    Status(u16),
    /// Answer 429 with `Retry-After: N`; the registry never sees the request.
    TooManyRequests { retry_after_secs: u64 },
    /// Forward, then send the response head and the first half of its body, then reset
    /// the connection (RST, not FIN: `SO_LINGER` 0), as a dying load balancer does.
    ResetMidBody,
    /// Forward, send the head at once and the body at this rate.
    SlowBody { bytes_per_sec: u64 },
    /// Answer 401 with the registry's own challenge for this request, as when a token
    /// has expired: the request goes upstream without its `Authorization` only to get
    /// the registry's `WWW-Authenticate` (absent if the registry has no auth).
    Unauthorized,
}

/// Which requests get a fault: every request whose method and target match counts
/// towards every rule it matches; the first `skip` of them pass, the next `times` get
/// the fault. When several rules would fire, the first injected wins.
#[derive(Debug, Clone)]
pub struct Rule {
    /// `GET`, `HEAD`, … (`None`: any method).
    pub method: Option<&'static str>,
    /// A substring of the path and query (`""`: any target).
    pub path_contains: String,
    /// Matching requests let through before the fault starts.
    pub skip: u32,
    /// Matching requests that get the fault.
    pub times: u32,
    pub fault: Fault,
}

impl Rule {
    /// `fault` on the next request, whatever it is; narrow it with the methods below.
    pub fn new(fault: Fault) -> Rule {
        Rule {
            method: None,
            path_contains: String::new(),
            skip: 0,
            times: 1,
            fault,
        }
    }

    pub fn method(self, method: &'static str) -> Rule {
        Rule {
            method: Some(method),
            ..self
        }
    }

    pub fn path(self, contains: &str) -> Rule {
        Rule {
            path_contains: contains.to_string(),
            ..self
        }
    }

    pub fn skip(self, skip: u32) -> Rule {
        Rule { skip, ..self }
    }

    pub fn times(self, times: u32) -> Rule {
        Rule { times, ..self }
    }

    fn matches(&self, req: &Request) -> bool {
        self.method
            .is_none_or(|m| m.eq_ignore_ascii_case(&req.method))
            && req.target.contains(&self.path_contains)
    }
}

/// One request as the proxy handled it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Logged {
    pub method: String,
    /// Path and query.
    pub target: String,
    /// The request's `Range` header, to tell a resumed read from a restarted one.
    pub range: Option<String>,
    /// The status sent to the client (the registry's, or the fault's).
    pub status: u16,
    /// Body bytes the registry answered with (what a fault let through may be less).
    pub body_bytes: u64,
    pub fault: Option<Fault>,
}

impl FaultProxy {
    /// Body bytes slowed responses (`Fault::SlowBody`) have sent so far: how far a
    /// slow transfer has got at a given moment.
    pub fn slow_bytes_sent(&self) -> u64 {
        self.state
            .slow_sent
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Body bytes of blob responses so far: the origin egress the tests bound.
    pub fn blob_bytes(&self) -> u64 {
        self.log()
            .iter()
            .filter(|l| l.target.contains("/blobs/"))
            .map(|l| l.body_bytes)
            .sum()
    }
}

/// A running proxy on `127.0.0.1`; stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    /// `127.0.0.1:PORT`: use it as the registry in image references.
    pub addr: String,
    state: Arc<State>,
    _server: Server,
}

impl FaultProxy {
    /// Proxies to `upstream` (`host:port`, plain HTTP).
    pub fn start(upstream: &str) -> FaultProxy {
        let state = Arc::new(State {
            upstream: upstream.to_string(),
            rules: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            slow_sent: Default::default(),
        });
        let server = {
            let state = Arc::clone(&state);
            Server::start("fault-proxy", move |stream| state.serve(stream))
        };
        FaultProxy {
            addr: server.addr.clone(),
            state,
            _server: server,
        }
    }

    /// Adds a rule after those already injected.
    pub fn inject(&self, rule: Rule) {
        lock(&self.state.rules).push((rule, 0));
    }

    /// Drops every rule: the proxy passes everything through again.
    pub fn clear(&self) {
        lock(&self.state.rules).clear();
    }

    /// Every request so far, in the order the proxy answered them. A request is logged
    /// before its response is sent, so whatever the client has seen is in the log.
    pub fn log(&self) -> Vec<Logged> {
        lock(&self.state.log).clone()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[derive(Debug)]
struct State {
    upstream: String,
    /// Rules with how many requests have matched each so far.
    rules: Mutex<Vec<(Rule, u32)>>,
    log: Mutex<Vec<Logged>>,
    /// Body bytes slowed responses (`SlowBody`) have written to clients so far.
    slow_sent: std::sync::atomic::AtomicU64,
}

/// A response read whole from upstream.
struct Upstream {
    status: u16,
    /// The status line and headers minus `Connection`/`Keep-Alive`, ending `\r\n`
    /// after the last header (the caller adds `Connection: close` and the blank line).
    head: Vec<u8>,
    headers: Vec<(String, String)>,
    /// As sent: chunked framing, if any, is kept and its header passed on.
    body: Vec<u8>,
}

impl State {
    fn serve(&self, mut client: TcpStream) -> io::Result<()> {
        let Some(req) = Request::read(&mut http::reader(&client)?)? else {
            return Ok(());
        };
        let fault = self.pick(&req);
        let log_body = |status: u16, body_bytes: usize| {
            lock(&self.log).push(Logged {
                method: req.method.clone(),
                target: req.target.clone(),
                range: req.header("range").map(String::from),
                status,
                body_bytes: body_bytes as u64,
                fault: fault.clone(),
            });
        };
        let log = |status: u16| log_body(status, 0);
        match &fault {
            Some(Fault::Status(status)) => {
                log(*status);
                http::write_response(&mut client, *status, &[], b"")
            }
            Some(Fault::TooManyRequests { retry_after_secs }) => {
                log(429);
                let retry_after = retry_after_secs.to_string();
                http::write_response(&mut client, 429, &[("Retry-After", &retry_after)], b"")
            }
            Some(Fault::Unauthorized) => {
                let mut anonymous = req.clone();
                anonymous
                    .headers
                    .retain(|(k, _)| !k.eq_ignore_ascii_case("authorization"));
                let upstream = self.forward(&anonymous)?;
                let challenge = http::header(&upstream.headers, "www-authenticate");
                let headers: Vec<(&str, &str)> = challenge
                    .map(|c| ("WWW-Authenticate", c))
                    .into_iter()
                    .collect();
                log(401);
                http::write_response(&mut client, 401, &headers, b"")
            }
            Some(Fault::ResetMidBody) => {
                let upstream = self.forward(&req)?;
                log_body(upstream.status, upstream.body.len() / 2);
                write_head(&mut client, &upstream)?;
                client.write_all(&upstream.body[..upstream.body.len() / 2])?;
                client.flush()?;
                // A reset drops whatever is still in the send queue: give the client a
                // moment to take the half in, so the cut falls where it is meant to.
                std::thread::sleep(Duration::from_millis(100));
                // Closing with a zero linger time sends RST instead of FIN.
                rustix::net::sockopt::set_socket_linger(&client, Some(Duration::ZERO))?;
                Ok(())
            }
            Some(Fault::SlowBody { bytes_per_sec }) => {
                let upstream = self.forward(&req)?;
                log_body(upstream.status, upstream.body.len());
                write_head(&mut client, &upstream)?;
                // Ten slices a second, so the rate is even at any scale.
                let slice = (*bytes_per_sec / 10).max(1) as usize;
                for part in upstream.body.chunks(slice) {
                    client.write_all(part)?;
                    client.flush()?;
                    self.slow_sent
                        .fetch_add(part.len() as u64, std::sync::atomic::Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(100));
                }
                Ok(())
            }
            None => {
                let upstream = self.forward(&req)?;
                log_body(upstream.status, upstream.body.len());
                write_head(&mut client, &upstream)?;
                client.write_all(&upstream.body)?;
                client.flush()
            }
        }
    }

    /// The fault for this request, if a rule fires; counts the request for every rule
    /// it matches.
    fn pick(&self, req: &Request) -> Option<Fault> {
        let mut fired = None;
        for (rule, matched) in lock(&self.rules).iter_mut() {
            if !rule.matches(req) {
                continue;
            }
            *matched += 1;
            if fired.is_none() && *matched > rule.skip && *matched - rule.skip <= rule.times {
                fired = Some(rule.fault.clone());
            }
        }
        fired
    }

    /// Sends `req` to the registry and reads the whole response.
    fn forward(&self, req: &Request) -> io::Result<Upstream> {
        let mut upstream = TcpStream::connect(&self.upstream)?;
        upstream.set_read_timeout(Some(http::IO_TIMEOUT))?;
        let mut head = format!("{} {} HTTP/1.1\r\n", req.method, req.target);
        for (name, value) in &req.headers {
            // Framing and connection handling are the proxy's own; everything else,
            // `Host` above all, goes through as the client sent it.
            if !is_hop_by_hop(name)
                && !name.eq_ignore_ascii_case("content-length")
                && !name.eq_ignore_ascii_case("transfer-encoding")
            {
                head.push_str(&format!("{name}: {value}\r\n"));
            }
        }
        if req.has_body {
            head.push_str(&format!("Content-Length: {}\r\n", req.body.len()));
        }
        head.push_str("Connection: close\r\n\r\n");
        upstream.write_all(head.as_bytes())?;
        upstream.write_all(&req.body)?;
        upstream.flush()?;

        let mut reader = BufReader::new(upstream);
        let http::Head { start, headers } = http::read_head(&mut reader)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "upstream closed without answering",
            )
        })?;
        let status = start
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, start.clone()))?;
        let mut head = format!("{start}\r\n");
        for (name, value) in headers.iter().filter(|(n, _)| !is_hop_by_hop(n)) {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        // `Connection: close` was asked for, so the body ends where the stream does
        // (and a HEAD response has none, whatever its Content-Length says).
        let mut body = Vec::new();
        reader.read_to_end(&mut body)?;
        Ok(Upstream {
            status,
            head: head.into_bytes(),
            headers,
            body,
        })
    }
}

fn is_hop_by_hop(name: &str) -> bool {
    ["connection", "keep-alive", "proxy-connection"]
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h))
}

fn write_head(client: &mut TcpStream, upstream: &Upstream) -> io::Result<()> {
    client.write_all(&upstream.head)?;
    client.write_all(b"Connection: close\r\n\r\n")
}
