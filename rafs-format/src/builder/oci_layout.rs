//! Reading an OCI image layout (as written by skopeo or umoci): `index.json` → manifest →
//! layers, each checked against its digest as it is read.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use oci_spec::image::{Descriptor, ImageIndex, ImageManifest, MediaType};
use sha2::{Digest, Sha256};

use crate::{Error, Result};

const REF_NAME: &str = "org.opencontainers.image.ref.name";

/// An image found in a layout: its layers in order, bottom first.
#[derive(Debug)]
pub(crate) struct LayoutImage {
    pub layers: Vec<Descriptor>,
}

fn err(path: &Path, reason: impl Into<String>) -> Error {
    Error::OciLayout {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

/// Path of a blob in the layout, refusing digests that are not plain `algo:hex`.
pub(crate) fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf> {
    let (algo, hex) = digest
        .split_once(':')
        .ok_or_else(|| err(layout, format!("digest {digest:?} has no algorithm")))?;
    if algo != "sha256" || hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(err(
            layout,
            format!("digest {digest:?} is not a sha256 digest"),
        ));
    }
    Ok(layout.join("blobs").join(algo).join(hex))
}

/// Reads a small JSON blob and checks its digest.
fn read_verified(layout: &Path, desc: &Descriptor) -> Result<Vec<u8>> {
    let digest = desc.digest().to_string();
    let path = blob_path(layout, &digest)?;
    let bytes = std::fs::read(&path).map_err(|e| Error::io("read OCI blob", &path, e))?;
    let actual = format!("sha256:{}", hex::encode(Sha256::digest(&bytes)));
    if actual != digest {
        return Err(err(layout, format!("blob {digest} hashes to {actual}")));
    }
    Ok(bytes)
}

fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", arch)
}

/// Picks the image for `tag` (or the only one) and returns its layers.
pub(crate) fn open(layout: &Path, tag: Option<&str>) -> Result<LayoutImage> {
    let index_path = layout.join("index.json");
    let bytes = std::fs::read(&index_path).map_err(|e| Error::io("read", &index_path, e))?;
    let index: ImageIndex = serde_json::from_slice(&bytes)
        .map_err(|e| err(layout, format!("index.json is not an OCI index: {e}")))?;
    let candidates: Vec<&Descriptor> = index
        .manifests()
        .iter()
        .filter(|d| match tag {
            Some(t) => d
                .annotations()
                .as_ref()
                .and_then(|a| a.get(REF_NAME))
                .is_some_and(|n| n == t),
            None => true,
        })
        .collect();
    let desc = match (candidates.as_slice(), tag) {
        ([one], _) => (*one).clone(),
        ([], Some(t)) => return Err(err(layout, format!("no image tagged {t:?} in index.json"))),
        ([], None) => return Err(err(layout, "index.json lists no image")),
        (_, _) => {
            return Err(err(
                layout,
                "index.json lists several images: name one with DIR:TAG",
            ))
        }
    };
    resolve(layout, &desc, 0)
}

/// Follows nested indexes (multi-platform images) down to a manifest.
fn resolve(layout: &Path, desc: &Descriptor, depth: u32) -> Result<LayoutImage> {
    if depth > 4 {
        return Err(err(layout, "indexes nested more than 4 deep"));
    }
    let bytes = read_verified(layout, desc)?;
    match desc.media_type() {
        MediaType::ImageIndex => {
            let index: ImageIndex = serde_json::from_slice(&bytes).map_err(|e| {
                err(
                    layout,
                    format!("{} is not an OCI index: {e}", desc.digest()),
                )
            })?;
            let (os, arch) = host_platform();
            let chosen = index
                .manifests()
                .iter()
                .find(|d| {
                    d.platform().as_ref().is_some_and(|p| {
                        p.os().to_string() == os && p.architecture().to_string() == arch
                    })
                })
                .ok_or_else(|| {
                    err(
                        layout,
                        format!("no manifest for {os}/{arch} in {}", desc.digest()),
                    )
                })?;
            resolve(layout, chosen, depth + 1)
        }
        _ => {
            let manifest: ImageManifest = serde_json::from_slice(&bytes).map_err(|e| {
                err(
                    layout,
                    format!("{} is not an OCI image manifest: {e}", desc.digest()),
                )
            })?;
            Ok(LayoutImage {
                layers: manifest.layers().clone(),
            })
        }
    }
}

/// A reader that hashes what passes through, to check a layer's digest at its end.
pub(crate) struct VerifyingReader<R> {
    inner: R,
    hasher: Sha256,
    read: u64,
}

impl<R> std::fmt::Debug for VerifyingReader<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerifyingReader")
            .field("read", &self.read)
            .finish()
    }
}

impl<R: Read> Read for VerifyingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

impl<R: Read> VerifyingReader<R> {
    pub fn new(inner: R) -> Self {
        VerifyingReader {
            inner,
            hasher: Sha256::new(),
            read: 0,
        }
    }

    /// Reads what is left and returns (`sha256:<hex>`, total bytes).
    pub fn finish(mut self) -> std::io::Result<(String, u64)> {
        std::io::copy(&mut self, &mut std::io::sink())?;
        Ok((
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.read,
        ))
    }
}

/// Opens a layer blob of the layout for verified reading.
pub(crate) fn open_layer(layout: &Path, desc: &Descriptor) -> Result<VerifyingReader<File>> {
    let path = blob_path(layout, desc.digest().as_ref())?;
    let f = File::open(&path).map_err(|e| Error::io("open layer", &path, e))?;
    Ok(VerifyingReader::new(f))
}
