//! Layers downloaded to files that the build reads while they grow, so a conversion
//! decompresses and chunks a layer as it arrives rather than after the whole pull.
//!
//! Each download writes its file synchronously (page-cache writes of one HTTP chunk)
//! and then counts the bytes as landed; a [`Follow`] reader in the build's thread reads
//! up to what has landed and waits for more. A download that fails, or is dropped
//! before it ends, ends its readers with an error; the caller still joins every
//! download ([`Downloads::finish`]), which is where a bad digest is reported even when
//! the build stopped reading early (a tar ends before its stream's padding does).

use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::io::AsyncWrite;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::registry::client::RegistryClient;
use crate::registry::image::PlatformImage;
use crate::{Error, Result};

/// How one layer's download stands.
#[derive(Debug, Default)]
struct State {
    /// Bytes written to the file so far.
    bytes: u64,
    /// Set when the download ended: how, and when.
    end: Option<(std::result::Result<(), String>, Instant)>,
}

#[derive(Debug, Default)]
struct Landed {
    state: Mutex<State>,
    changed: Condvar,
}

impl Landed {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, n: u64) {
        self.lock().bytes += n;
        self.changed.notify_all();
    }

    /// Records how the download ended (the first end counts).
    fn end(&self, how: std::result::Result<(), String>) {
        let mut state = self.lock();
        if state.end.is_none() {
            state.end = Some((how, Instant::now()));
        }
        drop(state);
        self.changed.notify_all();
    }
}

/// One layer being downloaded.
#[derive(Debug, Clone)]
pub(crate) struct LayerFile {
    pub path: PathBuf,
    landed: Arc<Landed>,
}

impl LayerFile {
    /// A reader of the layer from its start that waits for bytes still to land.
    pub fn follow(&self) -> std::io::Result<Follow> {
        Ok(Follow {
            file: std::fs::File::open(&self.path)?,
            at: 0,
            landed: self.landed.clone(),
        })
    }
}

/// Reads a layer's file as it lands; ends where the download ended, or with its error.
#[derive(Debug)]
pub(crate) struct Follow {
    file: std::fs::File,
    at: u64,
    landed: Arc<Landed>,
}

impl Read for Follow {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let landed = {
            let mut state = self.landed.lock();
            while state.bytes <= self.at && state.end.is_none() {
                state = self
                    .landed
                    .changed
                    .wait(state)
                    .unwrap_or_else(|p| p.into_inner());
            }
            if state.bytes <= self.at {
                return match &state.end {
                    Some((Err(why), _)) => Err(std::io::Error::other(why.clone())),
                    _ => Ok(0),
                };
            }
            state.bytes
        };
        let want = buf.len().min((landed - self.at) as usize);
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the layer file is shorter than what was downloaded",
            ));
        }
        self.at += n as u64;
        Ok(n)
    }
}

/// The download's side of a layer file. Dropped before the download ended (the task
/// was aborted), it ends the readers with an error rather than leaving them waiting.
struct Landing {
    file: Option<std::fs::File>,
    landed: Arc<Landed>,
}

impl Drop for Landing {
    fn drop(&mut self) {
        self.landed
            .end(Err("the layer's download stopped before it ended".into()));
    }
}

impl AsyncWrite for Landing {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        // A write of one HTTP chunk into the page cache: short enough to do in place,
        // and the bytes are in the file before they count as landed.
        let Some(file) = self.file.as_mut() else {
            return Poll::Ready(Err(std::io::Error::other("layer file closed")));
        };
        let n = file.write(buf)?;
        self.landed.add(n as u64);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Every layer of an image downloading, `concurrency` at once, in layer order.
pub(crate) struct Downloads {
    pub layers: Vec<LayerFile>,
    tasks: JoinSet<(usize, Result<u64>)>,
    started: Instant,
}

impl Downloads {
    /// Starts downloading every layer of `source` into `dir` (files `0000`, `0001`, …).
    pub fn start(
        client: &Arc<RegistryClient>,
        source: &PlatformImage,
        dir: &Path,
        concurrency: usize,
    ) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("create", dir, e))?;
        let permits = Arc::new(Semaphore::new(concurrency));
        let mut layers = Vec::new();
        let mut tasks = JoinSet::new();
        for (i, layer) in source.manifest.layers().iter().enumerate() {
            let path = dir.join(format!("{i:04}"));
            let file = std::fs::File::create(&path).map_err(|e| Error::io("create", &path, e))?;
            let landed = Arc::new(Landed::default());
            layers.push(LayerFile {
                path,
                landed: landed.clone(),
            });
            let mut landing = Landing {
                file: Some(file),
                landed,
            };
            let (client, permits) = (client.clone(), permits.clone());
            let reference = source.reference.clone();
            let digest = layer.digest().to_string();
            tasks.spawn(async move {
                // The semaphore is never closed: `acquire` cannot fail.
                let _permit = permits.acquire().await.ok();
                let result = client.blob(&reference, &digest, &mut landing).await;
                landing.file = None;
                landing
                    .landed
                    .end(result.as_ref().map(|_| ()).map_err(ToString::to_string));
                (i, result)
            });
        }
        Ok(Downloads {
            layers,
            tasks,
            started: Instant::now(),
        })
    }

    /// Waits for every download; returns the bytes each brought (in layer order) and
    /// the seconds from the start until the last one ended. The first failure is the
    /// error.
    pub async fn finish(mut self) -> Result<(Vec<u64>, f64)> {
        let mut bytes = vec![0; self.layers.len()];
        while let Some(done) = self.tasks.join_next().await {
            let (i, result) = done.map_err(|e| {
                Error::io(
                    "download layer",
                    Path::new("-"),
                    std::io::Error::other(format!("download task: {e}")),
                )
            })?;
            bytes[i] = result?;
        }
        let last = self
            .layers
            .iter()
            .filter_map(|l| l.landed.lock().end.as_ref().map(|(_, at)| *at))
            .max()
            .unwrap_or(self.started);
        Ok((bytes, last.duration_since(self.started).as_secs_f64()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_follower_reads_what_lands_and_waits_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer");
        let landed = Arc::new(Landed::default());
        let layer = LayerFile {
            path: path.clone(),
            landed: landed.clone(),
        };
        let mut file = std::fs::File::create(&path).unwrap();
        let mut follow = layer.follow().unwrap();
        let writer = std::thread::spawn(move || {
            for part in [&b"hello "[..], b"layer ", b"file"] {
                std::thread::sleep(std::time::Duration::from_millis(20));
                file.write_all(part).unwrap();
                landed.add(part.len() as u64);
            }
            landed.end(Ok(()));
        });
        let mut got = String::new();
        follow.read_to_string(&mut got).unwrap();
        writer.join().unwrap();
        assert_eq!(got, "hello layer file");
    }

    #[test]
    fn a_failed_or_dropped_download_ends_its_readers_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("layer");
        let file = std::fs::File::create(&path).unwrap();
        let landed = Arc::new(Landed::default());
        let layer = LayerFile {
            path,
            landed: landed.clone(),
        };
        let mut follow = layer.follow().unwrap();
        // The download's task is dropped mid-way: its readers must not wait forever.
        drop(Landing {
            file: Some(file),
            landed,
        });
        let err = follow
            .read(&mut [0u8; 16])
            .expect_err("a reader of a dropped download gets an error");
        assert!(err.to_string().contains("stopped before it ended"), "{err}");
    }
}
