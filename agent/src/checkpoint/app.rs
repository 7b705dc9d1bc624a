//! A checkpoint as an OCI 1.1 referrer of its app image: `tessera checkpoint --for APP`
//! puts the app image's manifest (this node's platform) as the checkpoint manifest's
//! `subject`, with artifactType [`ARTIFACT_TYPE`], in the app image's repository, so
//! the checkpoints of an image are found from the image alone ([`checkpoints_of`],
//! through the referrers API or the referrers tag schema, `registry::referrers`),
//! newest first by their `org.opencontainers.image.created` annotation.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::registry::client::RegistryClient;
use crate::registry::image::PlatformImage;
use crate::registry::reference::Reference;
use crate::registry::referrers::{self, Descriptor};
use crate::Result;

/// The `artifactType` of a checkpoint manifest.
pub const ARTIFACT_TYPE: &str = "application/vnd.tessera.checkpoint.v1";
/// When the checkpoint was made (OCI's annotation; RFC 3339, UTC, milliseconds).
pub const CREATED_ANNOTATION: &str = "org.opencontainers.image.created";

/// The descriptor of `image`'s manifest: what a checkpoint of it names as `subject`.
pub fn subject_of(image: &PlatformImage) -> Descriptor {
    Descriptor {
        media_type: image.raw.media_type.clone(),
        digest: image.raw.digest.clone(),
        size: image.raw.bytes.len() as u64,
        artifact_type: None,
        annotations: BTreeMap::new(),
    }
}

/// One checkpoint of an app image.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The checkpoint, in the app image's repository, pinned by digest.
    pub reference: Reference,
    /// Its [`CREATED_ANNOTATION`], if it has one.
    pub created: Option<String>,
    /// Its manifest's annotations (what a restore checks against its node).
    pub annotations: BTreeMap<String, String>,
}

/// The checkpoints of `app` (one platform's manifest), newest first; those without a
/// creation time last. Each checkpoint's own manifest is read for its annotations
/// (a referrer list's copy of them is the registry's or the last pusher's word); one
/// that cannot be read is logged and left out.
pub async fn checkpoints_of(client: &RegistryClient, app: &PlatformImage) -> Result<Vec<Listed>> {
    let found =
        referrers::list(client, &app.reference, &app.raw.digest, Some(ARTIFACT_TYPE)).await?;
    let mut listed = Vec::with_capacity(found.len());
    for d in found {
        let reference = Reference {
            tag: None,
            digest: Some(d.digest.clone()),
            ..app.reference.clone()
        };
        match client.manifest(&reference).await {
            Ok(m) => {
                let annotations = super::manifest_annotations(&m.bytes);
                listed.push(Listed {
                    reference,
                    created: annotations.get(CREATED_ANNOTATION).cloned(),
                    annotations,
                });
            }
            Err(e) => {
                tracing::warn!(checkpoint = %reference, error = %e, "a listed checkpoint cannot be read; skipped")
            }
        }
    }
    sort_newest_first(&mut listed);
    Ok(listed)
}

/// Newest first by creation time (RFC 3339 in UTC with a fixed precision orders as
/// text), undated last, ties by digest so the order is the same everywhere.
fn sort_newest_first(listed: &mut [Listed]) {
    listed.sort_by(|a, b| {
        b.created
            .cmp(&a.created)
            .then_with(|| a.reference.digest.cmp(&b.reference.digest))
    });
}

/// `t` as RFC 3339 in UTC with milliseconds (`2025-01-31T23:59:59.123Z`).
pub fn rfc3339_utc(t: SystemTime) -> String {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, rest) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3600,
        rest / 60 % 60,
        rest % 60,
        since.subsec_millis()
    )
}

/// The proleptic Gregorian date of `days` since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, for days on or after the epoch).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + u64::from(month <= 2);
    (year, month, day)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn times_are_rfc3339_utc_with_milliseconds() {
        let at = |secs: u64, ms: u64| {
            rfc3339_utc(SystemTime::UNIX_EPOCH + Duration::from_millis(secs * 1000 + ms))
        };
        assert_eq!(at(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400, 7), "2000-02-29T00:00:00.007Z");
        assert_eq!(at(1_700_000_000, 123), "2023-11-14T22:13:20.123Z");
        assert_eq!(at(4_107_542_399, 999), "2100-02-28T23:59:59.999Z");
    }

    #[test]
    fn checkpoints_sort_newest_first_undated_last() {
        let listed = |digest: &str, created: Option<&str>| Listed {
            reference: Reference::parse(&format!("r.example/app@sha256:{}", digest.repeat(64)))
                .unwrap(),
            created: created.map(String::from),
            annotations: BTreeMap::new(),
        };
        let mut all = vec![
            listed("a", Some("2025-01-01T00:00:00.000Z")),
            listed("b", None),
            listed("c", Some("2025-03-01T00:00:00.000Z")),
            listed("d", Some("2025-01-01T00:00:00.000Z")),
        ];
        sort_newest_first(&mut all);
        let order: Vec<char> = all
            .iter()
            .map(|l| {
                l.reference
                    .digest
                    .as_deref()
                    .unwrap()
                    .chars()
                    .last()
                    .unwrap()
            })
            .collect();
        assert_eq!(order, ['c', 'a', 'd', 'b']);
    }
}
