//! Spans of an unconverted gzip layer through the pipeline, with a real gzip stream
//! and fakes behind the seams: the spans of a checkpoint cost one request and one
//! inflation, the window comes from its own blob once, and what the stream spoils
//! fails verification while what comes before it is kept.

use std::collections::HashMap;
use std::io::Read;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use rafs_format::chunk::{compress, Compression, DigestAlgo};
use rafs_format::gzip::{self, GzipReader};

use super::seams::{BoxFuture, Origin, Store};
use super::unit::{Resume, SpanStart, Unit, Wanted};
use super::{FetchMetrics, Fetcher};
use crate::cache::ChunkKey;
use crate::config::FetchConfig;
use crate::{ChunkFailure, Result};

const CHUNK: usize = 64 << 10;
const LAYER: &str = "sha256:layer";
const WINDOWS: &str = "sha256:windows";

/// A gzip layer cut into 64 KiB chunks, each a span, with its checkpoints' windows
/// stored one after another in a blob of their own.
struct Layer {
    data: Vec<u8>,
    gz: Vec<u8>,
    windows: Vec<u8>,
    units: Vec<Unit>,
    resumes: Vec<Resume>,
}

fn key(data: &[u8]) -> ChunkKey {
    ChunkKey {
        algo: DigestAlgo::Sha256,
        digest: DigestAlgo::Sha256.digest(data),
    }
}

impl Layer {
    fn new() -> Layer {
        // Words picked at random: text gzip shrinks about 2x, in many blocks.
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let words = ["alpha ", "beta ", "gamma ", "delta ", "epsilon\n", "zeta "];
        let data: Vec<u8> = std::iter::repeat_with(|| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            words[(x % 6) as usize].as_bytes()
        })
        .flatten()
        .copied()
        .take(3 << 20)
        .collect();
        let (gz, used) = compress(&data, Compression::Gzip, 6);
        assert_eq!(used, Compression::Gzip);
        let mut reader = GzipReader::indexing(&gz[..], 512 << 10);
        let mut out = Vec::new();
        reader.read_to_end(&mut out).unwrap();
        assert!(out == data);
        let (checkpoints, marks) = (reader.take_checkpoints(), reader.take_marks());
        assert!(checkpoints.len() >= 4, "{} checkpoints", checkpoints.len());
        let mut windows = Vec::new();
        let resumes = checkpoints
            .iter()
            .enumerate()
            .map(|(i, cp)| {
                let window = Unit {
                    key: key(&cp.window),
                    index: 10_000 + i as u32,
                    blob: 1,
                    offset: windows.len() as u64,
                    stored_size: cp.window.len() as u32,
                    compression: Compression::None,
                    size: cp.window.len() as u32,
                    span: None,
                };
                windows.extend_from_slice(&cp.window);
                Resume {
                    in_bits: cp.in_bits,
                    out: cp.out,
                    window: Some(window),
                    window_len: cp.window.len() as u32,
                }
            })
            .collect();
        let units = data
            .chunks(CHUNK)
            .enumerate()
            .map(|(i, bytes)| {
                let start = (i * CHUNK) as u64;
                let s = gzip::span(
                    &checkpoints,
                    &marks,
                    start..start + bytes.len() as u64,
                    gz.len() as u64,
                );
                Unit {
                    key: key(bytes),
                    index: i as u32,
                    blob: 0,
                    offset: s.compressed.start,
                    stored_size: (s.compressed.end - s.compressed.start) as u32,
                    compression: Compression::GzipSpan,
                    size: bytes.len() as u32,
                    span: Some(SpanStart {
                        checkpoint: s.checkpoint.map(|c| c as u32),
                        skip: s.skip as u32,
                    }),
                }
            })
            .collect();
        Layer {
            data,
            gz,
            windows,
            units,
            resumes,
        }
    }

    fn chunk(&self, i: usize) -> &[u8] {
        &self.data[i * CHUNK..((i + 1) * CHUNK).min(self.data.len())]
    }
}

/// Serves the layer (with `spoil`ed bytes flipped) and the windows, counting requests.
struct LayerOrigin {
    layer: Arc<Layer>,
    spoil: Option<usize>,
    requests: Mutex<Vec<(String, Range<u64>)>>,
}

impl Origin for LayerOrigin {
    fn range<'a>(
        &'a self,
        blob: &'a str,
        range: Range<u64>,
        arrived: &'a mut (dyn FnMut(&[u8]) + Send),
    ) -> BoxFuture<'a, Result<Vec<u8>>> {
        Box::pin(async move {
            self.requests
                .lock()
                .unwrap()
                .push((blob.to_string(), range.clone()));
            let (start, end) = (range.start as usize, range.end as usize);
            let mut bytes = match blob {
                LAYER => self.layer.gz[start..end].to_vec(),
                _ => self.layer.windows[start..end].to_vec(),
            };
            if let Some(at) = self
                .spoil
                .filter(|at| blob == LAYER && (start..end).contains(at))
            {
                bytes[at - start] ^= 0x55;
            }
            arrived(&bytes);
            Ok(bytes)
        })
    }
}

struct LayerWanted {
    layer: Arc<Layer>,
    origin: LayerOrigin,
}

impl Wanted for LayerWanted {
    fn name(&self) -> String {
        "a gzip layer".into()
    }
    fn blob(&self, unit: &Unit) -> &str {
        if unit.blob == 0 {
            LAYER
        } else {
            WINDOWS
        }
    }
    fn next_in_blob(&self, unit: &Unit) -> Option<Unit> {
        (unit.blob == 0)
            .then(|| self.layer.units.get(unit.index as usize + 1).copied())
            .flatten()
    }
    fn origin(&self) -> &dyn Origin {
        &self.origin
    }
    fn along_with(&self, unit: &Unit) -> Vec<Unit> {
        let units = &self.layer.units[..unit.index as usize];
        units
            .iter()
            .rev()
            .take_while(|u| u.span.map(|s| s.checkpoint) == unit.span.map(|s| s.checkpoint))
            .copied()
            .collect()
    }
    fn resume(&self, checkpoint: u32) -> Option<Resume> {
        self.layer.resumes.get(checkpoint as usize).copied()
    }
}

#[derive(Default)]
struct MemoryStore(Mutex<HashMap<ChunkKey, Vec<u8>>>);

impl Store for MemoryStore {
    fn get(&self, key: &ChunkKey) -> Result<Option<Vec<u8>>> {
        Ok(self.0.lock().unwrap().get(key).cloned())
    }
    fn read(&self, key: &ChunkKey, range: Range<u64>) -> Result<Option<Vec<u8>>> {
        Ok(self
            .get(key)?
            .map(|d| d[range.start as usize..range.end as usize].to_vec()))
    }
    fn contains(&self, key: &ChunkKey) -> bool {
        self.0.lock().unwrap().contains_key(key)
    }
    fn put(&self, key: &ChunkKey, data: &[u8]) -> Result<()> {
        assert_eq!(key.algo.digest(data), key.digest, "unverified bytes stored");
        self.0.lock().unwrap().insert(*key, data.to_vec());
        Ok(())
    }
    fn remove(&self, key: &ChunkKey) -> Result<bool> {
        Ok(self.0.lock().unwrap().remove(key).is_some())
    }
}

/// A fetcher whose reads' runs add at most `merge_bytes` after their first span.
fn bed(
    spoil: Option<usize>,
    merge_bytes: u64,
) -> (Arc<Fetcher>, Arc<MemoryStore>, Arc<LayerWanted>) {
    let layer = Arc::new(Layer::new());
    let store = Arc::new(MemoryStore::default());
    let config = FetchConfig {
        memory_bytes: 0,
        merge_bytes,
        ..FetchConfig::default()
    };
    let fetcher = Arc::new(Fetcher::new(
        store.clone(),
        config,
        Arc::new(FetchMetrics::default()),
    ));
    let wanted = Arc::new(LayerWanted {
        origin: LayerOrigin {
            layer: layer.clone(),
            spoil,
            requests: Mutex::default(),
        },
        layer,
    });
    (fetcher, store, wanted)
}

#[tokio::test]
async fn a_span_brings_its_checkpoints_earlier_spans_from_one_request_and_one_window() {
    // Runs of a span and what comes with it at no cost: nothing after it.
    let (fetcher, store, wanted) = bed(None, 1);
    let layer = wanted.layer.clone();
    // The third span of a checkpoint: its two predecessors come with it.
    let (i, first) = (2..layer.units.len())
        .find_map(|i| {
            let cp = layer.units[i].span.unwrap().checkpoint?;
            let first = layer
                .units
                .iter()
                .position(|u| u.span.unwrap().checkpoint == Some(cp))?;
            (i == first + 2).then_some((i, first))
        })
        .expect("a checkpoint with three spans");
    let dyn_wanted: Arc<dyn Wanted> = wanted.clone();
    let got = fetcher.unit(&dyn_wanted, layer.units[i]).await.unwrap();
    assert!(got.data[..] == *layer.chunk(i));
    fetcher
        .landed(&[layer.units[i].key], std::time::Duration::from_secs(5))
        .await;
    let requests = wanted.origin.requests.lock().unwrap().clone();
    let layer_requests: Vec<_> = requests.iter().filter(|(b, _)| b == LAYER).collect();
    assert_eq!(layer_requests.len(), 1, "{requests:?}");
    assert_eq!(
        layer_requests[0].1.start, layer.units[i].offset,
        "from the checkpoint"
    );
    assert_eq!(
        requests.iter().filter(|(b, _)| b == WINDOWS).count(),
        1,
        "{requests:?}"
    );
    for earlier in first..i {
        let key = layer.units[earlier].key;
        fetcher
            .landed(&[key], std::time::Duration::from_secs(5))
            .await;
        assert!(store.contains(&key), "span {earlier} came along");
    }
}

#[tokio::test]
async fn every_span_of_a_layer_reads_back_at_little_more_than_the_layer() {
    let (fetcher, _store, wanted) = bed(None, 256 << 10);
    let layer = wanted.layer.clone();
    let dyn_wanted: Arc<dyn Wanted> = wanted.clone();
    let mut failed = Vec::new();
    fetcher
        .fetch_all(&dyn_wanted, layer.units.iter().copied(), 2, |u, r| {
            if r.is_err() {
                failed.push(u.index);
            }
        })
        .await;
    assert!(failed.is_empty(), "{failed:?}");
    for (i, unit) in layer.units.iter().enumerate() {
        let got = fetcher.unit(&dyn_wanted, *unit).await.unwrap();
        assert!(got.data[..] == *layer.chunk(i), "span {i}");
    }
    let requests = wanted.origin.requests.lock().unwrap().clone();
    let asked: u64 = requests
        .iter()
        .filter(|(b, _)| b == LAYER)
        .map(|(_, r)| r.end - r.start)
        .sum();
    let windows = requests.iter().filter(|(b, _)| b == WINDOWS).count();
    assert!(windows <= layer.resumes.len(), "{windows} window requests");
    assert!(
        asked * 4 < layer.gz.len() as u64 * 5,
        "asked {asked} bytes of a {} byte layer",
        layer.gz.len()
    );
}

#[tokio::test]
async fn a_spoiled_byte_fails_the_spans_it_feeds_and_keeps_the_ones_before() {
    let layer = Layer::new();
    // Inside the span of the last chunk of a checkpoint that has at least three.
    let last = (2..layer.units.len())
        .find(|&i| {
            let cp = layer.units[i].span.unwrap().checkpoint;
            i >= 2
                && layer.units[i - 2].span.unwrap().checkpoint == cp
                && layer.units.get(i + 1).map(|u| u.span.unwrap().checkpoint) != Some(cp)
        })
        .unwrap();
    let unit = layer.units[last];
    let spoil = (unit.offset + u64::from(unit.stored_size) - 64) as usize;
    let (fetcher, store, wanted) = bed(Some(spoil), 1);
    let dyn_wanted: Arc<dyn Wanted> = wanted.clone();
    match fetcher.unit(&dyn_wanted, wanted.layer.units[last]).await {
        Err(ChunkFailure::Exhausted { last, .. }) => {
            assert!(last.contains("verification"), "{last}")
        }
        other => panic!("a spoiled span read as {other:?}"),
    }
    assert!(!store.contains(&wanted.layer.units[last].key));
    let before = wanted.layer.units[last - 2].key;
    fetcher
        .landed(&[before], std::time::Duration::from_secs(5))
        .await;
    assert!(
        store.contains(&before),
        "a span before the damage was not kept"
    );
}

#[tokio::test]
async fn a_later_span_of_a_checkpoint_asks_only_for_what_an_earlier_run_did_not_fetch() {
    let (fetcher, _store, wanted) = bed(None, 1);
    let layer = wanted.layer.clone();
    let first = (1..layer.units.len())
        .find(|&i| {
            let cp = layer.units[i].span.unwrap().checkpoint;
            cp.is_some() && layer.units.get(i + 1).map(|u| u.span.unwrap().checkpoint) == Some(cp)
        })
        .unwrap();
    let dyn_wanted: Arc<dyn Wanted> = wanted.clone();
    let a = layer.units[first];
    for i in [first, first + 1] {
        let got = fetcher.unit(&dyn_wanted, layer.units[i]).await.unwrap();
        assert!(got.data[..] == *layer.chunk(i), "span {i}");
        // The first run keeps its bytes once its request is done, which may be just
        // after it answered.
        let kept = tokio::time::Instant::now() + std::time::Duration::from_secs(5);
        while fetcher
            .recent_spans()
            .held(LAYER, a.offset, a.offset + 1)
            .is_empty()
        {
            assert!(
                tokio::time::Instant::now() < kept,
                "the first run's bytes were not kept"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
    let asked: Vec<Range<u64>> = wanted
        .origin
        .requests
        .lock()
        .unwrap()
        .iter()
        .filter(|(b, _)| b == LAYER)
        .map(|(_, r)| r.clone())
        .collect();
    let b = layer.units[first + 1];
    assert_eq!(a.offset, b.offset, "one checkpoint");
    assert_eq!(
        asked,
        [
            a.offset..a.offset + u64::from(a.stored_size),
            a.offset + u64::from(a.stored_size)..b.offset + u64::from(b.stored_size)
        ],
        "the second read asks from where the first stopped"
    );
}
