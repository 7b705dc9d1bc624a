//! Preheat jobs as the membership sees them: handed out in heartbeat answers, their
//! progress sent back with every heartbeat. Running them is the daemon's business: it
//! makes the queue ([`queue`]), keeps the receiving half and gives
//! [`Network`](super::Network) the sending half, so the swarm's membership holds no
//! daemon state.

use std::sync::Mutex;

use tessera_proto::pb;
use tokio::sync::mpsc::{unbounded_channel, UnboundedReceiver, UnboundedSender};

/// Preheat jobs whose state this host keeps sending (oldest finished ones go first).
const PREHEATS_REMEMBERED: usize = 64;

/// Where preheat jobs go to be run.
pub type PreheatSender = UnboundedSender<pb::PreheatTask>;
/// Where the daemon takes preheat jobs from.
pub type PreheatReceiver = UnboundedReceiver<pb::PreheatTask>;

/// A new queue of preheat jobs: the sender for [`Network::new`](super::Network::new),
/// the receiver for whatever runs them.
pub fn queue() -> (PreheatSender, PreheatReceiver) {
    unbounded_channel()
}

/// This host's preheat jobs, as its heartbeats report them.
#[derive(Debug)]
pub(super) struct Preheats {
    /// New jobs go here, to the daemon.
    tasks: PreheatSender,
    /// Where each job stands; the most recent [`PREHEATS_REMEMBERED`].
    progress: Mutex<Vec<pb::PreheatProgress>>,
}

impl Preheats {
    pub(super) fn new(tasks: PreheatSender) -> Self {
        Preheats {
            tasks,
            progress: Mutex::new(Vec::new()),
        }
    }

    /// Records where a job stands; `true` if it finished (the scheduler should hear it
    /// at once rather than at the next beat).
    pub(super) fn record(&self, progress: pb::PreheatProgress) -> bool {
        let finished = progress.state != pb::PreheatState::Running as i32;
        let mut all = self.progress.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|p| p.job_id != progress.job_id);
        all.push(progress);
        while all.len() > PREHEATS_REMEMBERED {
            let oldest_finished = all
                .iter()
                .position(|p| p.state != pb::PreheatState::Running as i32)
                .unwrap_or(0);
            all.remove(oldest_finished);
        }
        finished
    }

    /// Queues the jobs of a heartbeat answer this host does not know yet.
    pub(super) fn start(&self, tasks: Vec<pb::PreheatTask>) {
        for task in tasks {
            {
                let mut all = self.progress.lock().unwrap_or_else(|p| p.into_inner());
                if all.iter().any(|p| p.job_id == task.job_id) {
                    continue;
                }
                all.push(pb::PreheatProgress {
                    job_id: task.job_id.clone(),
                    state: pb::PreheatState::Running.into(),
                    ..Default::default()
                });
            }
            tracing::info!(job = %task.job_id, image = %task.image, "preheat job received");
            if self.tasks.send(task).is_err() {
                tracing::warn!("a preheat job arrived but nothing runs preheat jobs here");
            }
        }
    }

    /// Every job's state, for a heartbeat.
    pub(super) fn all(&self) -> Vec<pb::PreheatProgress> {
        self.progress
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}
