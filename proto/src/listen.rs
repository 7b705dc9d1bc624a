//! How every listener of both binaries takes connections, so that no client — idle,
//! slow or hostile, one or a thousand — can take a daemon's descriptors:
//!
//! - [`raise_fd_limit`]: the soft `RLIMIT_NOFILE` raised to the hard limit at start (the
//!   default soft limit, 1024, is a few hundred idle connections);
//! - a [`Gate`] per listener: at most its cap of connections at once; one past the cap
//!   is closed at once and counted ([`Gate::refused`]); the accept loop backs off when
//!   descriptors run out (EMFILE, ENFILE) instead of spinning;
//! - a first-byte deadline ([`Admitted`]): a connection that sends nothing at all within
//!   the gate's `first_byte` time is closed (HTTP/1 servers also set hyper's header-read
//!   timeout, which covers slow heads and idle keep-alive connections; gRPC servers set
//!   keepalive pings, a stream limit and a maximum connection age).

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long the accept loop pauses when the process is out of descriptors.
const OUT_OF_DESCRIPTORS_PAUSE: Duration = Duration::from_millis(100);

/// Raises the soft limit on open descriptors to the hard limit; returns the limit now
/// in force (raised or not; `u64::MAX` for unlimited).
pub fn raise_fd_limit() -> io::Result<u64> {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        setrlimit(Resource::Nofile, raised).map_err(io::Error::from)?;
    }
    Ok(fd_limit())
}

/// The open-descriptor limit in force now (`u64::MAX` for unlimited).
pub fn fd_limit() -> u64 {
    rustix::process::getrlimit(rustix::process::Resource::Nofile)
        .current
        .unwrap_or(u64::MAX)
}

/// The default cap of each listener, from the descriptor limit: a quarter of it (at
/// least 64) is kept for everything else — the cache's files, FUSE, outgoing
/// connections — and the rest shared by up to `listeners` listeners.
pub fn default_cap(fd_limit: u64, listeners: u64) -> usize {
    let reserve = (fd_limit / 4).max(64);
    let share = fd_limit.saturating_sub(reserve) / listeners.max(1);
    share.clamp(8, 65_536) as usize
}

/// A listener's admission: its cap, what it refused, and its first-byte deadline.
#[derive(Clone)]
pub struct Gate {
    name: &'static str,
    permits: Arc<Semaphore>,
    refused: Arc<AtomicU64>,
    /// Also told of each refusal (a metric).
    on_refused: Option<Arc<dyn Fn() + Send + Sync>>,
    first_byte: Duration,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("name", &self.name)
            .field("free", &self.permits.available_permits())
            .field("refused", &self.refused())
            .field("first_byte", &self.first_byte)
            .finish()
    }
}

/// Something that accepts connections (a TCP or a unix listener).
pub trait Listener: Send + Sync + 'static {
    type Stream: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn accept_one(&self) -> impl Future<Output = io::Result<Self::Stream>> + Send;
}

impl Listener for TcpListener {
    type Stream = TcpStream;
    async fn accept_one(&self) -> io::Result<TcpStream> {
        let (stream, _) = self.accept().await?;
        // Chunks and small API answers go out at once.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Listener for UnixListener {
    type Stream = UnixStream;
    async fn accept_one(&self) -> io::Result<UnixStream> {
        self.accept().await.map(|(stream, _)| stream)
    }
}

impl Gate {
    /// A gate for the listener `name` (in logs) letting `cap` connections in at once,
    /// each of which must send its first byte within `first_byte`.
    pub fn new(name: &'static str, cap: usize, first_byte: Duration) -> Gate {
        Gate {
            name,
            permits: Arc::new(Semaphore::new(cap.max(1))),
            refused: Arc::new(AtomicU64::new(0)),
            on_refused: None,
            first_byte,
        }
    }

    /// Also calls `count` for every connection refused (to count it in a metric).
    pub fn on_refused(mut self, count: impl Fn() + Send + Sync + 'static) -> Gate {
        self.on_refused = Some(Arc::new(count));
        self
    }

    /// The listener's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Connections closed at once because the listener was at its cap.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// The next connection within the cap. Connections past it are closed at once;
    /// when descriptors run out, the loop pauses instead of spinning.
    pub async fn accept<L: Listener>(&self, listener: &L) -> Admitted<L::Stream> {
        let mut warned: Option<Instant> = None;
        let mut warn = |what: &str, error: Option<&io::Error>| {
            // One line a minute at most per listener: a flood must not flood the log.
            if warned.is_none_or(|at| at.elapsed() >= Duration::from_secs(60)) {
                warned = Some(Instant::now());
                tracing::warn!(
                    listener = self.name,
                    error = error.map(tracing::field::display),
                    refused = self.refused(),
                    "{what}"
                );
            }
        };
        loop {
            match listener.accept_one().await {
                Ok(stream) => match self.permits.clone().try_acquire_owned() {
                    Ok(permit) => return Admitted::new(stream, permit, self.first_byte),
                    Err(_) => {
                        self.refused.fetch_add(1, Ordering::Relaxed);
                        if let Some(count) = &self.on_refused {
                            count();
                        }
                        drop(stream);
                        warn("at its connection cap: closed a new connection", None);
                    }
                },
                Err(e) if out_of_descriptors(&e) => {
                    warn("out of file descriptors: accepting again shortly", Some(&e));
                    tokio::time::sleep(OUT_OF_DESCRIPTORS_PAUSE).await;
                }
                // A connection reset before it was accepted, and the like: the next.
                Err(_) => {}
            }
        }
    }

    /// The admitted connections of `listener` as a stream (what tonic's
    /// `serve_with_incoming` takes). The accept loop ends when the stream is dropped.
    pub fn incoming<L: Listener>(
        self,
        listener: L,
    ) -> tokio_stream::wrappers::ReceiverStream<io::Result<Admitted<L::Stream>>> {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            loop {
                let admitted = tokio::select! {
                    admitted = self.accept(&listener) => admitted,
                    () = tx.closed() => return,
                };
                if tx.send(Ok(admitted)).await.is_err() {
                    return;
                }
            }
        });
        tokio_stream::wrappers::ReceiverStream::new(rx)
    }
}

/// How often a gRPC server pings a quiet client, and how long it waits for the answer
/// before closing the connection (a peer gone without a FIN).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// A gRPC server with the limits every gRPC listener applies: `streams` requests at
/// once per connection, keepalive pings, and connections closed gracefully at
/// `max_age` (clients reconnect), so a connection that answers pings but asks for
/// nothing does not live forever.
pub fn grpc_server(streams: u32, max_age: Duration) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(Some(streams))
        .concurrency_limit_per_connection(streams as usize)
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .max_connection_age(max_age)
}

fn out_of_descriptors(e: &io::Error) -> bool {
    // EMFILE (24): this process; ENFILE (23): the whole system.
    matches!(e.raw_os_error(), Some(24) | Some(23))
}

/// An admitted connection: it holds its place under the gate's cap until dropped, and
/// fails its reads if the client sends nothing before the first-byte deadline.
#[derive(Debug)]
pub struct Admitted<S> {
    stream: S,
    _permit: OwnedSemaphorePermit,
    /// Until the first byte arrives.
    deadline: Option<Pin<Box<Sleep>>>,
}

impl<S> Admitted<S> {
    fn new(stream: S, permit: OwnedSemaphorePermit, first_byte: Duration) -> Self {
        Admitted {
            stream,
            _permit: permit,
            deadline: Some(Box::pin(tokio::time::sleep(first_byte))),
        }
    }

    pub fn get_ref(&self) -> &S {
        &self.stream
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Admitted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.stream).poll_read(cx, buf);
        if self.deadline.is_some() {
            if buf.filled().len() > before {
                self.deadline = None;
            } else if read.is_pending()
                && self
                    .deadline
                    .as_mut()
                    .is_some_and(|d| d.as_mut().poll(cx).is_ready())
            {
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the client sent nothing in time",
                )));
            }
        }
        read
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Admitted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl<S: tonic::transport::server::Connected> tonic::transport::server::Connected for Admitted<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[test]
    fn the_default_cap_keeps_a_reserve() {
        assert_eq!(default_cap(1024, 8), 96);
        assert_eq!(default_cap(256, 8), 24);
        assert_eq!(default_cap(64, 8), 8);
        assert_eq!(default_cap(1 << 20, 8), 65_536);
    }

    #[tokio::test]
    async fn past_the_cap_a_connection_is_closed_and_counted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Gate::new("test", 1, Duration::from_secs(60));
        let _first = TcpStream::connect(addr).await.unwrap();
        let held = gate.accept(&listener).await;
        let mut second = TcpStream::connect(addr).await.unwrap();
        // At the cap: the second is closed at once, and the gate waits on.
        let waited = tokio::time::timeout(Duration::from_millis(300), gate.accept(&listener));
        assert!(waited.await.is_err());
        let mut buf = [0u8; 1];
        assert_eq!(
            second.read(&mut buf).await.unwrap_or(0),
            0,
            "closed at once"
        );
        assert_eq!(gate.refused(), 1);
        // Once the first is gone, the next is let in.
        drop(held);
        let third = TcpStream::connect(addr).await.unwrap();
        let admitted = tokio::time::timeout(Duration::from_secs(5), gate.accept(&listener))
            .await
            .unwrap();
        assert_eq!(
            admitted.get_ref().peer_addr().unwrap(),
            third.local_addr().unwrap()
        );
    }

    #[tokio::test]
    async fn a_client_that_sends_nothing_is_cut_off() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Gate::new("test", 4, Duration::from_millis(200));
        let _silent = TcpStream::connect(addr).await.unwrap();
        let mut admitted = gate.accept(&listener).await;
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_secs(5), admitted.read(&mut buf))
            .await
            .unwrap();
        assert_eq!(read.unwrap_err().kind(), io::ErrorKind::TimedOut);
    }
}
