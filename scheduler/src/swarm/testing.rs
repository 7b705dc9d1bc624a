//! Fixtures shared by the swarm's unit tests: hosts, one blob, lookups, announcements.

use std::collections::BTreeMap;
use std::time::Instant;

use tessera_proto::domain::{Announce, BlobDigest, BlobRanges, ByteRange, FindPeers, Host, HostId};

use super::Swarm;

pub(super) fn host(id: &str, zone: &str) -> Host {
    Host {
        id: HostId(id.into()),
        address: format!("10.0.0.{}:7070", id.len()).parse().unwrap(),
        labels: BTreeMap::from([("zone".to_string(), zone.to_string())]),
        upload_limit_bps: None,
        max_uploads: 4,
    }
}

pub(super) fn blob() -> BlobDigest {
    BlobDigest(format!("sha256:{}", "a".repeat(64)))
}

pub(super) fn find(id: &str, start: u64, end: u64) -> FindPeers {
    FindPeers {
        host: HostId(id.into()),
        blob: blob(),
        range: ByteRange { start, end },
    }
}

pub(super) fn announce(s: &mut Swarm, id: &str, start: u64, end: u64, now: Instant) {
    s.announce(
        Announce {
            host: HostId(id.into()),
            held: vec![BlobRanges {
                blob: blob(),
                ranges: vec![ByteRange { start, end }],
                size: None,
            }],
            dropped: vec![],
            full: false,
            images: vec![],
        },
        now,
    )
    .unwrap();
}
