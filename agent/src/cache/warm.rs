//! Warming: reading cached files into the kernel's page cache just ahead of a walk.
//!
//! A cold walk of a tree through a mount (`tar`, an interpreter importing a package)
//! opens and reads the files of each directory it lists, one after another. Each of
//! those reads waits on the disk for the chunk file's directory entry, its inode and
//! then its data: three dependent waits per file, one file at a time, where the disk
//! could serve many at once. When the filesystem lists a directory it hands the
//! layouts of the regular files it listed to [`ChunkCache::warm`], and a few threads
//! read what the cache holds of them (the backing copy if there is one, else the chunk
//! files) with several reads in flight, so that the walk's own reads find the pages in
//! memory. Only local files are read, never the network; a full queue drops the offer
//! (warming is a hint, and a walk that outruns it loses nothing).

use std::fs;
use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use super::{ChunkCache, FileLayout};

/// Threads reading: reads in flight at once.
const THREADS: usize = 4;
/// Files waiting to be warmed at most; more are not warmed.
const QUEUE: usize = 1024;
/// Bytes read at a time (into a buffer that is thrown away).
const BUFFER: usize = 256 << 10;

/// The warming threads of one cache, started at its first offer.
pub(super) struct Warmer {
    jobs: SyncSender<FileLayout>,
}

impl Warmer {
    /// Starts the threads; `None` if none could be started (warming is then off).
    pub(super) fn start(cache: Weak<ChunkCache>) -> Option<Warmer> {
        let (jobs, queue) = sync_channel(QUEUE);
        let queue = Arc::new(Mutex::new(queue));
        let mut started = 0;
        for i in 0..THREADS {
            let (queue, cache) = (queue.clone(), cache.clone());
            let spawned = std::thread::Builder::new()
                .name(format!("tessera-warm-{i}"))
                .spawn(move || warm_loop(&queue, &cache));
            match spawned {
                Ok(_) => started += 1,
                Err(error) => tracing::warn!(%error, "could not start a cache warming thread"),
            }
        }
        (started > 0).then_some(Warmer { jobs })
    }

    /// Queues `layout`; `false` if the queue is full.
    pub(super) fn offer(&self, layout: FileLayout) -> bool {
        self.jobs.try_send(layout).is_ok()
    }
}

/// Warms what the queue brings until the cache is dropped (its `Warmer` with it, which
/// closes the queue).
fn warm_loop(queue: &Mutex<Receiver<FileLayout>>, cache: &Weak<ChunkCache>) {
    let mut buffer = vec![0; BUFFER];
    loop {
        let job = queue.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let (Ok(layout), Some(cache)) = (job, cache.upgrade()) else {
            return;
        };
        for path in cache.warm_paths(&layout) {
            let read = read_through(path, &mut buffer);
            cache.warmed_bytes.fetch_add(read, Relaxed);
        }
    }
}

/// Reads `path` to its end, throwing the bytes away; how many were read. A file that
/// is gone (evicted meanwhile) reads nothing.
fn read_through(path: PathBuf, buffer: &mut [u8]) -> u64 {
    let Ok(mut file) = fs::File::open(path) else {
        return 0;
    };
    let mut total = 0;
    while let Ok(n) = file.read(buffer) {
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    total
}
