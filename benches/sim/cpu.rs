//! The testbed's CPU capacity, measured on this machine rather than fitted to the real
//! run's answer.
//!
//! On the real 20-namespace run every node is a process on the same 2 cores, so once
//! the origin's copy is in, the swarm moves bytes as fast as the machine can process
//! them. Per byte a node receives, the machine does, by the code path:
//!
//! - one TCP transfer over a veth (the peer's or registry's send and the agent's
//!   receive; measured as CPU time per byte of a loopback TCP stream, both ends),
//! - one sha256 (the receiver verifies every chunk: `decode_and_verify`),
//! - `COPIES` memory copies: the sender reading the chunk from its cache file, the
//!   receiver's decode into its own buffer, its write into the cache file, and the
//!   reader's FUSE read (agent → /dev/fuse, kernel → the reading process).
//!
//! Capacity = cores / (seconds of CPU per byte). Not counted (so the model is, if
//! anything, optimistic): FUSE request round trips, tokio and gRPC overheads, the
//! registry's own work, the scheduler.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

use sha2::{Digest, Sha256};

/// Memory copies per byte received (see the module docs).
pub const COPIES: f64 = 5.0;

const BUFFER: usize = 64 << 20;

/// What the measurement found.
#[derive(Debug, Clone, Copy)]
pub struct Capacity {
    pub sha256_bps: f64,
    pub memcpy_bps: f64,
    pub tcp_cpu_bps: f64,
    pub cores: usize,
    /// Bytes per second the machine can receive, verify, store and read back.
    pub bps: f64,
}

pub fn measure() -> Capacity {
    let mut rng = tessera_benches::Rng::new(7);
    let mut data = vec![0u8; BUFFER];
    rng.fill(&mut data);
    let sha256_bps = best_of(3, || {
        let t = Instant::now();
        std::hint::black_box(Sha256::digest(&data));
        BUFFER as f64 / t.elapsed().as_secs_f64()
    });
    let mut copy = vec![0u8; BUFFER];
    let memcpy_bps = best_of(3, || {
        let t = Instant::now();
        copy.copy_from_slice(&data);
        std::hint::black_box(&copy);
        BUFFER as f64 / t.elapsed().as_secs_f64()
    });
    let tcp_cpu_bps = best_of(3, || tcp_cpu_rate(&data));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let seconds_per_byte = 1.0 / sha256_bps + COPIES / memcpy_bps + 1.0 / tcp_cpu_bps;
    Capacity {
        sha256_bps,
        memcpy_bps,
        tcp_cpu_bps,
        cores,
        bps: cores as f64 / seconds_per_byte,
    }
}

fn best_of(n: usize, mut f: impl FnMut() -> f64) -> f64 {
    (0..n).map(|_| f()).fold(0.0, f64::max)
}

/// Bytes per CPU-second of a loopback TCP stream (sender and receiver together): the
/// process's CPU time (/proc/self/stat) while `data` goes through a socket 4 times.
fn tcp_cpu_rate(data: &[u8]) -> f64 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let rounds = 4;
    let before = cpu_seconds();
    let wall = Instant::now();
    let sender = std::thread::scope(|s| {
        let sender = s.spawn(|| {
            let mut out = TcpStream::connect(addr).unwrap();
            for _ in 0..rounds {
                out.write_all(data).unwrap();
            }
        });
        let (mut input, _) = listener.accept().unwrap();
        let mut buf = vec![0u8; 1 << 20];
        let mut got = 0;
        while got < rounds * data.len() {
            let n = input.read(&mut buf).unwrap();
            assert!(n > 0, "loopback stream ended early");
            got += n;
        }
        sender.join().is_ok()
    });
    assert!(sender);
    let cpu = match (before, cpu_seconds()) {
        (Some(a), Some(b)) if b > a => b - a,
        // No /proc: both ends busy for the whole transfer.
        _ => 2.0 * wall.elapsed().as_secs_f64(),
    };
    (rounds * data.len()) as f64 / cpu
}

/// This process's user + system CPU seconds.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // Fields after the command's closing parenthesis; utime and stime are the 14th
    // and 15th fields of the line, in clock ticks (100 per second on Linux).
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}
