//! Shared helpers for Tessera's benchmarks: a seeded generator of realistic file trees,
//! a median-of-N timer, peak-memory probes and a plain-text table printer.
//!
//! Benchmarks use a custom harness (no criterion) so the build stays lean; every figure
//! they print is a median of several repetitions and comes with a ratio against a
//! baseline measured in the same process, on the same files, a moment before or after.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A small, fast, seeded PRNG (xoshiro256**): trees are the same on every run, and
/// generating hundreds of megabytes takes well under a second.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        // splitmix64 spreads the seed over the state, as the xoshiro authors advise.
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Log-uniform in `[lo, hi]`: as many files of 1–2 KiB as of 1–2 MiB, the shape
    /// of file sizes in real images.
    pub fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let (l, h) = ((lo as f64).ln(), (hi as f64).ln());
        ((l + (h - l) * self.unit()).exp() as u64).clamp(lo, hi)
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        let mut chunks = buf.chunks_exact_mut(8);
        for c in &mut chunks {
            c.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let rest = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        rest.copy_from_slice(&last[..rest.len()]);
    }
}

/// Multiplier of every tree size, from `TESSERA_BENCH_SCALE` (default 1.0, full size).
pub fn scale() -> f64 {
    match std::env::var("TESSERA_BENCH_SCALE") {
        Ok(s) => match s.trim().parse::<f64>() {
            Ok(v) if v > 0.0 && v.is_finite() => v,
            _ => {
                eprintln!("TESSERA_BENCH_SCALE={s:?} is not a positive number; using 1.0");
                1.0
            }
        },
        Err(_) => 1.0,
    }
}

/// Repetitions of each measurement: `TESSERA_BENCH_REPS` if set, else `default`.
pub fn reps(default: usize) -> usize {
    std::env::var("TESSERA_BENCH_REPS")
        .ok()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or(default)
}

/// A seeded generator of text that compresses like real text files: words drawn with
/// a Zipf-like skew from a fixed vocabulary of pseudo-words, as prose or as code.
#[derive(Debug)]
pub struct TextGen {
    words: Vec<Vec<u8>>,
}

impl TextGen {
    pub fn new(rng: &mut Rng) -> Self {
        const SYLLABLES: &[&str] = &[
            "ka", "ro", "te", "mi", "sun", "dar", "el", "po", "qui", "an", "ver", "lo", "gra",
            "fi", "tor", "ne", "sha", "bu", "ist", "con", "de", "ma", "pre", "ux", "li", "on",
            "ta", "be", "ser", "ing", "al", "com", "ment", "ate", "pro", "ex", "tion", "er", "re",
            "in",
        ];
        let words = (0..4096)
            .map(|_| {
                let n = 1 + rng.below(4);
                (0..n)
                    .flat_map(|_| SYLLABLES[rng.below(SYLLABLES.len() as u64) as usize].bytes())
                    .collect()
            })
            .collect();
        TextGen { words }
    }

    /// A word, common ones far more often than rare ones.
    pub fn word(&self, rng: &mut Rng) -> &[u8] {
        let u = rng.unit();
        &self.words[(u * u * u * self.words.len() as f64) as usize]
    }

    /// Appends about `len` bytes of text (prose or code-like lines), then truncates to
    /// exactly `len`.
    pub fn fill(&self, rng: &mut Rng, out: &mut Vec<u8>, len: usize) {
        let code = rng.below(2) == 0;
        let start = out.len();
        while out.len() - start < len {
            if code {
                let indent = 4 * rng.below(3) as usize;
                out.extend(std::iter::repeat_n(b' ', indent));
                match rng.below(4) {
                    0 => {
                        out.extend_from_slice(b"def ");
                        out.extend_from_slice(self.word(rng));
                        out.push(b'_');
                        out.extend_from_slice(self.word(rng));
                        out.extend_from_slice(b"(self, ");
                        out.extend_from_slice(self.word(rng));
                        out.extend_from_slice(b"):\n");
                    }
                    1 => {
                        out.extend_from_slice(self.word(rng));
                        out.extend_from_slice(b" = self.");
                        out.extend_from_slice(self.word(rng));
                        out.push(b'(');
                        out.extend_from_slice(self.word(rng));
                        out.extend_from_slice(format!(", {})\n", rng.below(1000)).as_bytes());
                    }
                    2 => {
                        out.extend_from_slice(b"return ");
                        out.extend_from_slice(self.word(rng));
                        out.extend_from_slice(b".");
                        out.extend_from_slice(self.word(rng));
                        out.extend_from_slice(b"\n");
                    }
                    _ => {
                        out.extend_from_slice(b"# ");
                        self.sentence(rng, out);
                    }
                }
            } else {
                self.sentence(rng, out);
            }
        }
        out.truncate(start + len);
    }

    fn sentence(&self, rng: &mut Rng, out: &mut Vec<u8>) {
        let n = 6 + rng.below(12);
        for i in 0..n {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(self.word(rng));
        }
        out.extend_from_slice(if rng.below(3) == 0 { b".\n" } else { b". " });
    }
}

/// What a generated file holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Content {
    /// Prose or code-like text (compresses ~3–4× with zstd).
    Text,
    /// Machine-code-like: 8-byte words drawn from a small table, zeros or noise
    /// (compresses ~1.5–2×).
    Binary,
    /// Noise, like already-compressed archives or media (does not compress).
    Random,
}

fn binary_like(rng: &mut Rng, table: &[u64], len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        let w = match rng.below(10) {
            0..=4 => table[rng.below(table.len() as u64) as usize],
            5 | 6 => 0,
            _ => rng.next_u64(),
        };
        out.extend_from_slice(&w.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Shares of the mixed tree's bytes that are text, binary-like and random. With the
/// generators here the tree compresses about 2× with zstd, like the mission's reference
/// image (870 MB → 444 MB).
pub const SHARE: [f64; 3] = [0.5, 0.25, 0.25];

/// A generated tree on disk.
#[derive(Debug)]
pub struct MixedTree {
    pub root: PathBuf,
    /// Every regular file, with its size.
    pub files: Vec<(PathBuf, u64)>,
    pub total_bytes: u64,
    /// Bytes of each content kind: text, binary-like, random.
    pub bytes_by_kind: [u64; 3],
    pub dirs: usize,
}

/// Writes a tree of about `files` files and `total` bytes under `root`: ~92% small
/// files (1–32 KiB), ~7.5% medium (32 KiB–1 MiB), and large files (1–20 MiB) filling
/// the rest of the budget. By bytes, [`SHARE`] of it is text, binary-like and random.
pub fn mixed_tree(root: &Path, files: usize, total: u64, seed: u64) -> io::Result<MixedTree> {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    let mut rng = Rng::new(seed);
    let text = TextGen::new(&mut rng);
    let table: Vec<u64> = (0..512).map(|_| rng.next_u64()).collect();
    let small = files * 92 / 100;
    let medium = files * 75 / 1000;
    let mut sizes: Vec<u64> = (0..small).map(|_| rng.log_uniform(KIB, 32 * KIB)).collect();
    sizes.extend((0..medium).map(|_| rng.log_uniform(32 * KIB, MIB)));
    let mut sum: u64 = sizes.iter().sum();
    while sum < total {
        let s = rng.log_uniform(MIB, 20 * MIB).min((total - sum).max(MIB));
        sizes.push(s);
        sum += s;
    }
    // Interleave sizes so directories mix large and small files.
    for i in (1..sizes.len()).rev() {
        let j = rng.below(i as u64 + 1) as usize;
        sizes.swap(i, j);
    }
    let mut tree = MixedTree {
        root: root.to_path_buf(),
        files: Vec::with_capacity(sizes.len()),
        total_bytes: 0,
        bytes_by_kind: [0; 3],
        dirs: 0,
    };
    let mut buf = Vec::new();
    let per_dir = 25;
    for (i, &size) in sizes.iter().enumerate() {
        let dir = root.join(format!("usr{}/lib{}", i / (per_dir * 8), (i / per_dir) % 8));
        if i % per_dir == 0 {
            fs::create_dir_all(&dir)?;
            tree.dirs += 1;
        }
        // Give each file the kind furthest below its share of the bytes so far, so the
        // mix holds at every scale although a few large files carry half the bytes.
        let written = tree.total_bytes + size;
        let deficit = |k: usize| SHARE[k] * written as f64 - tree.bytes_by_kind[k] as f64;
        let k = (0..3)
            .max_by(|&a, &b| deficit(a).total_cmp(&deficit(b)))
            .unwrap_or(0);
        let (kind, ext) = match k {
            0 => (Content::Text, if rng.below(2) == 0 { "py" } else { "txt" }),
            1 => (Content::Binary, "so"),
            _ => (Content::Random, "gz"),
        };
        let len = size as usize;
        buf.clear();
        match kind {
            Content::Text => text.fill(&mut rng, &mut buf, len),
            Content::Binary => buf = binary_like(&mut rng, &table, len),
            Content::Random => {
                buf.resize(len, 0);
                rng.fill(&mut buf);
            }
        }
        let name = format!("{}_{i}.{ext}", String::from_utf8_lossy(text.word(&mut rng)));
        let path = dir.join(name);
        fs::write(&path, &buf)?;
        tree.bytes_by_kind[kind as usize] += size;
        tree.total_bytes += size;
        tree.files.push((path, size));
    }
    Ok(tree)
}

/// A generated tree of many small files.
#[derive(Debug)]
pub struct SmallFilesTree {
    pub root: PathBuf,
    /// Paths relative to the root, as the image stores them.
    pub paths: Vec<Vec<u8>>,
    pub total_bytes: u64,
    pub dirs: usize,
}

/// Writes `files` text files of 0–2 KiB spread over about `dirs` leaf directories
/// (`pkgNN/modNN/`), a shape like a Python `site-packages`.
pub fn small_files_tree(
    root: &Path,
    files: usize,
    dirs: usize,
    seed: u64,
) -> io::Result<SmallFilesTree> {
    let mut rng = Rng::new(seed);
    let text = TextGen::new(&mut rng);
    let dirs = dirs.max(1);
    let top = (dirs as f64).sqrt().ceil() as usize;
    let mut tree = SmallFilesTree {
        root: root.to_path_buf(),
        paths: Vec::with_capacity(files),
        total_bytes: 0,
        dirs: 0,
    };
    let mut buf = Vec::with_capacity(4096);
    for d in 0..dirs {
        let rel = format!("pkg{:02}/mod{:02}", d / top, d % top);
        let dir = root.join(&rel);
        fs::create_dir_all(&dir)?;
        tree.dirs += 1;
        let (lo, hi) = (d * files / dirs, (d + 1) * files / dirs);
        for i in lo..hi {
            let name = format!(
                "{}_{}_{i}.py",
                String::from_utf8_lossy(text.word(&mut rng)),
                String::from_utf8_lossy(text.word(&mut rng))
            );
            let len = rng.below(2049) as usize;
            buf.clear();
            text.fill(&mut rng, &mut buf, len);
            fs::write(dir.join(&name), &buf)?;
            tree.total_bytes += len as u64;
            tree.paths.push(format!("{rel}/{name}").into_bytes());
        }
    }
    tree.dirs += top.min(dirs);
    Ok(tree)
}

/// Median, minimum and maximum of repeated timings.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    pub median: Duration,
    pub min: Duration,
    pub max: Duration,
    pub reps: usize,
}

impl Timing {
    pub fn from_samples(mut samples: Vec<Duration>) -> Self {
        assert!(!samples.is_empty(), "a timing needs at least one sample");
        samples.sort();
        let n = samples.len();
        let median = if n % 2 == 1 {
            samples[n / 2]
        } else {
            (samples[n / 2 - 1] + samples[n / 2]) / 2
        };
        Timing {
            median,
            min: samples[0],
            max: samples[n - 1],
            reps: n,
        }
    }

    pub fn secs(&self) -> f64 {
        self.median.as_secs_f64()
    }

    /// "median (min–max, n=N)" for the table.
    pub fn spread(&self) -> String {
        format!(
            "{}–{}, n={}",
            fmt_duration(self.min),
            fmt_duration(self.max),
            self.reps
        )
    }
}

/// Runs `setup` then times `f` on its output, `reps` times; setup and the drop of what
/// `f` returns are outside the timed region.
pub fn measure_with<S, T>(
    reps: usize,
    mut setup: impl FnMut() -> S,
    mut f: impl FnMut(S) -> T,
) -> Timing {
    let samples = (0..reps)
        .map(|_| {
            let input = setup();
            let t = Instant::now();
            let out = std::hint::black_box(f(input));
            let elapsed = t.elapsed();
            drop(out);
            elapsed
        })
        .collect();
    Timing::from_samples(samples)
}

/// Times `f`, `reps` times.
pub fn measure<T>(reps: usize, mut f: impl FnMut() -> T) -> Timing {
    measure_with(reps, || (), |()| f())
}

/// `VmHWM` (peak resident set) of this process in bytes, if the kernel reports it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line["VmHWM:".len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// One line describing the machine: cores, memory, kernel, CPU, load.
pub fn machine_summary() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem = fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .next()
                .map(|l| l.split_whitespace().nth(1).unwrap_or("0").to_string())
        })
        .and_then(|kib| kib.parse::<u64>().ok())
        .map_or("?".into(), |kib| {
            format!("{:.1} GiB", kib as f64 / (1 << 20) as f64)
        });
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cpu = fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|s| s.trim().to_string())
        })
        .unwrap_or_default();
    format!(
        "{cores} cores ({cpu}), {mem} RAM, kernel {}, load average {}",
        kernel.trim(),
        load_average()
    )
}

/// The 1/5/15-minute load averages, to show whether other work shared the machine.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// "1.23 s", "45.6 ms", "789 ns".
pub fn fmt_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s >= 1.0 {
        format!("{s:.2} s")
    } else if s >= 1e-3 {
        format!("{:.2} ms", s * 1e3)
    } else if s >= 1e-6 {
        format!("{:.2} µs", s * 1e6)
    } else {
        format!("{:.0} ns", s * 1e9)
    }
}

/// "12.3 MiB" style sizes.
pub fn fmt_bytes(b: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// A plain-text table, columns padded to their widest cell; first column left-aligned,
/// the others right-aligned.
#[derive(Debug)]
pub struct Table {
    title: String,
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    notes: Vec<String>,
}

impl Table {
    pub fn new(title: &str, header: &[&str]) -> Self {
        Table {
            title: title.into(),
            header: header.iter().map(|s| s.to_string()).collect(),
            rows: Vec::new(),
            notes: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn note(&mut self, note: impl Into<String>) {
        self.notes.push(note.into());
    }

    pub fn print(&self) {
        let cols = self.header.len();
        let mut width = vec![0usize; cols];
        for r in std::iter::once(&self.header).chain(&self.rows) {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        println!("\n== {} ==", self.title);
        let line = |r: &[String]| {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let pad = width[i].saturating_sub(c.chars().count());
                    if i == 0 {
                        format!("{c}{}", " ".repeat(pad))
                    } else {
                        format!("{}{c}", " ".repeat(pad))
                    }
                })
                .collect();
            println!("| {} |", cells.join(" | "));
        };
        line(&self.header);
        // Markdown alignment row: the first column left, the others right (`---:`).
        let rule: Vec<String> = width
            .iter()
            .enumerate()
            .map(|(i, w)| {
                if i == 0 {
                    "-".repeat(w + 2)
                } else {
                    format!("{}:", "-".repeat(w + 1))
                }
            })
            .collect();
        println!("|{}|", rule.join("|"));
        for r in &self.rows {
            line(r);
        }
        for n in &self.notes {
            println!("  {n}");
        }
    }
}

/// A ratio printed as "2.35×".
pub fn ratio(x: f64) -> String {
    if x >= 100.0 {
        format!("{x:.0}×")
    } else if x >= 0.1 {
        format!("{x:.2}×")
    } else {
        format!("{x:.4}×")
    }
}
