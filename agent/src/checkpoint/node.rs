//! What a node is to a checkpoint: the CRIU that dumps or restores, the kernel and the
//! CPU. A checkpoint records them (manifest annotations, [`NodeInfo::annotations`]);
//! a restore compares them with its own node ([`check`]) and refuses only what CRIU
//! cannot do: another CRIU major.minor. A different kernel or CPU is logged, not
//! refused: CRIU checks the CPU features a restore needs itself.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::criu::{Criu, CriuVersion, CRIU_HINT};
use crate::{Error, Result};

/// The CRIU version that made the checkpoint (`4.2.1`).
pub const CRIU_VERSION_ANNOTATION: &str = "io.tessera.checkpoint.criu-version";
/// The dumping node's kernel release (`uname -r`).
pub const KERNEL_ANNOTATION: &str = "io.tessera.checkpoint.kernel";
/// The dumping node's CPU model name (`/proc/cpuinfo`).
pub const CPU_MODEL_ANNOTATION: &str = "io.tessera.checkpoint.cpu-model";
/// `sha256:` of the dumping node's CPU flags, sorted and space-separated (the list
/// itself is in the image config).
pub const CPU_FLAGS_ANNOTATION: &str = "io.tessera.checkpoint.cpu-flags-digest";

/// This node as a checkpoint sees it.
#[derive(Debug, Clone)]
pub struct NodeInfo {
    pub criu: CriuVersion,
    /// `uname -r`.
    pub kernel: String,
    /// The first CPU's `model name`, or `unknown`.
    pub cpu_model: String,
    /// The first CPU's `flags`, sorted.
    pub cpu_flags: Vec<String>,
}

impl NodeInfo {
    /// Asks `criu` its version and the kernel about itself.
    pub fn probe(criu: &Criu) -> Result<NodeInfo> {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map_err(|e| Error::io("read", "/proc/sys/kernel/osrelease", e))?
            .trim()
            .to_string();
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo")
            .map_err(|e| Error::io("read", "/proc/cpuinfo", e))?;
        let (cpu_model, cpu_flags) = parse_cpuinfo(&cpuinfo);
        Ok(NodeInfo {
            criu: criu.version()?,
            kernel,
            cpu_model,
            cpu_flags,
        })
    }

    pub fn cpu_flags_digest(&self) -> String {
        format!(
            "sha256:{}",
            hex::encode(Sha256::digest(self.cpu_flags.join(" ")))
        )
    }

    /// The manifest annotations a checkpoint made on this node carries.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (CRIU_VERSION_ANNOTATION.into(), self.criu.to_string()),
            (KERNEL_ANNOTATION.into(), self.kernel.clone()),
            (CPU_MODEL_ANNOTATION.into(), self.cpu_model.clone()),
            (CPU_FLAGS_ANNOTATION.into(), self.cpu_flags_digest()),
        ])
    }
}

/// The first CPU's model name and sorted flags from `/proc/cpuinfo`.
fn parse_cpuinfo(text: &str) -> (String, Vec<String>) {
    let field = |name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let model = field("model name").unwrap_or_else(|| "unknown".into());
    let mut flags: Vec<String> = field("flags")
        .unwrap_or_default()
        .split_whitespace()
        .map(String::from)
        .collect();
    flags.sort();
    flags.dedup();
    (model, flags)
}

/// Whether checkpoint `image`, whose manifest carries `annotations`, can be restored by
/// `node`: an error saying what to do when it cannot, else the differences worth a log
/// line (kernel, CPU).
pub fn check(
    image: &str,
    annotations: &BTreeMap<String, String>,
    node: &NodeInfo,
) -> Result<Vec<String>> {
    let incompatible = |reason: String| Error::CheckpointIncompatible {
        image: image.to_string(),
        reason,
    };
    let recorded = annotations.get(CRIU_VERSION_ANNOTATION).ok_or_else(|| {
        incompatible(format!(
            "its manifest has no {CRIU_VERSION_ANNOTATION} annotation: it is not a \
             checkpoint made by `tessera checkpoint`"
        ))
    })?;
    let version = CriuVersion::parse(recorded).ok_or_else(|| {
        incompatible(format!(
            "its {CRIU_VERSION_ANNOTATION} annotation {recorded:?} is not a CRIU version"
        ))
    })?;
    if !version.restores_with(&node.criu) {
        return Err(incompatible(format!(
            "it was dumped by CRIU {version} and this node's CRIU is {}: a restore needs the \
             same CRIU major.minor. Restore it with a CRIU {}.{}.x (--criu PATH), or \
             checkpoint the application again with this node's CRIU; {CRIU_HINT}",
            node.criu, version.major, version.minor
        )));
    }
    let mut notes = Vec::new();
    let mut differs = |what: &str, key: &str, here: &str| match annotations.get(key) {
        Some(there) if there != here => notes.push(format!(
            "{what} differs: dumped on {there:?}, restoring on {here:?}"
        )),
        Some(_) => {}
        None => notes.push(format!("{what} of the dumping node not recorded ({key})")),
    };
    differs("kernel release", KERNEL_ANNOTATION, &node.kernel);
    differs("CPU model", CPU_MODEL_ANNOTATION, &node.cpu_model);
    differs("CPU flags", CPU_FLAGS_ANNOTATION, &node.cpu_flags_digest());
    Ok(notes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(criu: &str) -> NodeInfo {
        NodeInfo {
            criu: CriuVersion::parse(criu).unwrap(),
            kernel: "6.18.0".into(),
            cpu_model: "Some CPU".into(),
            cpu_flags: vec!["avx2".into(), "fpu".into()],
        }
    }

    #[test]
    fn cpuinfo_gives_the_first_cpus_model_and_sorted_flags() {
        let text =
            "processor\t: 0\nmodel name\t: Example CPU @ 2GHz\nflags\t\t: sse fpu avx2 fpu\n\n\
                    processor\t: 1\nmodel name\t: Other\nflags\t\t: x\n";
        let (model, flags) = parse_cpuinfo(text);
        assert_eq!(model, "Example CPU @ 2GHz");
        assert_eq!(flags, ["avx2", "fpu", "sse"]);
        assert_eq!(parse_cpuinfo("").0, "unknown");
    }

    #[test]
    fn the_same_criu_minor_restores_and_other_differences_are_notes() {
        let dumped = node("4.2.1");
        let mut annotations = dumped.annotations();
        assert!(check("img", &annotations, &node("4.2.3"))
            .unwrap()
            .is_empty());
        annotations.insert(KERNEL_ANNOTATION.into(), "6.1.0".into());
        let notes = check("img", &annotations, &node("4.2.1")).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        assert!(notes[0].contains("kernel release"), "{notes:?}");
    }

    #[test]
    fn another_criu_minor_or_none_recorded_is_refused_with_what_to_do() {
        let mut annotations = node("3.17.1").annotations();
        let e = check("img", &annotations, &node("4.2.1")).unwrap_err();
        assert!(
            matches!(&e, Error::CheckpointIncompatible { image, .. } if image == "img"),
            "{e:?}"
        );
        let message = e.to_string();
        assert!(
            message.contains("CRIU 3.17.1") && message.contains("4.2.1"),
            "{message}"
        );
        assert!(message.contains("--criu PATH"), "{message}");
        annotations.remove(CRIU_VERSION_ANNOTATION);
        let e = check("img", &annotations, &node("4.2.1")).unwrap_err();
        assert!(e.to_string().contains("not a checkpoint"), "{e}");
        annotations.insert(CRIU_VERSION_ANNOTATION.into(), "four".into());
        assert!(check("img", &annotations, &node("4.2.1")).is_err());
    }
}
