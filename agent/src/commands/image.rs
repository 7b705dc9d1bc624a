//! The image tools: `build`, and `inspect`, `check`, `unpack` of an image dir or of a
//! Tessera image in a registry (`--ref`).

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use rafs_format::builder::{BuildOptions, BuildProgress, Builder, ChunkDict};
use rafs_format::chunk::{Chunking, Compression, DigestAlgo};
use rafs_format::image;
use rafs_format::reader::{BlobSource, Bootstrap, LocalBlobs};
use tessera_agent::registry::client::Credential;
use tessera_agent::registry::image::{self as registry_image, RemoteBlobs};
use tessera_agent::registry::reference::{Platform, Reference};

use tessera_agent::registry::credentials::parse_user_password;

use super::parse_size;
use super::registry::{runtime, RegistryArgs};

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
    #[command(flatten)]
    format: FormatArgs,
    /// Reference chunks already stored in this image dir instead of writing them again.
    #[arg(long)]
    chunk_dict: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// How images are cut and stored: shared by `build` and `convert`.
#[derive(Debug, Args)]
pub struct FormatArgs {
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
    /// File listing paths (one per line, `#` comments) to place first and fetch first.
    #[arg(long)]
    prefetch_list: Option<PathBuf>,
}

/// Writes a command's output to stdout; a closed pipe (`tessera inspect | head`) ends
/// the output quietly instead of failing.
pub fn print_out(text: impl std::fmt::Display) -> Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match write!(out, "{text}").and_then(|_| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("write to standard output"),
    }
}

/// Prints a command's summary: as JSON for machines, else as its `Display` for people.
pub fn print_summary(
    summary: &(impl serde::Serialize + std::fmt::Display),
    json: bool,
) -> Result<()> {
    if json {
        print_out(format_args!("{}\n", serde_json::to_string_pretty(summary)?))
    } else {
        print_out(summary)
    }
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

impl FormatArgs {
    /// Build options without a chunk dictionary.
    pub fn options(&self) -> Result<BuildOptions> {
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
            chunk_dict: None,
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

/// Shows progress on stderr until dropped: a line rewritten in place on a terminal, a
/// line every 10 s otherwise (logs), nothing for work that ends within the first tick.
pub struct ProgressDisplay {
    stop: std::sync::mpsc::Sender<()>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ProgressDisplay {
    /// Calls `line` with the seconds elapsed at every tick and shows what it returns.
    pub fn start(mut line: impl FnMut(f64) -> String + Send + 'static) -> Self {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let tty = std::io::stderr().is_terminal();
            let every = Duration::from_secs(if tty { 1 } else { 10 });
            let started = Instant::now();
            let mut shown = false;
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                let line = line(started.elapsed().as_secs_f64());
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

    /// A build's progress: files and bytes read, and the rate.
    pub fn build(progress: Arc<BuildProgress>) -> Self {
        Self::start(move |secs| {
            let bytes = progress.bytes.load(Ordering::Relaxed);
            let files = progress.files.load(Ordering::Relaxed);
            format!(
                "building: {files} files, {:.1} MiB read, {:.1} MB/s",
                bytes as f64 / f64::from(1 << 20),
                bytes as f64 / 1e6 / secs
            )
        })
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
    let mut opts = args.format.options()?;
    opts.chunk_dict = args.chunk_dict.clone().map(|image_dir| ChunkDict {
        image_dir,
        link_blobs: true,
    });
    let progress = Arc::new(BuildProgress::default());
    opts.progress = Some(progress.clone());
    let display = ProgressDisplay::build(progress);
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
    print_summary(&summary, args.json)
}

/// Which image a read-only command works on: an image dir, or a Tessera image in a
/// registry (its bootstrap fetched and verified, its blobs read by Range request).
#[derive(Debug, Args)]
pub struct ImageSource {
    /// Image dir (holding `bootstrap` and `blobs/`).
    #[arg(required_unless_present = "reference", conflicts_with = "reference")]
    image: Option<PathBuf>,
    /// A Tessera image in a registry (`host/repo:tag` or `@sha256:…`) instead.
    #[arg(long = "ref", value_name = "REF")]
    reference: Option<Reference>,
    /// Platform to pick from a multi-platform image [default: this machine's].
    #[arg(long, value_name = "OS/ARCH[/VARIANT]")]
    platform: Option<Platform>,
    /// Registry credentials, `USER:PASSWORD` (else the credentials file).
    #[arg(long, env = "TESSERA_CREDS", value_parser = parse_user_password, hide_env_values = true)]
    creds: Option<Credential>,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// An image opened for reading, wherever it is.
struct OpenImage {
    bootstrap: Bootstrap,
    blobs: Box<dyn BlobSource>,
    name: String,
    /// Keeps the runtime that remote reads block on, and the fetched bootstrap's dir.
    _remote: Option<(tokio::runtime::Runtime, tempfile::TempDir)>,
}

impl ImageSource {
    fn open(&self) -> Result<OpenImage> {
        if let Some(dir) = &self.image {
            let bootstrap = image::open_validated(dir)
                .with_context(|| format!("open image {}", dir.display()))?;
            return Ok(OpenImage {
                bootstrap,
                blobs: Box::new(LocalBlobs::new(dir)),
                name: dir.display().to_string(),
                _remote: None,
            });
        }
        let Some(r) = &self.reference else {
            bail!("pass an image dir or --ref REF");
        };
        let client = self.registry.client(&[r], self.creds.as_ref())?;
        let rt = runtime()?;
        let tmp = tempfile::tempdir().context("create a temporary directory")?;
        let platform = self.platform.clone().unwrap_or_else(Platform::host);
        let path = rt
            .block_on(async {
                let img = registry_image::resolve_platform(&client, r, &platform).await?;
                registry_image::fetch_bootstrap_or_index(&client, &img, tmp.path()).await
            })
            .with_context(|| format!("fetch the bootstrap of {r}"))?;
        let bootstrap = image::open_validated(tmp.path())
            .with_context(|| format!("open the bootstrap fetched to {}", path.display()))?;
        let blobs = RemoteBlobs::new(client, r.clone(), rt.handle().clone());
        Ok(OpenImage {
            bootstrap,
            blobs: Box::new(blobs),
            name: r.to_string(),
            _remote: Some((rt, tmp)),
        })
    }
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    source: ImageSource,
    /// Print JSON instead of a listing.
    #[arg(long)]
    json: bool,
}

pub fn inspect(args: InspectArgs) -> Result<()> {
    let img = args.source.open()?;
    let listing = image::inspect_bootstrap(&img.bootstrap)
        .with_context(|| format!("inspect image {}", img.name))?;
    print_summary(&listing, args.json)
}

#[derive(Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    source: ImageSource,
    #[arg(long)]
    json: bool,
}

pub fn check(args: CheckArgs) -> Result<()> {
    let img = args.source.open()?;
    let report = image::check_image(&img.bootstrap, img.blobs.as_ref())
        .with_context(|| format!("image {} is corrupt", img.name))?;
    if args.json {
        print_out(format_args!("{}\n", serde_json::to_string_pretty(&report)?))
    } else {
        print_out(format_args!(
            "image {} is sound: {} files, {} chunks ({} bytes) and {} blobs verified\n",
            img.name,
            report.files,
            report.chunks_verified,
            report.bytes_verified,
            report.blobs_verified
        ))
    }
}

#[derive(Debug, Args)]
pub struct UnpackArgs {
    #[command(flatten)]
    source: ImageSource,
    /// Directory to rebuild the tree in (created; must be empty).
    #[arg(long, required_unless_present = "tar", conflicts_with = "tar")]
    to: Option<PathBuf>,
    /// Tar file to write instead (`-` for standard output).
    #[arg(long)]
    tar: Option<PathBuf>,
}

pub fn unpack(args: UnpackArgs) -> Result<()> {
    let img = args.source.open()?;
    let (b, blobs) = (&img.bootstrap, img.blobs.as_ref());
    let ctx = || format!("unpack image {}", img.name);
    let summary = match (&args.to, &args.tar) {
        (Some(dir), _) => image::unpack_image_to_dir(b, blobs, dir).with_context(ctx)?,
        (None, Some(t)) if t.as_os_str() == "-" => {
            image::unpack_image_to_tar(b, blobs, std::io::stdout().lock()).with_context(ctx)?
        }
        (None, Some(t)) => {
            let f = std::fs::File::create(t).with_context(|| format!("create {}", t.display()))?;
            image::unpack_image_to_tar(b, blobs, std::io::BufWriter::new(f)).with_context(ctx)?
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
    fn layout_refs_split_on_the_tag() {
        assert_eq!(
            split_layout_ref("img:v1"),
            (PathBuf::from("img"), Some("v1"))
        );
        assert_eq!(split_layout_ref("/a/b"), (PathBuf::from("/a/b"), None));
        assert_eq!(split_layout_ref("/a:b/c"), (PathBuf::from("/a:b/c"), None));
    }
}
