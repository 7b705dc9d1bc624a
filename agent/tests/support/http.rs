//! Just enough HTTP/1.1 for the test servers ([`super::token_server`],
//! [`super::fault_proxy`]): read one request or response head, read a request body
//! (`Content-Length` or chunked), write a response, and run a listener whose threads
//! stop when it is dropped.
//!
//! Every connection carries one exchange and is then closed (`Connection: close`):
//! clients reconnect by themselves, and the servers never have to find where a
//! keep-alive response ends.

use std::io::{self, BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// Bound on a request or response head, so a broken peer cannot grow it forever.
const MAX_HEAD: usize = 64 << 10;

/// How long a test server waits on a silent peer before giving up the connection.
pub const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A request as read from a client, body decoded.
#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    /// Path and query, as sent (`/v2/a/b/blobs/sha256:…?x=y`).
    pub target: String,
    /// In the order sent, names as sent.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked if it came with `Transfer-Encoding: chunked`.
    pub body: Vec<u8>,
    /// Whether the client framed a body (`Content-Length` or chunked), even an empty
    /// one: a proxy must then send `Content-Length` on.
    pub has_body: bool,
}

impl Request {
    /// Reads one request; `None` if the peer closed the connection before sending one.
    pub fn read(r: &mut impl BufRead) -> io::Result<Option<Request>> {
        let Some(Head { start, headers }) = read_head(r)? else {
            return Ok(None);
        };
        let mut parts = start.split(' ');
        let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
            return Err(bad_data(format!("bad request line {start:?}")));
        };
        let mut req = Request {
            method: method.to_string(),
            target: target.to_string(),
            headers,
            body: Vec::new(),
            has_body: false,
        };
        let chunked = req
            .header("transfer-encoding")
            .is_some_and(|te| te.to_ascii_lowercase().contains("chunked"));
        if chunked {
            req.body = read_chunked(r)?;
            req.has_body = true;
        } else if let Some(len) = req.header("content-length") {
            let len: usize = len
                .trim()
                .parse()
                .map_err(|_| bad_data(format!("bad Content-Length {len:?}")))?;
            req.body = vec![0; len];
            r.read_exact(&mut req.body)?;
            req.has_body = true;
        }
        Ok(Some(req))
    }

    /// The first header called `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The decoded query parameters, in order (a name may repeat).
    pub fn query(&self) -> Vec<(String, String)> {
        let query = self.target.split_once('?').map_or("", |(_, q)| q);
        form_urlencoded::parse(query.as_bytes())
            .into_owned()
            .collect()
    }
}

/// The first header called `name` (case-insensitive) in `headers`.
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k.eq_ignore_ascii_case(name))
        .map(|(_, v)| v.as_str())
}

/// A request or response head.
#[derive(Debug, Clone)]
pub struct Head {
    /// The request line or status line, without its line end.
    pub start: String,
    pub headers: Vec<(String, String)>,
}

/// Reads a request or response head, up to the empty line. `None` if the stream ends
/// before the first byte.
pub fn read_head(r: &mut impl BufRead) -> io::Result<Option<Head>> {
    let mut start = String::new();
    if r.read_line(&mut start)? == 0 {
        return Ok(None);
    }
    let mut size = start.len();
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        size += r.read_line(&mut line)?;
        if size > MAX_HEAD {
            return Err(bad_data(format!("head larger than {MAX_HEAD} bytes")));
        }
        let line = line.trim_end_matches(['\r', '\n']);
        if line.is_empty() {
            break;
        }
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad_data(format!("bad header line {line:?}")))?;
        headers.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(Some(Head {
        start: start.trim_end().to_string(),
        headers,
    }))
}

/// Reads a chunked body (RFC 9112 §7.1), dropping chunk extensions and trailers.
fn read_chunked(r: &mut impl BufRead) -> io::Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line)?;
        let size = line.split(';').next().unwrap_or("").trim();
        let size = usize::from_str_radix(size, 16)
            .map_err(|_| bad_data(format!("bad chunk size line {line:?}")))?;
        if size == 0 {
            // Trailers, then the empty line.
            while read_line_len(r)? > 2 {}
            return Ok(body);
        }
        let start = body.len();
        body.resize(start + size, 0);
        r.read_exact(&mut body[start..])?;
        read_line_len(r)?; // The CRLF after the data.
    }
}

fn read_line_len(r: &mut impl BufRead) -> io::Result<usize> {
    let mut line = String::new();
    match r.read_line(&mut line)? {
        0 => Err(io::ErrorKind::UnexpectedEof.into()),
        n => Ok(n),
    }
}

fn bad_data(reason: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason)
}

/// Writes a whole response with `Content-Length` and `Connection: close`.
pub fn write_response(
    w: &mut impl Write,
    status: u16,
    headers: &[(&str, &str)],
    body: &[u8],
) -> io::Result<()> {
    let mut head = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str(&format!(
        "Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    ));
    w.write_all(head.as_bytes())?;
    w.write_all(body)?;
    w.flush()
}

/// A reason phrase; clients ignore it, people reading captures do not.
pub fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        _ => "Status",
    }
}

/// A listener on `127.0.0.1:<free port>` handing each connection to its own thread;
/// dropping it stops accepting. Connection threads are not joined: each ends when its
/// exchange is done or its socket times out ([`IO_TIMEOUT`]).
#[derive(Debug)]
pub struct Server {
    /// `127.0.0.1:PORT`.
    pub addr: String,
    /// Set on drop; the accept loop checks it after every connection.
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl Server {
    /// Binds a free port and serves every connection with `handler` (errors it returns
    /// are printed: a test server must not take the test down with a panic).
    pub fn start<F>(name: &'static str, handler: F) -> Server
    where
        F: Fn(TcpStream) -> io::Result<()> + Send + Sync + 'static,
    {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a test server port");
        let addr = listener.local_addr().expect("local address").to_string();
        let stop = Arc::new(AtomicBool::new(false));
        let handler = Arc::new(handler);
        let accept = {
            let stop = Arc::clone(&stop);
            std::thread::Builder::new()
                .name(format!("{name}-accept"))
                .spawn(move || {
                    for conn in listener.incoming() {
                        if stop.load(Ordering::SeqCst) {
                            break;
                        }
                        let Ok(conn) = conn else { continue };
                        let handler = Arc::clone(&handler);
                        let _ = std::thread::Builder::new()
                            .name(format!("{name}-conn"))
                            .spawn(move || {
                                let _ = conn.set_read_timeout(Some(IO_TIMEOUT));
                                let _ = conn.set_write_timeout(Some(IO_TIMEOUT));
                                if let Err(e) = handler(conn) {
                                    eprintln!("{name}: {e}");
                                }
                            });
                    }
                })
                .expect("spawn accept thread")
        };
        Server {
            addr,
            stop,
            accept: Some(accept),
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // `accept` blocks; a connection of our own wakes it to see the flag.
        let _ = TcpStream::connect(&self.addr);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

/// A buffered reader over a clone of `stream`, so the stream itself stays writable.
pub fn reader(stream: &TcpStream) -> io::Result<BufReader<TcpStream>> {
    Ok(BufReader::new(stream.try_clone()?))
}

#[cfg(test)]
mod tests {
    // The swarm benchmark compiles this module with `cfg(test)` but no test harness,
    // which drops the `#[test]` functions and leaves the import unused.
    #[allow(unused_imports)]
    use super::*;

    #[test]
    fn chunked_request_bodies_are_decoded() {
        let raw = b"PATCH /v2/a/blobs/uploads/1?x=y HTTP/1.1\r\nHost: h:1\r\n\
            Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\n\
            Trailer: t\r\n\r\n";
        let req = Request::read(&mut &raw[..])
            .expect("valid")
            .expect("a request");
        assert_eq!(req.body, b"hello world");
        assert!(req.has_body);
        assert_eq!(req.header("HOST"), Some("h:1"));
        assert_eq!(req.path(), "/v2/a/blobs/uploads/1");
        assert_eq!(req.query(), [("x".to_string(), "y".to_string())]);
    }
}
