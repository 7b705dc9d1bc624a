//! The image tools: `build`, `inspect`, `check`, `unpack`.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rafs_format::builder::{BuildOptions, BuildProgress, Builder};
use rafs_format::chunk::{Chunking, Compression, DigestAlgo};
use rafs_format::image;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ChunkingArg {
    Fixed,
    Cdc,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum CompressionArg {
    Zstd,
    Gzip,
    None,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum DigestArg {
    Sha256,
    Blake3,
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Image dir to create (must be new or empty).
    #[arg(long)]
    out: PathBuf,
    /// Build from this directory tree.
    #[arg(long, conflicts_with_all = ["layer", "oci_layout"], required_unless_present_any = ["layer", "oci_layout"])]
    dir: Option<PathBuf>,
    /// Build from layer tarballs (tar, tar+gzip or tar+zstd), applied in the order given.
    #[arg(long, conflicts_with = "oci_layout")]
    layer: Vec<PathBuf>,
    /// Build from an OCI image layout, `DIR` or `DIR:TAG`.
    #[arg(long)]
    oci_layout: Option<String>,
    /// Fixed chunk size (power of two, 4K..16M) or CDC average size; accepts K/M suffixes.
    #[arg(long, default_value = "1M", value_parser = parse_size)]
    chunk_size: u32,
    #[arg(long, value_enum, default_value = "fixed")]
    chunking: ChunkingArg,
    /// CDC minimum chunk size (default: chunk size / 4).
    #[arg(long, value_parser = parse_size)]
    cdc_min: Option<u32>,
    /// CDC maximum chunk size (default: chunk size * 4, at most 16M).
    #[arg(long, value_parser = parse_size)]
    cdc_max: Option<u32>,
    #[arg(long, value_enum, default_value = "zstd")]
    compression: CompressionArg,
    /// Compression level (zstd 1..22, default 3; gzip 0..9, default 6).
    #[arg(long)]
    compression_level: Option<i32>,
    #[arg(long, value_enum, default_value = "sha256")]
    digest: DigestArg,
    /// Reference chunks already stored in this image dir instead of writing them again.
    #[arg(long)]
    chunk_dict: Option<PathBuf>,
    /// File listing paths (one per line, `#` comments) to place first and fetch first.
    #[arg(long)]
    prefetch_list: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// Writes a command's output to stdout; a closed pipe (`tessera inspect | head`) ends
/// the output quietly instead of failing.
fn print_out(text: impl std::fmt::Display) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write!(out, "{text}").and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("write to standard output"),
    }
}

/// Parses `4096`, `64K`, `1M`, `1MiB`, `16m`.
fn parse_size(s: &str) -> Result<u32, String> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (n, unit) = t.split_at(digits_end);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("{s:?} is not a size like 4096, 64K or 1M"))?;
    let mult: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        _ => return Err(format!("{s:?}: unknown unit {unit:?} (use K or M)")),
    };
    n.checked_mul(mult)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| format!("{s:?} is too large"))
}

fn read_prefetch_list(path: &PathBuf) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("read prefetch list {}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect())
}

impl BuildArgs {
    fn options(&self) -> Result<BuildOptions> {
        let chunking = match self.chunking {
            ChunkingArg::Fixed => Chunking::Fixed {
                size: self.chunk_size,
            },
            ChunkingArg::Cdc => Chunking::Cdc {
                min: self.cdc_min.unwrap_or(self.chunk_size / 4),
                avg: self.chunk_size,
                max: self
                    .cdc_max
                    .unwrap_or((self.chunk_size.saturating_mul(4)).min(16 << 20)),
            },
        };
        let compression = match self.compression {
            CompressionArg::Zstd => Compression::Zstd,
            CompressionArg::Gzip => Compression::Gzip,
            CompressionArg::None => Compression::None,
        };
        let default_level = match compression {
            Compression::Gzip => 6,
            // zstd's own default: on a real root filesystem level 9 saves ~2% of the
            // bytes for a third of the build speed; raise it per build if bytes matter more.
            _ => 3,
        };
        Ok(BuildOptions {
            chunking,
            compression,
            compression_level: self.compression_level.unwrap_or(default_level),
            digest: match self.digest {
                DigestArg::Sha256 => DigestAlgo::Sha256,
                DigestArg::Blake3 => DigestAlgo::Blake3,
            },
            chunk_dict: self.chunk_dict.clone(),
            prefetch: match &self.prefetch_list {
                Some(p) => read_prefetch_list(p)?,
                None => Vec::new(),
            },
            progress: None,
        })
    }
}

/// Splits `DIR:TAG` (a tag has no `/`), keeping paths with colons intact.
fn split_layout_ref(s: &str) -> (PathBuf, Option<&str>) {
    match s.rsplit_once(':') {
        Some((dir, tag)) if !tag.is_empty() && !tag.contains('/') => {
            (PathBuf::from(dir), Some(tag))
        }
        _ => (PathBuf::from(s), None),
    }
}

/// Shows a build's progress on stderr until dropped: a line rewritten in place on a
/// terminal, a line every 10 s otherwise (logs), nothing for builds that end quickly.
struct ProgressDisplay {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProgressDisplay {
    fn start(progress: Arc<BuildProgress>) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let tty = std::io::stderr().is_terminal();
            let every = Duration::from_secs(if tty { 1 } else { 10 });
            let started = Instant::now();
            let mut shown = false;
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let bytes = progress.bytes.load(Ordering::Relaxed);
                let files = progress.files.load(Ordering::Relaxed);
                let secs = started.elapsed().as_secs_f64();
                let line = format!(
                    "building: {files} files, {:.1} MiB read, {:.1} MB/s",
                    bytes as f64 / f64::from(1 << 20),
                    bytes as f64 / 1e6 / secs
                );
                if tty {
                    eprint!("\r{line}\x1b[K");
                } else {
                    eprintln!("{line}");
                }
                shown = true;
            }
            if shown && tty {
                eprint!("\r\x1b[K");
            }
        });
        ProgressDisplay {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for ProgressDisplay {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

pub fn build(args: BuildArgs) -> Result<()> {
    let mut opts = args.options()?;
    let progress = Arc::new(BuildProgress::default());
    opts.progress = Some(progress.clone());
    let display = ProgressDisplay::start(progress);
    let mut builder = Builder::new(&args.out, opts)?;
    if let Some(dir) = &args.dir {
        builder
            .add_dir(dir)
            .with_context(|| format!("read directory {}", dir.display()))?;
    } else if let Some(layout) = &args.oci_layout {
        let (dir, tag) = split_layout_ref(layout);
        builder
            .add_oci_layout(&dir, tag)
            .with_context(|| format!("read OCI layout {layout}"))?;
    } else if !args.layer.is_empty() {
        for layer in &args.layer {
            let f = std::fs::File::open(layer)
                .with_context(|| format!("open layer {}", layer.display()))?;
            builder
                .add_layer(f)
                .with_context(|| format!("apply layer {}", layer.display()))?;
        }
    } else {
        bail!("nothing to build: pass --dir, --layer or --oci-layout");
    }
    let summary = builder.finish().context("write image")?;
    drop(display);
    if args.json {
        print_out(format_args!(
            "{}\n",
            serde_json::to_string_pretty(&summary)?
        ))
    } else {
        print_out(&summary)
    }
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// Image dir (holding `bootstrap` and `blobs/`).
    image: PathBuf,
    /// Print JSON instead of a listing.
    #[arg(long)]
    json: bool,
}

pub fn inspect(args: InspectArgs) -> Result<()> {
    let listing = image::inspect(&args.image)
        .with_context(|| format!("inspect image {}", args.image.display()))?;
    if args.json {
        print_out(format_args!(
            "{}\n",
            serde_json::to_string_pretty(&listing)?
        ))
    } else {
        print_out(&listing)
    }
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// Image dir (holding `bootstrap` and `blobs/`).
    image: PathBuf,
    #[arg(long)]
    json: bool,
}

pub fn check(args: CheckArgs) -> Result<()> {
    let report = image::check(&args.image)
        .with_context(|| format!("image {} is corrupt", args.image.display()))?;
    if args.json {
        print_out(format_args!("{}\n", serde_json::to_string_pretty(&report)?))
    } else {
        print_out(format_args!(
            "image {} is sound: {} files, {} chunks ({} bytes) and {} blobs verified\n",
            args.image.display(),
            report.files,
            report.chunks_verified,
            report.bytes_verified,
            report.blobs_verified
        ))
    }
}

#[derive(Debug, Args)]
pub struct UnpackArgs {
    /// Image dir (holding `bootstrap` and `blobs/`).
    image: PathBuf,
    /// Directory to rebuild the tree in (created; must be empty).
    #[arg(long, required_unless_present = "tar", conflicts_with = "tar")]
    to: Option<PathBuf>,
    /// Tar file to write instead (`-` for standard output).
    #[arg(long)]
    tar: Option<PathBuf>,
}

pub fn unpack(args: UnpackArgs) -> Result<()> {
    let ctx = || format!("unpack image {}", args.image.display());
    let summary = match (&args.to, &args.tar) {
        (Some(dir), _) => image::unpack_to_dir(&args.image, dir).with_context(ctx)?,
        (None, Some(t)) if t.as_os_str() == "-" => {
            image::unpack_to_tar(&args.image, std::io::stdout().lock()).with_context(ctx)?
        }
        (None, Some(t)) => {
            let f = std::fs::File::create(t).with_context(|| format!("create {}", t.display()))?;
            image::unpack_to_tar(&args.image, std::io::BufWriter::new(f)).with_context(ctx)?
        }
        (None, None) => bail!("pass --to DIR or --tar FILE"),
    };
    eprintln!(
        "unpacked {} entries, {} bytes of file data{}",
        summary.entries,
        summary.file_bytes,
        if summary.skipped_sockets > 0 {
            format!(
                " ({} sockets left out: tar cannot hold them)",
                summary.skipped_sockets
            )
        } else {
            String::new()
        }
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("5G").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn layout_refs_split_on_the_tag() {
        assert_eq!(
            split_layout_ref("img:v1"),
            (PathBuf::from("img"), Some("v1"))
        );
        assert_eq!(split_layout_ref("/a/b"), (PathBuf::from("/a/b"), None));
        assert_eq!(split_layout_ref("/a:b/c"), (PathBuf::from("/a:b/c"), None));
    }
}
