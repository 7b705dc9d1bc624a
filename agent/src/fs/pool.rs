//! The worker threads reads run on, so that the session thread never waits for data.
//!
//! A plain channel of boxed jobs shared by N threads: the jobs are few (the kernel keeps
//! at most `max_background` reads in flight, plus one per reading thread) and each is
//! dominated by fetching a chunk, so nothing fancier would pay.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};

/// A job gets `true` if the filesystem was unmounted while it waited in the queue: its
/// reply can no longer reach anyone, so it should end without fetching anything.
type Job = Box<dyn FnOnce(bool) + Send>;

#[derive(Debug)]
pub struct Pool {
    /// `None` only while dropping; closing it is what tells the workers to exit.
    jobs: Option<Sender<Job>>,
    /// Set when the filesystem goes away (see [`Job`]).
    unmounted: Arc<AtomicBool>,
}

impl Pool {
    /// Starts `workers` threads (at least one), each inside `span`.
    pub fn new(workers: usize, span: &tracing::Span) -> std::io::Result<Self> {
        let (jobs, queue) = channel::<Job>();
        let queue = Arc::new(Mutex::new(queue));
        let unmounted = Arc::new(AtomicBool::new(false));
        for i in 0..workers.max(1) {
            let (queue, unmounted, span) = (queue.clone(), unmounted.clone(), span.clone());
            std::thread::Builder::new()
                .name(format!("tessera-read-{i}"))
                .spawn(move || span.in_scope(|| work(&queue, &unmounted)))?;
        }
        Ok(Pool {
            jobs: Some(jobs),
            unmounted,
        })
    }

    /// Queues a job for the next free worker.
    pub fn execute(&self, job: impl FnOnce(bool) + Send + 'static) {
        // The workers outlive every sender, so the send cannot fail; if it somehow did,
        // dropping the job drops its FUSE reply, which answers EIO.
        if let Some(jobs) = &self.jobs {
            let _ = jobs.send(Box::new(job));
        }
    }
}

impl Drop for Pool {
    /// Does not wait for the workers: one may be blocked fetching a chunk for a while,
    /// and unmounting should not. Jobs still queued end at once; each worker exits when
    /// the queue is empty and closed.
    fn drop(&mut self) {
        self.unmounted.store(true, Ordering::Release);
        self.jobs = None;
    }
}

fn work(queue: &Mutex<Receiver<Job>>, unmounted: &AtomicBool) {
    loop {
        // The lock is held only while waiting for a job, not while running it.
        let job = queue.lock().unwrap_or_else(|p| p.into_inner()).recv();
        let Ok(job) = job else { return };
        let gone = unmounted.load(Ordering::Acquire);
        // A panicking job drops its reply, which answers EIO; the worker lives on.
        if catch_unwind(AssertUnwindSafe(|| job(gone))).is_err() {
            tracing::error!("a read panicked; it was answered with EIO");
        }
    }
}
