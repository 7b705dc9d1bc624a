//! Talking to OCI registries: image references today; the distribution API client
//! (manifests, blobs, Range reads, pushes, auth) arrives with the convert issue.

pub mod reference;
