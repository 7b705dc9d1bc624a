//! Tessera's wire protocols: agent ↔ scheduler and agent ↔ agent
//! (`proto/tessera/v1/tessera.proto`, compiled at build time by protox + tonic-build).
//!
//! [`pb`] holds the generated messages and services. [`domain`] holds the checked types
//! the scheduler and agents work with: each is made from its message with `TryFrom` on
//! the receiving side, and a bad message is an [`Invalid`] naming the field, which
//! becomes `invalid_argument` at the gRPC boundary. [`ranges`] is the arithmetic on
//! sets of byte ranges (merge, cover, subtract) that both sides of announcements use.

pub mod auth;
pub mod domain;
pub mod listen;
pub mod ranges;
pub mod tls;

/// Generated from `tessera.proto`.
#[allow(clippy::all, missing_debug_implementations, unused_qualifications)]
pub mod pb {
    tonic::include_proto!("tessera.v1");
}

/// containerd's snapshots service and the mount type it answers with (containerd
/// v1.6.20's `.proto` files in `third_party/`), served by the agent's snapshotter; its
/// content, images and leases services (clients only), through which `tessera pull`
/// writes an image into containerd.
#[allow(clippy::all, missing_debug_implementations, unused_qualifications)]
pub mod containerd {
    pub mod types {
        tonic::include_proto!("containerd.types");
    }
    // Nested as the packages are: the generated code names `super::super::…::types`.
    pub mod services {
        pub mod snapshots {
            pub mod v1 {
                tonic::include_proto!("containerd.services.snapshots.v1");
            }
        }
        pub mod content {
            pub mod v1 {
                tonic::include_proto!("containerd.services.content.v1");
            }
        }
        pub mod images {
            pub mod v1 {
                tonic::include_proto!("containerd.services.images.v1");
            }
        }
        pub mod leases {
            pub mod v1 {
                tonic::include_proto!("containerd.services.leases.v1");
            }
        }
        pub mod containers {
            pub mod v1 {
                tonic::include_proto!("containerd.services.containers.v1");
            }
        }
        pub mod tasks {
            pub mod v1 {
                tonic::include_proto!("containerd.services.tasks.v1");
            }
        }
    }
    /// `containerd.v1.types`: a task's status and process info (for the tasks service).
    pub mod v1 {
        pub mod types {
            tonic::include_proto!("containerd.v1.types");
        }
    }
    /// runc's task options (`containerd.runc.v1`): where CRIU's images go on a
    /// checkpoint and come from on a restore.
    pub mod runc {
        pub mod v1 {
            tonic::include_proto!("containerd.runc.v1");
        }
    }
    pub use services::containers::v1 as containers;
    pub use services::content::v1 as content;
    pub use services::images::v1 as images;
    pub use services::leases::v1 as leases;
    pub use services::snapshots::v1 as snapshots;
    pub use services::tasks::v1 as tasks;
}

/// The Kubernetes CRI API (`runtime.v1`, k8s.io/cri-api v0.27.1): the agent's CRI
/// image-service proxy serves its image service in front of containerd's; tests and
/// benchmarks act as the kubelet does with its client.
#[allow(clippy::all, missing_debug_implementations, unused_qualifications)]
pub mod cri {
    tonic::include_proto!("runtime.v1");
}

pub use domain::Invalid;
