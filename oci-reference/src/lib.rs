//! Image references (`host[:port]/repo[:tag][@sha256:…]`) and platforms, parsed as the
//! distribution project's reference grammar and Docker's normalisation rules define them:
//! a first component is a registry host only if it has a `.` or `:` or is `localhost`;
//! otherwise the image is on Docker Hub, where one-component names live in `library/`.
//!
//! A crate of its own so that everything naming images parses them alike: the agent
//! (pulls, mounts, conversions, preheat jobs) and the scheduler (which refuses a
//! preheat job for something that can never be an image before any host sees it).
//! No I/O.

use std::fmt;

/// Why a reference does not parse: each variant is one rule it broke, and carries the
/// whole input so the message can quote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Nothing before the tag or digest.
    #[error("invalid image reference {input:?}: {reason}", reason = NO_NAME)]
    NoName { input: String },
    /// The part after `@` is not a digest this parser accepts.
    #[error("invalid image reference {input:?}: {reason}", reason = BAD_DIGEST)]
    Digest { input: String },
    /// The part after the last `:` of the last component is not a tag.
    #[error("invalid image reference {input:?}: {reason}", reason = BAD_TAG)]
    Tag { input: String },
    /// The first component looks like a registry host but is not a `host[:port]`.
    #[error("invalid image reference {input:?}: {reason}", reason = BAD_HOST)]
    Host { input: String },
    /// A path component of the repository breaks the name grammar.
    #[error("invalid image reference {input:?}: {reason}", reason = BAD_COMPONENT)]
    Component { input: String },
    /// The repository name is longer than [`MAX_NAME`] bytes.
    #[error("invalid image reference {input:?}: {reason}", reason = TOO_LONG)]
    TooLong { input: String },
}

const NO_NAME: &str = "no repository name";
const BAD_DIGEST: &str = "the digest must be sha256:<64 hex> or sha512:<128 hex>, lowercase";
const BAD_TAG: &str = "a tag is 1..=128 of [A-Za-z0-9_.-], not starting with '.' or '-'";
const BAD_HOST: &str = "the registry host is not a valid host[:port]";
const BAD_COMPONENT: &str =
    "repository components are lowercase letters and digits, separated by '.', '_', '__' or dashes";
const TOO_LONG: &str = "the repository name is longer than 255 bytes";

impl Error {
    /// The reference that did not parse, as it was given.
    pub fn input(&self) -> &str {
        match self {
            Error::NoName { input }
            | Error::Digest { input }
            | Error::Tag { input }
            | Error::Host { input }
            | Error::Component { input }
            | Error::TooLong { input } => input,
        }
    }

    /// What is wrong with it, without the input.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::NoName { .. } => NO_NAME,
            Error::Digest { .. } => BAD_DIGEST,
            Error::Tag { .. } => BAD_TAG,
            Error::Host { .. } => BAD_HOST,
            Error::Component { .. } => BAD_COMPONENT,
            Error::TooLong { .. } => TOO_LONG,
        }
    }
}

/// Docker Hub's name in references.
pub const DOCKER_HUB: &str = "docker.io";
/// Where Docker Hub's distribution API is actually served.
pub const DOCKER_HUB_API: &str = "registry-1.docker.io";
/// Longest repository name the distribution spec allows.
pub const MAX_NAME: usize = 255;

/// A parsed, normalised image reference.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    /// Registry host, with its port if one was given (`docker.io` for Docker Hub).
    pub registry: String,
    /// Repository path (`library/alpine`, `team/app`).
    pub repository: String,
    pub tag: Option<String>,
    /// `algorithm:hex`; when present it pins the image whatever the tag says.
    pub digest: Option<String>,
}

fn valid_component(c: &str) -> bool {
    // [a-z0-9]+ ((\.|_|__|-+) [a-z0-9]+)*
    let bytes = c.as_bytes();
    if bytes.is_empty()
        || !bytes[0].is_ascii_alphanumeric()
        || !bytes[bytes.len() - 1].is_ascii_alphanumeric()
    {
        return false;
    }
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_lowercase() || b.is_ascii_digit() {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && matches!(bytes[i], b'.' | b'_' | b'-') {
            i += 1;
        }
        let sep = &c[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|b| b == b'-');
        if sep.is_empty() || !ok {
            return false;
        }
    }
    true
}

fn valid_host(h: &str) -> bool {
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || h.starts_with('[') => (host, Some(port)),
        _ => (h, None),
    };
    if let Some(p) = port {
        if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return false;
        }
    }
    if host.starts_with('[') && host.ends_with(']') {
        return host[1..host.len() - 1]
            .parse::<std::net::Ipv6Addr>()
            .is_ok();
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn valid_tag(t: &str) -> bool {
    let b = t.as_bytes();
    !b.is_empty()
        && b.len() <= 128
        && (b[0].is_ascii_alphanumeric() || b[0] == b'_')
        && b.iter()
            .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-'))
}

fn valid_digest(d: &str) -> bool {
    match d.split_once(':') {
        Some(("sha256", hex)) => {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }
        Some(("sha512", hex)) => {
            hex.len() == 128 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        }
        _ => false,
    }
}

impl Reference {
    /// Parses and normalises a reference (`alpine` → `docker.io/library/alpine:latest`).
    pub fn parse(input: &str) -> Result<Self, Error> {
        let (rest, digest) = match input.split_once('@') {
            Some((r, d)) => {
                if !valid_digest(d) {
                    return Err(Error::Digest {
                        input: input.into(),
                    });
                }
                (r, Some(d.to_string()))
            }
            None => (input, None),
        };
        // A tag follows the last ':' that comes after the last '/' (a ':' before it is a port).
        let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last_slash..].rfind(':') {
            Some(i) => {
                let tag = &rest[last_slash + i + 1..];
                if !valid_tag(tag) {
                    return Err(Error::Tag {
                        input: input.into(),
                    });
                }
                (&rest[..last_slash + i], Some(tag.to_string()))
            }
            None => (rest, None),
        };
        if name.is_empty() {
            return Err(Error::NoName {
                input: input.into(),
            });
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, path))
                if first.contains('.') || first.contains(':') || first == "localhost" =>
            {
                if !valid_host(first) {
                    return Err(Error::Host {
                        input: input.into(),
                    });
                }
                (first.to_string(), path.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        if path.split('/').any(|c| !valid_component(c)) {
            return Err(Error::Component {
                input: input.into(),
            });
        }
        let repository = if registry == DOCKER_HUB && !path.contains('/') {
            format!("library/{path}")
        } else {
            path
        };
        if repository.len() > MAX_NAME {
            return Err(Error::TooLong {
                input: input.into(),
            });
        }
        let tag = match (tag, &digest) {
            (None, None) => Some("latest".to_string()),
            (t, _) => t,
        };
        Ok(Reference {
            registry,
            repository,
            tag,
            digest,
        })
    }

    /// The host serving the distribution API for this reference's registry.
    pub fn api_host(&self) -> &str {
        if self.registry == DOCKER_HUB {
            DOCKER_HUB_API
        } else {
            &self.registry
        }
    }

    /// What to ask the registry for: the digest if pinned, else the tag.
    pub fn object(&self) -> &str {
        self.digest
            .as_deref()
            .or(self.tag.as_deref())
            .unwrap_or("latest")
    }
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for Reference {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reference::parse(s)
    }
}

/// A platform to pick from a multi-platform image: `os/arch[/variant]`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Platform {
    pub os: String,
    pub architecture: String,
    pub variant: Option<String>,
}

impl Platform {
    /// This machine's platform, in OCI's names (`linux/amd64`, `linux/arm64/v8`).
    pub fn host() -> Self {
        let (architecture, variant) = match std::env::consts::ARCH {
            "x86_64" => ("amd64", None),
            "aarch64" => ("arm64", Some("v8")),
            "x86" => ("386", None),
            "powerpc64" => ("ppc64le", None),
            "s390x" => ("s390x", None),
            "riscv64" => ("riscv64", None),
            other => (other, None),
        };
        Platform {
            os: std::env::consts::OS.to_string(),
            architecture: architecture.to_string(),
            variant: variant.map(String::from),
        }
    }

    /// Whether an image built for (`os`, `arch`, `variant`) serves this platform; a
    /// missing variant on either side matches.
    pub fn matches(&self, os: &str, arch: &str, variant: Option<&str>) -> bool {
        self.os == os
            && self.architecture == arch
            && match (&self.variant, variant) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    }
}

// The error is a plain sentence rather than an `Error` variant: callers (clap, the
// agent's daemon) fold it into their own messages as it is.
impl std::str::FromStr for Platform {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let parts: Vec<&str> = s.split('/').collect();
        let ok =
            |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        match parts.as_slice() {
            [os, arch] if ok(os) && ok(arch) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: None,
            }),
            [os, arch, v] if ok(os) && ok(arch) && ok(v) => Ok(Platform {
                os: os.to_string(),
                architecture: arch.to_string(),
                variant: Some(v.to_string()),
            }),
            _ => Err(format!(
                "platform {s:?} is not os/arch[/variant], e.g. linux/amd64"
            )),
        }
    }
}

impl fmt::Display for Platform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.os, self.architecture)?;
        if let Some(v) = &self.variant {
            write!(f, "/{v}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        Reference::parse(s).unwrap().to_string()
    }

    #[test]
    fn docker_hub_short_names_and_library() {
        assert_eq!(norm("alpine"), "docker.io/library/alpine:latest");
        assert_eq!(norm("alpine:3.20"), "docker.io/library/alpine:3.20");
        assert_eq!(norm("team/app"), "docker.io/team/app:latest");
        assert_eq!(norm("docker.io/alpine"), "docker.io/library/alpine:latest");
        let r = Reference::parse("ubuntu").unwrap();
        assert_eq!(r.api_host(), "registry-1.docker.io");
    }

    #[test]
    fn hosts_ports_tags_and_digests() {
        let d = format!("sha256:{}", "a".repeat(64));
        let r = Reference::parse(&format!("127.0.0.1:5000/a/b/c:v1@{d}")).unwrap();
        assert_eq!(r.registry, "127.0.0.1:5000");
        assert_eq!(r.repository, "a/b/c");
        assert_eq!(r.tag.as_deref(), Some("v1"));
        assert_eq!(r.object(), d);
        assert_eq!(r.api_host(), "127.0.0.1:5000");
        let r = Reference::parse(&format!("localhost/app@{d}")).unwrap();
        assert_eq!((r.registry.as_str(), r.tag.as_deref()), ("localhost", None));
        assert_eq!(norm("localhost:5000/app"), "localhost:5000/app:latest");
        assert_eq!(
            norm("registry.example.com/x_y.z__w--v"),
            "registry.example.com/x_y.z__w--v:latest"
        );
        assert_eq!(norm("[::1]:5000/app:t"), "[::1]:5000/app:t");
        // A first component without '.', ':' or "localhost" is a Docker Hub namespace.
        assert_eq!(norm("myhost/app"), "docker.io/myhost/app:latest");
    }

    #[test]
    fn bad_references_say_why() {
        for bad in [
            "",
            "UPPER/case",
            "app:",
            "app:-tag",
            "app@sha256:abc",
            "app@md5:0123",
            "a//b",
            "-app",
            "app_",
            "a...b",
            "bad host:1/app",
            "host:port/app",
        ] {
            let e = Reference::parse(bad).unwrap_err();
            assert_eq!(e.input(), bad);
            assert!(!e.reason().is_empty(), "{bad}");
            assert_eq!(
                e.to_string(),
                format!("invalid image reference {bad:?}: {}", e.reason())
            );
        }
        assert!(matches!(
            Reference::parse(&"a".repeat(256)),
            Err(Error::TooLong { .. })
        ));
    }

    #[test]
    fn each_broken_rule_has_its_variant() {
        let d = format!("sha256:{}", "a".repeat(64));
        for (bad, rule) in [
            (format!("@{d}"), "no name"),
            ("app@sha256:abc".to_string(), "digest"),
            ("app:-tag".to_string(), "tag"),
            ("bad host:1/app".to_string(), "host"),
            ("../../etc/passwd".to_string(), "host"),
            ("UPPER/case".to_string(), "component"),
            ("a".repeat(256), "too long"),
        ] {
            let got = match Reference::parse(&bad) {
                Err(Error::NoName { .. }) => "no name",
                Err(Error::Digest { .. }) => "digest",
                Err(Error::Tag { .. }) => "tag",
                Err(Error::Host { .. }) => "host",
                Err(Error::Component { .. }) => "component",
                Err(Error::TooLong { .. }) => "too long",
                Ok(r) => panic!("{bad:?} parsed as {r}"),
            };
            assert_eq!(got, rule, "{bad:?}");
        }
    }

    #[test]
    fn platforms() {
        let p: Platform = "linux/arm64/v8".parse().unwrap();
        assert_eq!(p.to_string(), "linux/arm64/v8");
        assert!(p.matches("linux", "arm64", None));
        assert!(!p.matches("linux", "arm64", Some("v7")));
        assert!("linux".parse::<Platform>().is_err());
        assert!("linux/amd64/v1/x".parse::<Platform>().is_err());
        assert_eq!(Platform::host().os, "linux");
    }
}
