//! A mount's life, in one place: the states a mount of this agent goes through and
//! the only code that moves it between them.
//!
//! ```text
//!            ┌─ Attach::Mount ──────▶ Mounted ───────────┐ unmount, or shutdown
//!   New ─────┼─ Attach::HandOver ───▶ HandedOver ────────┤ unmount
//!            └─ Attach::TakeOver ───▶ TakenOver ─────────┤ unmount
//!                                                         ▼
//!                                     Unmounting ───▶ Gone
//!   HandedOver, TakenOver ── shutdown: left mounted for the next agent ──▶ Gone
//! ```
//!
//! A mount handed to the FUSE keeper ([`crate::fs::handover`]) outlives this agent: at
//! shutdown it stays mounted, the keeper holding its connection, and the next agent
//! takes it over (`Attach::TakeOver`), so the containers reading it never notice.
//! Unmounting such a mount lets the keeper go of its copy first. Everything else is
//! unmounted at shutdown.

use std::os::fd::AsFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rafs_format::reader::Bootstrap;

use super::mounted::MountedImage;
use super::MountStatus;
use crate::cache::{ChunkKey, ImagePin};
use crate::fs::handover::{Attach, Keeper};
use crate::fs::{self, ChunkReader, MountOptions, Mounted};
use crate::{Error, Result};

/// Where a mount is in its life (see the module documentation).
#[derive(Debug)]
enum State {
    /// Set up (image open, bootstrap verified), not served yet.
    New,
    /// Served by this agent, which mounted it.
    Mounted(Mounted),
    /// Mounted by this agent, its connection also held by the keeper.
    HandedOver {
        session: Mounted,
        keeper: Arc<Keeper>,
    },
    /// Served by this agent on the connection an earlier agent left (held by the keeper).
    TakenOver {
        session: Mounted,
        keeper: Arc<Keeper>,
    },
    /// Being unmounted.
    Unmounting,
    /// Unmounted, or left mounted for the next agent: this agent serves it no more.
    Gone,
}

impl State {
    fn session(&self) -> Option<&Mounted> {
        match self {
            State::Mounted(session)
            | State::HandedOver { session, .. }
            | State::TakenOver { session, .. } => Some(session),
            State::New | State::Unmounting | State::Gone => None,
        }
    }
}

/// A mounted image.
#[derive(Debug)]
pub struct Mount {
    pub image: Arc<MountedImage>,
    /// Canonical.
    pub mountpoint: PathBuf,
    state: Mutex<State>,
    /// The background prefetch of the image, stopped when the mount ends.
    prefetch: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// The image's chunks pinned in the cache, released when the mount is Gone.
    pin: Mutex<Option<ImagePin>>,
    pub(super) mounted_at: SystemTime,
    /// How long mounting took, from the request.
    pub(super) mount_seconds: f64,
}

impl Mount {
    /// New → Mounted, HandedOver or TakenOver: serves `bootstrap` at `mountpoint` as
    /// `attach` says. `started`: when the mount was asked for.
    pub(super) async fn attach(
        image: Arc<MountedImage>,
        bootstrap: Arc<Bootstrap>,
        mountpoint: PathBuf,
        opts: MountOptions,
        attach: Attach,
        started: std::time::Instant,
        pin: ImagePin,
    ) -> Result<Arc<Mount>> {
        let mount = Mount {
            image: image.clone(),
            mountpoint: mountpoint.clone(),
            state: Mutex::new(State::New),
            prefetch: Mutex::new(None),
            pin: Mutex::new(Some(pin)),
            mounted_at: SystemTime::now(),
            mount_seconds: 0.0,
        };
        let reader = image as Arc<dyn ChunkReader>;
        let (connection, keeper) = match attach {
            Attach::Mount => (None, None),
            Attach::HandOver(keeper) => (None, Some(keeper)),
            Attach::TakeOver { connection, keeper } => (Some(connection), Some(keeper)),
        };
        let taking_over = connection.is_some();
        let mut session = tokio::task::spawn_blocking(move || match connection {
            Some(connection) => fs::attach(bootstrap, reader, &mountpoint, connection, &opts),
            None => fs::mount(bootstrap, reader, &mountpoint, &opts),
        })
        .await
        .map_err(|e| Error::Service {
            service: "mount".into(),
            reason: format!("the mount task ended: {e}"),
        })??;
        // The session's own copy of the connection: only the keeper of a new mount
        // needs it (a taken-over one is held already); closed otherwise.
        let copy = session.take_connection();
        let state = match (keeper, taking_over) {
            (None, _) => State::Mounted(session),
            (Some(keeper), true) => State::TakenOver { session, keeper },
            (Some(keeper), false) => {
                let held = copy
                    .as_ref()
                    .map(|c| keeper.hold(&mount.mountpoint, c.as_fd()));
                match held {
                    Some(Ok(())) => State::HandedOver { session, keeper },
                    Some(Err(e)) => {
                        tracing::warn!(mountpoint = %mount.mountpoint.display(), error = %e, "the FUSE keeper did not take the mount: it will not outlive this agent");
                        State::Mounted(session)
                    }
                    None => State::Mounted(session),
                }
            }
        };
        *mount.state() = state;
        Ok(Arc::new(Mount {
            mounted_at: SystemTime::now(),
            mount_seconds: started.elapsed().as_secs_f64(),
            ..mount
        }))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `task` as this mount's prefetch (stopped when the mount ends).
    pub(super) fn set_prefetch(&self, task: tokio::task::JoinHandle<()>) {
        *self.prefetch.lock().unwrap_or_else(|p| p.into_inner()) = Some(task);
    }

    fn stop_prefetch(&self) {
        if let Some(task) = self
            .prefetch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            task.abort();
        }
    }

    /// Mounted, HandedOver or TakenOver → Unmounting → Gone: stops prefetch, lets the
    /// keeper go of its copy, unmounts, and logs the pull summary.
    pub async fn unmount(&self) -> MountStatus {
        self.stop_prefetch();
        let state = std::mem::replace(&mut *self.state(), State::Unmounting);
        let session = match state {
            State::Mounted(session) => Some(session),
            State::HandedOver { session, keeper } | State::TakenOver { session, keeper } => {
                if let Err(e) = keeper.release(&self.mountpoint) {
                    tracing::warn!(mountpoint = %self.mountpoint.display(), error = %e, "the FUSE keeper did not let go of a mount");
                }
                Some(session)
            }
            State::New | State::Unmounting | State::Gone => None,
        };
        if let Some(session) = session {
            // Unmounting waits for the kernel; keep it off the async workers.
            let _ = tokio::task::spawn_blocking(move || session.unmount()).await;
        }
        *self.state() = State::Gone;
        self.unpin().await;
        let status = self.status();
        tracing::info!("unmounted: {status}");
        status
    }

    /// Shutdown: HandedOver and TakenOver → Gone, left mounted for the next agent (the
    /// keeper holds them); anything else is unmounted.
    pub(super) async fn shut_down(&self) {
        let kept = {
            let mut state = self.state();
            match std::mem::replace(&mut *state, State::Gone) {
                State::HandedOver { session, .. } | State::TakenOver { session, .. } => {
                    Some(session)
                }
                other => {
                    *state = other;
                    None
                }
            }
        };
        let Some(session) = kept else {
            self.unmount().await;
            return;
        };
        self.stop_prefetch();
        if let Some(pin) = self.pin.lock().unwrap_or_else(|p| p.into_inner()).take() {
            pin.release_without_evicting();
        }
        session.leave_mounted();
        tracing::info!(mountpoint = %self.mountpoint.display(), "left mounted for the next agent (the FUSE keeper holds it)");
    }

    /// Releases the image's pin; its drop may evict (file removals): not on an async
    /// worker.
    async fn unpin(&self) {
        let pin = self.pin.lock().unwrap_or_else(|p| p.into_inner()).take();
        if pin.is_some() {
            let _ = tokio::task::spawn_blocking(move || drop(pin)).await;
        }
    }

    /// The keys of the image's chunks, pinned while it is mounted.
    pub(super) fn pinned_keys(&self) -> Option<Arc<[ChunkKey]>> {
        let pin = self.pin.lock().unwrap_or_else(|p| p.into_inner());
        pin.as_ref().map(|pin| pin.keys().clone())
    }

    /// The filesystem's operation counters while it is served.
    pub(super) fn fs_stats(&self) -> Option<Arc<fs::FsStats>> {
        self.state().session().map(Mounted::stats)
    }
}
