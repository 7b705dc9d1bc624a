//! OCI 1.1 referrers: artifacts pushed *about* an image manifest (their `subject`) and
//! found again by that manifest's digest, leaving the image itself untouched. This is
//! how an index of an unconverted image travels beside it (issue 22), as SOCI's do.
//!
//! A registry with the referrers API lists them at `GET /v2/<name>/referrers/<digest>`.
//! Older ones (distribution 2.8, which the tests run) do not; for those the
//! distribution spec's **referrers tag schema** applies: an image index tagged
//! `sha256-<hex of the subject digest>` that whoever pushes a referrer keeps up to date.
//! Two pushers updating that tag at once can lose one of the two entries (the spec
//! accepts this); pushing again restores it.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::{json, Value};

use super::client::{PushOutcome, RegistryClient};
use super::reference::Reference;
use crate::Error;

pub const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
pub const INDEX_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// The config of an artifact that has none (OCI 1.1): `{}`.
pub const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY_CONFIG: &[u8] = b"{}";

/// A content descriptor (OCI image spec), as a referrer list holds them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    pub artifact_type: Option<String>,
    pub annotations: BTreeMap<String, String>,
}

impl Descriptor {
    /// The descriptor as a manifest or index names it.
    pub fn to_json(&self) -> Value {
        let mut v = json!({
            "mediaType": self.media_type,
            "digest": self.digest,
            "size": self.size,
        });
        if let Some(t) = &self.artifact_type {
            v["artifactType"] = json!(t);
        }
        if !self.annotations.is_empty() {
            v["annotations"] = json!(self.annotations);
        }
        v
    }

    fn from_json(v: &Value) -> Option<Self> {
        Some(Descriptor {
            media_type: v.get("mediaType")?.as_str()?.to_string(),
            digest: v.get("digest")?.as_str()?.to_string(),
            size: v.get("size")?.as_u64()?,
            artifact_type: v
                .get("artifactType")
                .and_then(Value::as_str)
                .map(String::from),
            annotations: v
                .get("annotations")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// The tag of the referrers tag schema for `subject` (`sha256:<hex>` → `sha256-<hex>`).
pub fn fallback_tag(subject: &str) -> String {
    subject.replacen(':', "-", 1)
}

fn in_repository(r: &Reference, tag: Option<String>, digest: Option<String>) -> Reference {
    Reference {
        tag,
        digest,
        ..r.clone()
    }
}

fn bad_index(r: &Reference, what: &str, reason: &str) -> Error {
    Error::Transport {
        registry: r.registry.clone(),
        repository: r.repository.clone(),
        what: what.to_string(),
        reason: reason.to_string(),
    }
}

/// The manifests of `r`'s repository whose subject is `subject`, of `artifact_type`
/// when given: from the referrers API where the registry has it, else from the
/// referrers tag.
pub async fn list(
    client: &RegistryClient,
    r: &Reference,
    subject: &str,
    artifact_type: Option<&str>,
) -> Result<Vec<Descriptor>, Error> {
    let index = match client.referrers(r, subject).await? {
        Some(index) => Some(index.bytes),
        None => tag_index(client, r, subject).await?,
    };
    let Some(bytes) = index else {
        return Ok(Vec::new());
    };
    let what = format!("referrers of {subject}");
    let index: Value = serde_json::from_slice(&bytes)
        .map_err(|e| bad_index(r, &what, &format!("the index is not JSON: {e}")))?;
    let manifests = index
        .get("manifests")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_index(r, &what, "the index has no manifests array"))?;
    Ok(manifests
        .iter()
        .filter_map(Descriptor::from_json)
        .filter(|d| artifact_type.is_none_or(|t| d.artifact_type.as_deref() == Some(t)))
        .collect())
}

/// The referrers tag's index, or `None` when there is no such tag yet.
async fn tag_index(
    client: &RegistryClient,
    r: &Reference,
    subject: &str,
) -> Result<Option<Vec<u8>>, Error> {
    let tagged = in_repository(r, Some(fallback_tag(subject)), None);
    match client.manifest(&tagged).await {
        Ok(m) => Ok(Some(m.bytes)),
        Err(Error::Status { status: 404, .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// What to push as a referrer: an artifact manifest of `artifact_type` whose layers
/// (already pushed to the repository) are `layers`, about `subject` (a manifest of the
/// same repository).
#[derive(Debug, Clone)]
pub struct Artifact<'a> {
    pub subject: &'a Descriptor,
    pub artifact_type: &'a str,
    pub layers: &'a [Descriptor],
    pub annotations: BTreeMap<String, String>,
}

/// Pushes `artifact` as a referrer of its subject into `r`'s repository (the empty
/// config, the manifest by digest, and, where the registry has no referrers API, the
/// referrers tag's index with the new entry). Returns the manifest's descriptor.
pub async fn push(
    client: &RegistryClient,
    r: &Reference,
    artifact: &Artifact<'_>,
) -> Result<Descriptor, Error> {
    let repo = in_repository(r, None, None);
    let empty = push_small_blob(client, &repo, EMPTY_CONFIG, EMPTY_TYPE).await?;
    let mut manifest = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "artifactType": artifact.artifact_type,
        "config": empty.to_json(),
        "layers": artifact.layers.iter().map(Descriptor::to_json).collect::<Vec<_>>(),
        "subject": Descriptor { artifact_type: None, annotations: BTreeMap::new(), ..artifact.subject.clone() }.to_json(),
    });
    if !artifact.annotations.is_empty() {
        manifest["annotations"] = json!(artifact.annotations);
    }
    let bytes = serde_json::to_vec(&manifest).map_err(|e| {
        bad_index(
            r,
            "push referrer",
            &format!("cannot serialize the manifest: {e}"),
        )
    })?;
    let size = bytes.len() as u64;
    let digest = client.push_manifest(&repo, MANIFEST_TYPE, bytes).await?;
    let pushed = Descriptor {
        media_type: MANIFEST_TYPE.into(),
        digest,
        size,
        artifact_type: Some(artifact.artifact_type.to_string()),
        annotations: artifact.annotations.clone(),
    };
    register(client, &repo, &artifact.subject.digest, &pushed).await?;
    Ok(pushed)
}

/// Makes `entry`, a manifest already pushed to `r`'s repository with `subject` as its
/// subject, findable by [`list`]: nothing to do where the registry has the referrers
/// API (it indexes the subject itself), else the referrers tag's index gets the entry.
/// `entry` should carry the manifest's `artifactType` and annotations, as the API's
/// answer would.
pub async fn register(
    client: &RegistryClient,
    r: &Reference,
    subject: &str,
    entry: &Descriptor,
) -> Result<(), Error> {
    let repo = in_repository(r, None, None);
    if client.referrers(&repo, subject).await?.is_none() {
        add_to_tag_index(client, &repo, subject, entry).await?;
    }
    Ok(())
}

/// Pushes `bytes` (a small blob: an artifact's config or JSON layer) into `repo` as a
/// blob of `media_type`; its descriptor.
pub async fn push_small_blob(
    client: &RegistryClient,
    repo: &Reference,
    bytes: &[u8],
    media_type: &str,
) -> Result<Descriptor, Error> {
    let digest = format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(bytes))
    );
    let mut file =
        tempfile::NamedTempFile::new().map_err(|e| Error::io("create", std::env::temp_dir(), e))?;
    file.write_all(bytes)
        .map_err(|e| Error::io("write", file.path(), e))?;
    let _: PushOutcome = client
        .push_blob(
            repo,
            &digest,
            bytes.len() as u64,
            file.path(),
            None,
            &|_| {},
        )
        .await?;
    Ok(Descriptor {
        media_type: media_type.into(),
        digest,
        size: bytes.len() as u64,
        artifact_type: None,
        annotations: BTreeMap::new(),
    })
}

/// Adds `entry` to the referrers tag's index of `subject` (creating it), unless it is
/// there already.
async fn add_to_tag_index(
    client: &RegistryClient,
    repo: &Reference,
    subject: &str,
    entry: &Descriptor,
) -> Result<(), Error> {
    let what = format!("referrers tag of {subject}");
    let mut index = match tag_index(client, repo, subject).await? {
        Some(bytes) => serde_json::from_slice::<Value>(&bytes)
            .map_err(|e| bad_index(repo, &what, &format!("the index is not JSON: {e}")))?,
        None => json!({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": []}),
    };
    let manifests = index
        .get_mut("manifests")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| bad_index(repo, &what, "the index has no manifests array"))?;
    if manifests
        .iter()
        .any(|m| m.get("digest").and_then(Value::as_str) == Some(&entry.digest))
    {
        return Ok(());
    }
    manifests.push(entry.to_json());
    let bytes = serde_json::to_vec(&index)
        .map_err(|e| bad_index(repo, &what, &format!("cannot serialize the index: {e}")))?;
    let tagged = in_repository(repo, Some(fallback_tag(subject)), None);
    client.push_manifest(&tagged, INDEX_TYPE, bytes).await?;
    Ok(())
}
