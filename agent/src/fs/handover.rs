//! Keeping FUSE connections alive across a restart of the agent, so the containers of
//! a node keep reading their images while the agent is replaced (the snapshotter's
//! mounts are the lower layer of running containers' root filesystems).
//!
//! A FUSE connection lives as long as some process holds its `/dev/fuse` descriptor.
//! So the agent gives a copy of each such descriptor to the **keeper**
//! (`tessera fuse-keeper`), a small process of its own that does nothing but hold
//! them and hand them back, over a unix socket with `SCM_RIGHTS`. While the agent is
//! gone, the kernel queues the mounts' requests (readers wait); the next agent takes
//! the descriptors back and serves them again ([`relay`]). The keeper lets go of a
//! descriptor when told, or when its mount has disappeared, and exits when it holds
//! none and no agent is connected.
//!
//! Taking over a connection: the kernel and the previous server negotiated it (`INIT`)
//! long ago, and `fuser` answers nothing before an `INIT` of its own. [`relay`] puts
//! the new session on one end of a socket pair, gives it a synthetic `INIT` (its
//! answer goes nowhere), then relays messages between the pair and the connection; it
//! asks the kernel to resend requests the previous server read but never answered
//! (`FUSE_NOTIFY_RESEND`, Linux 6.9+; older kernels leave those waiting).

use std::collections::HashMap;
use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::net::{
    AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, SocketAddrUnix, SocketFlags, SocketType,
};

use super::mount_table::fuse_mounted_at;

/// How a new mount gets its filesystem to the mount point: mounted anew, handed to
/// the keeper, or taken over from it. Here rather than with the mount's life cycle
/// (`daemon::lifecycle`) because the snapshotter, below the daemon, chooses it.
#[derive(Debug)]
pub enum Attach {
    /// Mounts anew; unmounted at shutdown.
    Mount,
    /// Mounts anew and gives the keeper a copy of the FUSE connection, so the mount
    /// outlives this agent (if the keeper refuses, it is an ordinary mount).
    HandOver(Arc<Keeper>),
    /// Serves `connection`, the keeper's copy of the connection of a mount an earlier
    /// agent left at the mount point; the keeper keeps holding it.
    TakeOver {
        connection: OwnedFd,
        keeper: Arc<Keeper>,
    },
}

/// The longest control message (`hold <mountpoint>` and the like).
const MAX_MESSAGE: usize = 8192;

/// How long a keeper with nothing to hold waits for its first agent.
const FIRST_AGENT_WAIT: Duration = Duration::from_secs(30);

/// How often a keeper without an agent checks that its mounts still exist.
const PRUNE_EVERY: Duration = Duration::from_secs(2);

fn seqpacket() -> io::Result<OwnedFd> {
    Ok(rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?)
}

fn send(socket: BorrowedFd<'_>, text: &str, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds;
    if let Some(fd) = fd {
        fds = [fd];
        control.push(SendAncillaryMessage::ScmRights(&fds));
    }
    rustix::net::sendmsg(
        socket,
        &[IoSlice::new(text.as_bytes())],
        &mut control,
        SendFlags::NOSIGNAL,
    )?;
    Ok(())
}

/// One message and the descriptor it carried; `None` at the end of the stream.
fn receive(socket: BorrowedFd<'_>) -> io::Result<Option<(String, Option<OwnedFd>)>> {
    let mut buf = vec![0u8; MAX_MESSAGE];
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = rustix::net::recvmsg(
        socket,
        &mut [IoSliceMut::new(&mut buf)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    let mut fd = None;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for received in fds {
                fd.get_or_insert(received);
            }
        }
    }
    if got.bytes == 0 && fd.is_none() {
        return Ok(None);
    }
    let text = String::from_utf8_lossy(&buf[..got.bytes]).into_owned();
    Ok(Some((text, fd)))
}

/// `tessera fuse-keeper`: holds descriptors for agents on `socket` until their mounts
/// are gone (see the module documentation). With `stay` it never exits (a container
/// of its own beside the agent's, in Kubernetes: the agent's container restarting
/// takes every process in it along).
pub fn run_keeper(socket: &Path, stay: bool) -> io::Result<()> {
    let listener = seqpacket()?;
    let _ = std::fs::remove_file(socket);
    rustix::net::bind(&listener, &SocketAddrUnix::new(socket)?)?;
    rustix::net::listen(&listener, 4)?;
    // `accept` returns EAGAIN after this long, to prune and maybe exit.
    rustix::net::sockopt::set_socket_timeout(
        &listener,
        rustix::net::sockopt::Timeout::Recv,
        Some(PRUNE_EVERY),
    )?;
    let started = Instant::now();
    let mut served = false;
    let mut held: HashMap<String, OwnedFd> = HashMap::new();
    loop {
        match rustix::net::accept_with(&listener, SocketFlags::CLOEXEC) {
            Ok(agent) => {
                served = true;
                serve_agent(agent.as_fd(), &mut held);
            }
            Err(e) if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::INTR => {}
            Err(e) => return Err(e.into()),
        }
        held.retain(|mountpoint, _| fuse_mounted_at(Path::new(mountpoint)));
        if !stay && held.is_empty() && (served || started.elapsed() > FIRST_AGENT_WAIT) {
            let _ = std::fs::remove_file(socket);
            return Ok(());
        }
    }
}

/// One agent's requests, until it goes away.
fn serve_agent(agent: BorrowedFd<'_>, held: &mut HashMap<String, OwnedFd>) {
    loop {
        let (text, fd) = match receive(agent) {
            Ok(Some(m)) => m,
            Ok(None) | Err(_) => return,
        };
        let answer = match (text.split_once(' '), fd) {
            (Some(("hold", id)), Some(fd)) => {
                held.insert(id.to_string(), fd);
                send(agent, "ok", None)
            }
            (Some(("drop", id)), _) => {
                held.remove(id);
                send(agent, "ok", None)
            }
            _ if text == "list" => held
                .iter()
                .try_for_each(|(id, fd)| send(agent, &format!("fd {id}"), Some(fd.as_fd())))
                .and_then(|()| send(agent, "end", None)),
            _ => send(agent, "error: unknown request", None),
        };
        if answer.is_err() {
            return;
        }
    }
}

/// The agent's connection to its keeper.
#[derive(Debug)]
pub struct Keeper {
    connection: Mutex<OwnedFd>,
}

impl Keeper {
    /// Connects to the keeper at `socket`, starting one (`exe fuse-keeper --socket
    /// socket`, in a process group of its own, logging to `log`) if none answers.
    pub fn connect_or_start(socket: &Path, exe: &Path, log: &Path) -> io::Result<Keeper> {
        if let Ok(k) = Keeper::connect(socket) {
            return Ok(k);
        }
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        use std::os::unix::process::CommandExt;
        Command::new(exe)
            .arg("fuse-keeper")
            .arg("--socket")
            .arg(socket)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            // Signals to the agent's group (a terminal's ^C, a service manager) must
            // not reach it.
            .process_group(0)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match Keeper::connect(socket) {
                Ok(k) => return Ok(k),
                Err(e) if Instant::now() > deadline => {
                    return Err(io::Error::other(format!(
                        "the FUSE keeper did not answer on {}: {e}",
                        socket.display()
                    )))
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    fn connect(socket: &Path) -> io::Result<Keeper> {
        let s = seqpacket()?;
        rustix::net::connect(&s, &SocketAddrUnix::new(socket)?)?;
        Ok(Keeper {
            connection: Mutex::new(s),
        })
    }

    fn request(&self, text: &str, fd: Option<BorrowedFd<'_>>) -> io::Result<()> {
        let c = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        send(c.as_fd(), text, fd)?;
        match receive(c.as_fd())? {
            Some((answer, _)) if answer == "ok" => Ok(()),
            Some((answer, _)) => Err(io::Error::other(format!("the FUSE keeper: {answer}"))),
            None => Err(io::Error::other("the FUSE keeper went away")),
        }
    }

    /// Gives the keeper a copy of the connection of the mount at `mountpoint`.
    pub fn hold(&self, mountpoint: &Path, fuse: BorrowedFd<'_>) -> io::Result<()> {
        self.request(&format!("hold {}", mountpoint.display()), Some(fuse))
    }

    /// Tells the keeper to let go of `mountpoint`'s connection (before unmounting it).
    pub fn release(&self, mountpoint: &Path) -> io::Result<()> {
        self.request(&format!("drop {}", mountpoint.display()), None)
    }

    /// Copies of every connection the keeper holds, by mount point.
    pub fn held(&self) -> io::Result<HashMap<PathBuf, OwnedFd>> {
        let c = self.connection.lock().unwrap_or_else(|p| p.into_inner());
        send(c.as_fd(), "list", None)?;
        let mut out = HashMap::new();
        loop {
            match receive(c.as_fd())? {
                Some((text, Some(fd))) if text.starts_with("fd ") => {
                    out.insert(PathBuf::from(&text[3..]), fd);
                }
                Some((text, _)) if text == "end" => return Ok(out),
                other => {
                    return Err(io::Error::other(format!(
                        "the FUSE keeper answered {:?} to a list",
                        other.map(|(t, _)| t)
                    )))
                }
            }
        }
    }
}

/// `FUSE_INIT`, and the protocol version the synthetic one claims.
const FUSE_INIT: u32 = 26;
const FUSE_NOTIFY_RESEND: i32 = 7;

/// The largest message the kernel may write to a FUSE server: a write of `max_write`
/// (fuser asks for 16 MiB) with its headers. A read of `/dev/fuse` into a smaller
/// buffer fails.
const DEV_BUFFER: usize = (16 << 20) + 4096;

/// Relays between the FUSE connection `dev` (already initialised by an earlier
/// server) and a new session: returns the descriptor to give `fuser::Session::from_fd`.
/// The relay's threads end when the connection does (unmount) or the session does.
pub fn relay(dev: OwnedFd) -> io::Result<OwnedFd> {
    let (ours, session) = rustix::net::socketpair(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )?;
    // A read's answer (up to 1 MiB of data) must fit one packet.
    for s in [&ours, &session] {
        let _ = rustix::net::sockopt::set_socket_send_buffer_size_force(s, 8 << 20);
        let _ = rustix::net::sockopt::set_socket_recv_buffer_size_force(s, 8 << 20);
    }
    // The synthetic INIT: fuse_in_header (40 bytes) + fuse_init_in of ABI 7.40 (the
    // one fuser is built for: major, minor, max_readahead, flags, flags2, 11 unused),
    // offering no capabilities (so no passthrough: see `filesystem`).
    let mut init = Vec::with_capacity(104);
    for v in [104u32, FUSE_INIT] {
        init.extend_from_slice(&v.to_ne_bytes());
    }
    init.extend_from_slice(&u64::MAX.to_ne_bytes()); // unique: never the kernel's
    init.extend_from_slice(&1u64.to_ne_bytes()); // nodeid
    for v in [0u32, 0, 0, 0] {
        init.extend_from_slice(&v.to_ne_bytes()); // uid, gid, pid, padding
    }
    for v in [7u32, 40, 1 << 20, 0, 0] {
        init.extend_from_slice(&v.to_ne_bytes()); // major, minor, max_readahead, flags, flags2
    }
    init.extend_from_slice(&[0; 44]); // unused
    rustix::net::send(&ours, &init, SendFlags::NOSIGNAL)?;
    let ours = Arc::new(ours);
    let dev = Arc::new(dev);

    let (to_kernel, from_session) = (dev.clone(), ours.clone());
    std::thread::Builder::new()
        .name("tessera-fuse-up".into())
        .spawn(move || {
            let mut buf = vec![0u8; DEV_BUFFER];
            let mut first = true;
            loop {
                let n = match rustix::net::recv(&*from_session, &mut buf, RecvFlags::empty()) {
                    Ok((0, _)) | Err(_) => return,
                    Ok((n, _)) => n,
                };
                if std::mem::take(&mut first) {
                    continue; // the answer to the synthetic INIT
                }
                // ENOENT: the request was interrupted meanwhile; nothing to do.
                if let Err(e) = rustix::io::write(&*to_kernel, &buf[..n]) {
                    if e == rustix::io::Errno::NODEV {
                        return;
                    }
                }
            }
        })?;

    let (from_kernel, to_session) = (dev.clone(), ours);
    std::thread::Builder::new()
        .name("tessera-fuse-down".into())
        .spawn(move || {
            let mut buf = vec![0u8; DEV_BUFFER];
            loop {
                let n = match rustix::io::read(&*from_kernel, &mut buf) {
                    Ok(n) => n,
                    Err(e)
                        if e == rustix::io::Errno::NOENT
                            || e == rustix::io::Errno::INTR
                            || e == rustix::io::Errno::AGAIN =>
                    {
                        continue
                    }
                    Err(_) => break, // ENODEV: unmounted
                };
                if rustix::net::send(&*to_session, &buf[..n], SendFlags::NOSIGNAL).is_err() {
                    break;
                }
            }
            // The session reads end-of-stream and ends.
            let _ = rustix::net::shutdown(&*to_session, rustix::net::Shutdown::Both);
        })?;

    // Requests the previous server read but never answered: sent again.
    let mut resend = Vec::with_capacity(16);
    resend.extend_from_slice(&16u32.to_ne_bytes());
    resend.extend_from_slice(&FUSE_NOTIFY_RESEND.to_ne_bytes());
    resend.extend_from_slice(&0u64.to_ne_bytes());
    if let Err(e) = rustix::io::write(&*dev, &resend) {
        tracing::debug!(error = %e, "the kernel does not resend pending FUSE requests (Linux < 6.9)");
    }
    Ok(session)
}
