use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Barrier};

use std::os::unix::fs::FileExt;

use super::*;

const SIZE: usize = 4096;

/// A chunk of `len` pseudo-random bytes drawn from `seed`, and its key.
fn chunk(seed: u64, len: usize, algo: DigestAlgo) -> (ChunkKey, Vec<u8>) {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect();
    let key = ChunkKey {
        algo,
        digest: algo.digest(&data),
    };
    (key, data)
}

fn chunks(n: u64) -> Vec<(ChunkKey, Vec<u8>)> {
    (0..n).map(|i| chunk(i, SIZE, DigestAlgo::Sha256)).collect()
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for (path, is_dir) in list(dir).unwrap() {
        if is_dir {
            out.extend(files_under(&path));
        } else {
            out.push(path);
        }
    }
    out
}

/// Index, counters and files agree: the memory index and sled hold the same chunks,
/// each with one place in the use order and a file of its size; the counters match;
/// no other file exists.
fn assert_consistent(cache: &ChunkCache) {
    cache.write_uses().unwrap();
    let mut bytes = 0;
    let (mut pinned, mut pinned_bytes) = (0, 0);
    let mut paths = Vec::new();
    let memory = cache.memory();
    for record in cache.index.scan_prefix([ENTRY_PREFIX]) {
        let (k, v) = record.unwrap();
        let key = layout::decode_entry_key(&k).unwrap();
        let entry = Entry::decode(&v).unwrap();
        let slot = memory.slots[&key];
        assert_eq!((slot.size, slot.seq), (entry.size, entry.seq), "{key}");
        if memory.pins.contains(&key) {
            assert_eq!(
                memory.order.get(&slot.seq),
                None,
                "pinned {key} is in the order"
            );
            pinned_bytes += slot.size;
            pinned += 1;
        } else {
            assert_eq!(memory.order.get(&slot.seq), Some(&key));
        }
        let path = chunk_path(&cache.data_dir, &key);
        assert_eq!(fs::metadata(&path).unwrap().len(), entry.size);
        bytes += entry.size;
        paths.push(path);
    }
    assert_eq!(memory.slots.len(), paths.len());
    assert_eq!(memory.order.len(), paths.len() - pinned);
    assert_eq!(memory.pins.bytes, pinned_bytes);
    let untrusted = memory.slots.values().filter(|s| !s.trusted).count() as u64;
    assert_eq!(memory.untrusted, untrusted);
    drop(memory);
    let stats = cache.stats();
    assert_eq!((stats.entries, stats.bytes), (paths.len() as u64, bytes));
    let mut files = files_under(&cache.data_dir);
    files.sort();
    paths.sort();
    assert_eq!(files, paths, "files on disk are exactly the indexed ones");
}

#[test]
fn put_then_get_round_trips_for_both_digests() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    let (a, a_data) = chunk(1, SIZE, DigestAlgo::Sha256);
    let (b, b_data) = chunk(2, 3 * SIZE + 5, DigestAlgo::Blake3);
    assert_eq!(cache.get(&a).unwrap(), None);
    assert!(!cache.contains(&a));
    cache.put(&a, &a_data).unwrap();
    cache.put(&b, &b_data).unwrap();
    assert!(cache.contains(&a));
    assert_eq!(cache.get(&a).unwrap(), Some(a_data));
    assert_eq!(cache.get(&b).unwrap(), Some(b_data));
    // Same digest bytes under the other algorithm are another chunk.
    let other = ChunkKey {
        algo: DigestAlgo::Blake3,
        digest: a.digest,
    };
    assert_eq!(cache.get(&other).unwrap(), None);
    let stats = cache.stats();
    assert_eq!((stats.hits, stats.misses, stats.entries), (2, 2, 2));
    assert_consistent(&cache);
}

#[test]
fn identical_chunk_is_stored_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    let (key, data) = chunk(7, SIZE, DigestAlgo::Sha256);
    cache.put(&key, &data).unwrap();
    cache.put(&key, &data).unwrap();
    assert_eq!(cache.stats().entries, 1);
    assert_eq!(cache.stats().bytes, SIZE as u64);
    assert_consistent(&cache);
}

#[test]
fn a_read_of_part_of_a_chunk_reads_only_those_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    let (key, data) = chunk(3, 4 * SIZE, DigestAlgo::Sha256);
    cache.put(&key, &data).unwrap();
    // The rest of the file is damaged (same size): a trusted chunk is not re-hashed,
    // so a read of the good part is answered from the file alone.
    let path = chunk_path(&cache.data_dir, &key);
    let mut damaged = data.clone();
    damaged[3 * SIZE..].fill(0);
    fs::write(&path, &damaged).unwrap();
    let part = SIZE as u64..2 * SIZE as u64 + 7;
    assert_eq!(
        cache.read(&key, part.clone()).unwrap().as_deref(),
        Some(&data[SIZE..2 * SIZE + 7])
    );
    assert!(
        cache.read(&key, 0..5 * SIZE as u64).is_err(),
        "past the chunk's end"
    );
    // A file cut short is caught by the read that reaches past its end.
    fs::write(&path, &data[..2 * SIZE]).unwrap();
    assert_eq!(
        cache.read(&key, 0..SIZE as u64).unwrap().as_deref(),
        Some(&data[..SIZE])
    );
    assert_eq!(cache.read(&key, 0..3 * SIZE as u64).unwrap(), None);
    assert!(!cache.contains(&key));
    assert_eq!(cache.stats().verification_failures, 1);
    assert_consistent(&cache);
}

#[test]
fn verify_drops_a_corrupted_file_instead_of_keeping_it() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    let all = chunks(2);
    for (key, data) in &all {
        cache.put(key, data).unwrap();
    }
    let (key, data) = &all[0];
    let mut bad = data.clone();
    bad[100] ^= 1;
    fs::write(chunk_path(&cache.data_dir, key), &bad).unwrap();

    assert_eq!(cache.verify(key).unwrap(), Verified::Dropped);
    assert_eq!(
        cache.verify(&all[1].0).unwrap(),
        Verified::Good(SIZE as u64)
    );
    assert_eq!(cache.verify(key).unwrap(), Verified::Absent);
    assert!(!cache.contains(key));
    assert_eq!(cache.get(key).unwrap(), None);
    let stats = cache.stats();
    assert_eq!(
        (stats.verification_failures, stats.verified_bytes),
        (1, SIZE as u64)
    );
    assert_eq!((stats.entries, stats.bytes), (1, SIZE as u64));
    assert_consistent(&cache);
    // And it can be cached again.
    cache.put(key, data).unwrap();
    assert_eq!(cache.get(key).unwrap().as_ref(), Some(data));
}

#[test]
fn chunks_written_after_the_last_checkpoint_are_verified_before_they_are_served() {
    let dir = tempfile::tempdir().unwrap();
    let all = chunks(4);
    // Well before the checkpoint, however slow the test runs.
    let earlier = SystemTime::now() - 2 * CHECKPOINT_SLACK;
    {
        let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
        cache.put(&all[0].0, &all[0].1).unwrap();
        cache.put(&all[1].0, &all[1].1).unwrap();
        // Back-date the two files past the checkpoint's slack, as if written earlier.
        for (key, _) in &all[..2] {
            let file = fs::File::options()
                .write(true)
                .open(chunk_path(&cache.data_dir, key))
                .unwrap();
            file.set_modified(earlier).unwrap();
        }
        cache.checkpoint().unwrap();
        // Then a crash: these two never reach a checkpoint.
        cache.put(&all[2].0, &all[2].1).unwrap();
        cache.put(&all[3].0, &all[3].1).unwrap();
    }
    let data_dir = dir.path().join("data");
    // A power cut tore one of them, and (as disks do) one of the checkpointed ones.
    for i in [0, 2] {
        let mut torn = all[i].1.clone();
        torn[SIZE / 2..].fill(0);
        let path = chunk_path(&data_dir, &all[i].0);
        let file = fs::File::options().write(true).open(&path).unwrap();
        file.write_all_at(&torn, 0).unwrap();
        if i == 0 {
            file.set_modified(earlier).unwrap();
        }
    }
    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    let trust: Vec<_> = all
        .iter()
        .map(|(key, _)| {
            let modified = fs::metadata(chunk_path(&data_dir, key))
                .unwrap()
                .modified()
                .unwrap();
            (cache.slot(key).map(|s| s.trusted), modified)
        })
        .collect();
    assert_eq!(
        cache.stats().unverified,
        2,
        "trusted before {:?}; (trusted, modified) by chunk: {trust:?}",
        last_checkpoint(dir.path())
    );
    // The torn unverified chunk is caught by its first read, even a partial one.
    assert_eq!(cache.read(&all[2].0, 0..16).unwrap(), None);
    assert_eq!(
        cache.read(&all[3].0, 0..16).unwrap().as_deref(),
        Some(&all[3].1[..16])
    );
    assert_eq!(cache.stats().unverified, 0);
    // The checkpointed one is trusted: only a scrub finds it.
    assert_eq!(
        cache.read(&all[0].0, 0..16).unwrap().as_deref(),
        Some(&all[0].1[..16])
    );
    assert_eq!(cache.verify(&all[0].0).unwrap(), Verified::Dropped);
    assert_eq!(cache.stats().verification_failures, 2);
    assert_consistent(&cache);
}

#[test]
fn the_drop_hook_is_told_what_left_and_why() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 2 * SIZE as u64).unwrap();
    type Told = Vec<(Vec<ChunkKey>, DropCause)>;
    let told: Arc<Mutex<Told>> = Arc::default();
    let sink = told.clone();
    assert!(cache.on_drop(Box::new(move |keys, cause| {
        sink.lock().unwrap().push((keys.to_vec(), cause));
    })));
    assert!(
        !cache.on_drop(Box::new(|_, _| {})),
        "a second hook was taken"
    );
    let all = chunks(4);
    for (key, data) in &all[..2] {
        cache.put(key, data).unwrap();
    }
    let mut bad = all[0].1.clone();
    bad[7] ^= 1;
    fs::write(chunk_path(&cache.data_dir, &all[0].0), &bad).unwrap();
    assert_eq!(cache.verify(&all[0].0).unwrap(), Verified::Dropped);
    cache.put(&all[2].0, &all[2].1).unwrap();
    cache.put(&all[3].0, &all[3].1).unwrap();
    assert!(cache.remove(&all[3].0).unwrap());
    assert!(!cache.remove(&all[3].0).unwrap());
    let told = told.lock().unwrap().clone();
    assert_eq!(
        told,
        [
            (vec![all[0].0], DropCause::Corrupt),
            (vec![all[1].0], DropCause::Evicted),
            (vec![all[3].0], DropCause::Removed),
        ]
    );
}

#[test]
fn entries_and_lru_order_survive_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let all = chunks(4);
    {
        let cache = ChunkCache::open(dir.path(), 3 * SIZE as u64).unwrap();
        for (key, data) in &all[..3] {
            cache.put(key, data).unwrap();
        }
        cache.get(&all[0].0).unwrap().unwrap();
    }
    let cache = ChunkCache::open(dir.path(), 3 * SIZE as u64).unwrap();
    assert_eq!(cache.stats().entries, 3);
    assert_eq!(cache.stats().bytes, 3 * SIZE as u64);
    assert_eq!(cache.get(&all[2].0).unwrap().as_ref(), Some(&all[2].1));
    // Use order now 1, 0, 2: chunk 1 goes first.
    cache.put(&all[3].0, &all[3].1).unwrap();
    assert!(!cache.contains(&all[1].0));
    assert!([0, 2, 3].iter().all(|&i| cache.contains(&all[i].0)));
    assert_consistent(&cache);
}

#[test]
fn open_cleans_what_a_crash_left_and_serves_only_whole_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let all = chunks(5);
    let data_dir = dir.path().join("data");
    {
        let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
        for (key, data) in &all[..4] {
            cache.put(key, data).unwrap();
        }
    }
    let path = |i: usize| chunk_path(&data_dir, &all[i].0);
    // An index entry without its file.
    fs::remove_file(path(0)).unwrap();
    // A file cut short.
    fs::write(path(1), &all[1].1[..SIZE / 2]).unwrap();
    // A temp file from an interrupted put.
    let tmp = shard_dir(&data_dir, &all[2].0).join(format!("{TMP_PREFIX}x1y2z3"));
    fs::write(&tmp, b"partial").unwrap();
    // A complete file renamed into place but never indexed.
    fs::create_dir_all(shard_dir(&data_dir, &all[4].0)).unwrap();
    fs::write(path(4), &all[4].1).unwrap();

    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    assert_consistent(&cache);
    assert!(!tmp.exists() && !path(1).exists());
    // The whole file nothing indexed is indexed again.
    assert_eq!(cache.stats().entries, 3);
    assert_eq!(cache.stats().bytes, 3 * SIZE as u64);
    for i in [0, 1] {
        assert!(!cache.contains(&all[i].0));
        assert_eq!(cache.get(&all[i].0).unwrap(), None);
    }
    for i in [2, 3, 4] {
        assert_eq!(cache.get(&all[i].0).unwrap().as_ref(), Some(&all[i].1));
    }
}

#[test]
fn eviction_keeps_capacity_and_spares_the_recently_used() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 4 * SIZE as u64).unwrap();
    let all = chunks(8);
    for (key, data) in &all[..4] {
        cache.put(key, data).unwrap();
    }
    cache.get(&all[0].0).unwrap().unwrap();
    for (key, data) in &all[4..6] {
        cache.put(key, data).unwrap();
        assert!(cache.stats().bytes <= cache.stats().capacity);
    }
    // Use order was 1, 2, 3, 0: chunks 1 and 2 went.
    let kept: Vec<bool> = all[..6].iter().map(|(k, _)| cache.contains(k)).collect();
    assert_eq!(kept, [true, false, false, true, true, true]);
    assert_eq!(cache.stats().evictions, 2);
    // A chunk larger than the whole cache is not stored (and evicts nothing).
    let (big, big_data) = chunk(99, 5 * SIZE, DigestAlgo::Sha256);
    cache.put(&big, &big_data).unwrap();
    assert!(!cache.contains(&big));
    assert_eq!(cache.stats().entries, 4);
    assert_consistent(&cache);
}

#[test]
fn pinned_chunks_are_not_evicted() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 2 * SIZE as u64).unwrap();
    let all = chunks(4);
    cache.put(&all[0].0, &all[0].1).unwrap();
    cache.put(&all[1].0, &all[1].1).unwrap();
    {
        let _pin = cache.pin(&all[0].0);
        let _again = cache.pin(&all[0].0);
        cache.put(&all[2].0, &all[2].1).unwrap();
        assert!(
            cache.contains(&all[0].0),
            "pinned, although least recently used"
        );
        assert!(!cache.contains(&all[1].0));
    }
    // Unpinned, it is the oldest again.
    cache.put(&all[3].0, &all[3].1).unwrap();
    assert!(!cache.contains(&all[0].0));
    assert!(cache.stripes.iter().all(|s| s.lock().unwrap().is_empty()));
    assert_consistent(&cache);
}

#[test]
fn full_disk_evicts_and_retries_then_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    let all = chunks(6);
    for (key, data) in &all[..4] {
        cache.put(key, data).unwrap();
    }
    cache.full_writes.store(1, Relaxed);
    cache.put(&all[4].0, &all[4].1).unwrap();
    assert!(cache.contains(&all[4].0));
    // The first retry frees twice the chunk's size: the two oldest.
    assert!(!cache.contains(&all[0].0) && !cache.contains(&all[1].0));
    assert_eq!(cache.stats().evictions, 2);

    cache.full_writes.store(FULL_RETRIES + 1, Relaxed);
    let err = cache.put(&all[5].0, &all[5].1).unwrap_err();
    assert!(matches!(err, Error::CacheDiskFull { .. }), "{err}");
    assert!(!cache.contains(&all[5].0));
    assert!(cache.stats().degraded);
    assert_consistent(&cache);
}

#[test]
fn a_full_disk_with_nothing_to_evict_degrades_until_a_put_fits() {
    let dir = tempfile::tempdir().unwrap();
    let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
    let all = chunks(2);
    cache.full_writes.store(1, Relaxed);
    let err = cache.put(&all[0].0, &all[0].1).unwrap_err();
    assert!(matches!(err, Error::CacheDiskFull { .. }), "{err}");
    // Nothing to evict, so no second try: the next write is the next put's.
    assert_eq!(cache.full_writes.load(Relaxed), 0);
    assert!(cache.stats().degraded);
    cache.put(&all[1].0, &all[1].1).unwrap();
    assert!(!cache.stats().degraded);
    assert_consistent(&cache);
}

#[test]
fn a_lost_or_damaged_index_is_rebuilt_from_the_chunk_files() {
    let dir = tempfile::tempdir().unwrap();
    let all = chunks(4);
    let reopen_and_check = |what: &str| {
        let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
        assert_eq!(cache.stats().entries, 4, "{what}");
        for (key, data) in &all {
            assert_eq!(cache.get(key).unwrap().as_ref(), Some(data), "{what}");
        }
        assert_consistent(&cache);
    };
    {
        let cache = ChunkCache::open(dir.path(), 1 << 20).unwrap();
        for (key, data) in &all {
            cache.put(key, data).unwrap();
        }
    }
    fs::remove_dir_all(dir.path().join("index")).unwrap();
    reopen_and_check("index removed");
    for file in files_under(&dir.path().join("index")) {
        fs::write(&file, b"not a sled file").unwrap();
    }
    reopen_and_check("index overwritten");
    // Another layout version's index is rebuilt too, not a reason to stop.
    {
        let index = sled::open(dir.path().join("index")).unwrap();
        index.insert(layout::VERSION_KEY, &[0xff; 4]).unwrap();
        index.flush().unwrap();
    }
    reopen_and_check("another layout version");
}

#[test]
fn concurrent_puts_of_one_chunk_store_it_once() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(dir.path(), 1 << 20).unwrap());
    let (key, data) = chunk(5, SIZE, DigestAlgo::Blake3);
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (cache, start, data) = (cache.clone(), start.clone(), data.clone());
            std::thread::spawn(move || {
                start.wait();
                cache.put(&key, &data).unwrap();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(cache.stats().entries, 1);
    assert_eq!(cache.get(&key).unwrap(), Some(data));
    assert_consistent(&cache);
}

#[test]
fn concurrent_gets_puts_and_pins_keep_the_cache_consistent() {
    let dir = tempfile::tempdir().unwrap();
    // Room for half the chunks, so eviction runs alongside everything else.
    let cache = Arc::new(ChunkCache::open(dir.path(), 32 * SIZE as u64).unwrap());
    let all = Arc::new(chunks(64));
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            let (cache, all) = (cache.clone(), all.clone());
            std::thread::spawn(move || {
                for n in 0..300u64 {
                    let (key, data) = &all[((t * 7 + n * 13) % 64) as usize];
                    let _pin = (n % 5 == 0).then(|| cache.pin(key));
                    match cache.get(key).unwrap() {
                        Some(got) => assert_eq!(&got, data),
                        None => cache.put(key, data).unwrap(),
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let stats = cache.stats();
    assert!(stats.bytes <= stats.capacity, "{stats:?}");
    assert_eq!(stats.hits + stats.misses, 8 * 300);
    assert!(stats.hits > 0 && stats.evictions > 0, "{stats:?}");
    assert_eq!(stats.verification_failures, 0);
    assert_consistent(&cache);
}

#[test]
fn backing_files_are_copies_within_a_quarter_of_the_capacity() {
    let dir = tempfile::tempdir().unwrap();
    // Room for 16 chunks; backing files may take 4 chunks' worth.
    let cache = ChunkCache::open(dir.path(), 16 * SIZE as u64).unwrap();
    let all = chunks(8);
    for (key, data) in &all {
        cache.put(key, data).unwrap();
    }
    let two = |a: usize, b: usize| FileLayout {
        size: 2 * SIZE as u64 + 100,
        pieces: vec![
            (0, SIZE as u32, Some(all[a].0)),
            (SIZE as u64, 100, None),
            (SIZE as u64 + 100, SIZE as u32, Some(all[b].0)),
        ],
    };
    // A one-chunk file is its chunk's file: nothing to make.
    let one = FileLayout {
        size: SIZE as u64,
        pieces: vec![(0, SIZE as u32, Some(all[7].0))],
    };
    assert!(!cache.wants_backing_file(&one));
    let mut got = Vec::new();
    cache
        .backing_file(&one)
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    assert_eq!(got, all[7].1);

    assert!(cache.backing_file(&two(0, 1)).is_none());
    assert!(cache.make_backing_file(&two(0, 1)).unwrap());
    assert!(!cache.make_backing_file(&two(0, 1)).unwrap(), "made once");
    let mut got = Vec::new();
    cache
        .backing_file(&two(0, 1))
        .unwrap()
        .read_to_end(&mut got)
        .unwrap();
    let mut expected = all[0].1.clone();
    expected.resize(SIZE + 100, 0);
    expected.extend_from_slice(&all[1].1);
    assert_eq!(got, expected);
    // A second one exceeds the quarter: the least recently opened goes.
    assert!(cache.make_backing_file(&two(2, 3)).unwrap());
    assert!(cache.backing_file(&two(0, 1)).is_none());
    assert!(cache.backing_file(&two(2, 3)).is_some());
    assert_eq!(cache.stats().backing_bytes, 2 * SIZE as u64 + 100);
    // A file with a chunk not cached gets none.
    let (absent, _) = chunk(99, SIZE, DigestAlgo::Sha256);
    let missing = FileLayout {
        size: 2 * SIZE as u64,
        pieces: vec![
            (0, SIZE as u32, Some(all[4].0)),
            (SIZE as u64, SIZE as u32, Some(absent)),
        ],
    };
    assert!(!cache.wants_backing_file(&missing));
    assert!(!cache.make_backing_file(&missing).unwrap());
    // A crash before any checkpoint: the backing file may be torn, so it is removed
    // at the next open (and made again when next needed).
    drop(cache);
    let cache = ChunkCache::open(dir.path(), 16 * SIZE as u64).unwrap();
    assert_eq!(cache.stats().backing_bytes, 0);
    assert!(cache.backing_file(&two(2, 3)).is_none());
    assert!(files_under(&dir.path().join("files")).is_empty());
}

#[test]
fn chunks_of_mounted_images_survive_eviction_until_unpinned() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(dir.path(), 4 * SIZE as u64).unwrap());
    let all = chunks(10);
    // The "image" is chunks 0..3; chunk 2 is not cached yet when it is mounted.
    for (key, data) in &all[..2] {
        cache.put(key, data).unwrap();
    }
    let image: Vec<ChunkKey> = all[..3].iter().map(|(k, _)| *k).collect();
    let pin = cache.pin_image("image".into(), image.clone());
    cache.put(&all[2].0, &all[2].1).unwrap();
    assert_eq!(cache.pinned_bytes(), 3 * SIZE as u64);
    // Pressure: seven more chunks through a four-chunk cache.
    for (key, data) in &all[3..] {
        cache.put(key, data).unwrap();
        assert_consistent(&cache);
    }
    assert!(
        image.iter().all(|k| cache.contains(k)),
        "pinned chunks stay"
    );
    assert_eq!(
        cache.stats().bytes,
        4 * SIZE as u64,
        "one unpinned slot left"
    );
    assert!(cache.contains(&all[9].0));
    assert_eq!(cache.cached_bytes(&image), 3 * SIZE as u64);
    let sets = cache.pinned_sets();
    assert_eq!(sets.len(), 1);
    assert_eq!((sets[0].chunks, sets[0].cached_bytes), (3, 3 * SIZE as u64));
    drop(pin);
    assert_eq!(cache.pinned_bytes(), 0);
    assert!(cache.pinned_sets().is_empty());
    assert_consistent(&cache);
    // Released, they are the least recently used again: the next puts evict them.
    for (key, data) in &all[3..6] {
        cache.put(key, data).unwrap();
    }
    assert!(image.iter().all(|k| !cache.contains(k)));
    assert_consistent(&cache);
}

#[test]
fn two_mounts_of_one_image_pin_it_until_both_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(dir.path(), 2 * SIZE as u64).unwrap());
    let all = chunks(6);
    let image = vec![all[0].0, all[1].0, all[0].0];
    let first = cache.pin_image("a".into(), image.clone());
    let second = cache.pin_image("b".into(), image.clone());
    assert_eq!(
        first.keys().len(),
        2,
        "a key named twice is pinned once per set"
    );
    for (key, data) in &all[..2] {
        cache.put(key, data).unwrap();
    }
    assert_eq!(
        cache.pinned_bytes(),
        2 * SIZE as u64,
        "each chunk counted once"
    );
    drop(first);
    for (key, data) in &all[2..4] {
        cache.put(key, data).unwrap();
    }
    assert!(cache.contains(&all[0].0) && cache.contains(&all[1].0));
    assert!(
        !cache.contains(&all[2].0),
        "nothing unpinned left: stored, then evicted"
    );
    assert_consistent(&cache);
    drop(second);
    for (key, data) in &all[4..6] {
        cache.put(key, data).unwrap();
    }
    assert!(!cache.contains(&all[0].0) && !cache.contains(&all[1].0));
    assert_consistent(&cache);
}

#[test]
fn pinned_chunks_past_the_capacity_are_still_stored_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(dir.path(), 2 * SIZE as u64).unwrap());
    let all = chunks(4);
    let pin = cache.pin_image("big".into(), all.iter().map(|(k, _)| *k).collect());
    for (key, data) in &all {
        cache.put(key, data).unwrap();
    }
    assert!(all.iter().all(|(k, _)| cache.contains(k)));
    let stats = cache.stats();
    assert_eq!(stats.pinned_bytes, 4 * SIZE as u64);
    assert!(stats.pinned_over_capacity);
    // Nothing unpinned: a prune frees nothing.
    assert_eq!(cache.prune(0).unwrap(), (0, 0));
    assert_consistent(&cache);
    // Unpinned, the cache is brought back within its capacity at once.
    drop(pin);
    let stats = cache.stats();
    assert_eq!((stats.bytes, stats.evictions), (2 * SIZE as u64, 2));
    assert!(!stats.pinned_over_capacity);
    assert_consistent(&cache);
}

#[test]
fn prune_evicts_unpinned_chunks_down_to_what_it_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(dir.path(), 16 * SIZE as u64).unwrap());
    let all = chunks(6);
    for (key, data) in &all {
        cache.put(key, data).unwrap();
    }
    let _pin = cache.pin_image("one".into(), vec![all[0].0]);
    assert_eq!(cache.prune(4 * SIZE as u64).unwrap(), (2, 2 * SIZE as u64));
    assert!(cache.contains(&all[0].0) && !cache.contains(&all[1].0) && cache.contains(&all[3].0));
    assert_eq!(cache.prune(0).unwrap(), (3, 3 * SIZE as u64));
    assert_eq!(cache.keys(), vec![all[0].0]);
    assert_consistent(&cache);
}

/// A filesystem whose usage the test sets, plus what the cache holds (as a real one
/// would count it).
struct FakeDisk {
    other: Arc<AtomicU64>,
    cache: Arc<AtomicU64>,
    size: u64,
}

impl DiskSpace for FakeDisk {
    fn usage(&self) -> io::Result<DiskUsage> {
        Ok(DiskUsage {
            used: self.other.load(Relaxed) + self.cache.load(Relaxed),
            size: self.size,
        })
    }
}

#[test]
fn above_the_high_watermark_unpinned_chunks_go_until_below_the_low_one() {
    let dir = tempfile::tempdir().unwrap();
    let other = Arc::new(AtomicU64::new(0));
    let held = Arc::new(AtomicU64::new(0));
    let disk = FakeDisk {
        other: other.clone(),
        cache: held.clone(),
        size: 100 * SIZE as u64,
    };
    let marks = Watermarks {
        high_percent: 90,
        low_percent: 80,
    };
    let cache = Arc::new(
        ChunkCache::open(dir.path(), 1 << 30)
            .unwrap()
            .with_watermarks(marks, Some(Box::new(disk))),
    );
    let all = chunks(20);
    for (key, data) in &all {
        cache.put(key, data).unwrap();
    }
    held.store(cache.stats().bytes, Relaxed);
    let _pin = cache.pin_image("mounted".into(), vec![all[0].0, all[1].0]);
    // Below high: nothing happens.
    other.store(60 * SIZE as u64, Relaxed);
    cache.keep_watermarks().unwrap();
    assert_eq!(cache.stats().entries, 20);
    // Another tenant fills the disk to 95%: 15 chunks must go to reach 80%, the
    // least recently used unpinned ones (2..17).
    other.store(75 * SIZE as u64, Relaxed);
    let usage = cache.keep_watermarks().unwrap().unwrap();
    assert_eq!(usage.percent(), 95.0);
    assert_eq!(cache.stats().entries, 5);
    let kept: Vec<ChunkKey> = [0, 1, 17, 18, 19].iter().map(|&i| all[i].0).collect();
    assert!(kept.iter().all(|k| cache.contains(k)));
    held.store(cache.stats().bytes, Relaxed);
    // Past what can be freed: every unpinned chunk goes, the pinned ones stay.
    other.store(98 * SIZE as u64, Relaxed);
    cache.keep_watermarks().unwrap();
    assert_eq!(cache.keys(), vec![all[0].0, all[1].0]);
    assert_consistent(&cache);
}

#[test]
fn puts_check_the_watermarks_without_a_syscall_per_chunk() {
    struct Counting(Arc<AtomicU64>);
    impl DiskSpace for Counting {
        fn usage(&self) -> io::Result<DiskUsage> {
            self.0.fetch_add(1, Relaxed);
            Ok(DiskUsage { used: 1, size: 100 })
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let asked = Arc::new(AtomicU64::new(0));
    let marks = Watermarks {
        high_percent: 90,
        low_percent: 80,
    };
    let cache = ChunkCache::open(dir.path(), 1 << 30)
        .unwrap()
        .with_watermarks(marks, Some(Box::new(Counting(asked.clone()))));
    let started = Instant::now();
    for (key, data) in chunks(200) {
        cache.put(&key, &data).unwrap();
    }
    // 800 KiB: never due by bytes, so at most once a second.
    let most = started.elapsed().as_secs() + 1;
    assert!(
        asked.load(Relaxed) <= most,
        "asked {} times",
        asked.load(Relaxed)
    );
}

#[test]
fn a_mount_left_for_the_next_agent_releases_its_pin_without_evicting() {
    let dir = tempfile::tempdir().unwrap();
    let cache = Arc::new(ChunkCache::open(dir.path(), 2 * SIZE as u64).unwrap());
    let all = chunks(3);
    let pin = cache.pin_image("kept".into(), all.iter().map(|(k, _)| *k).collect());
    for (key, data) in &all {
        cache.put(key, data).unwrap();
    }
    pin.release_without_evicting();
    let stats = cache.stats();
    assert_eq!((stats.bytes, stats.pinned_bytes), (3 * SIZE as u64, 0));
    assert!(all.iter().all(|(k, _)| cache.contains(k)));
    assert_consistent(&cache);
}
