//! Compiles the protocols with protox (a protobuf compiler written in Rust), so a fresh
//! machine builds with cargo alone: no protoc to install.
//!
//! - `proto/tessera/v1/tessera.proto`: Tessera's own (agent ↔ scheduler, agent ↔ agent).
//! - containerd's snapshots service (`third_party/`, pinned, see its README): the agent
//!   serves it as a proxy snapshotter.
//! - the Kubernetes CRI API (`third_party/k8s.io/cri-api`): the agent's CRI image-service
//!   proxy serves its image service and calls containerd's; the tests and benchmarks
//!   pull images through it as the kubelet does.
//! - containerd's content, images and leases services (clients only): `tessera pull`
//!   writes an image into containerd as its unpacker would; its containers and tasks
//!   services and runc's task options (clients only): `tessera checkpoint --container`
//!   and `tessera run` checkpoint and restore containers through containerd.
//!
//! containerd's files and CRI's import gogo.proto under two names, so each set is
//! compiled on its own (one descriptor set cannot hold the same extensions twice).

type Result = std::result::Result<(), Box<dyn std::error::Error>>;

fn compile(protos: &[&str], includes: &[&str], server: bool, comments: bool) -> Result {
    for proto in protos {
        println!("cargo:rerun-if-changed={}", find(proto, includes));
    }
    let mut descriptors = protox::compile(protos, includes)?;
    if !comments {
        // Other projects' comments would become docs that rustdoc compiles as examples
        // (containerd's indent prose); their meaning is in the vendored files.
        for file in &mut descriptors.file {
            file.source_code_info = None;
        }
    }
    tonic_build::configure()
        .build_client(true)
        .build_server(server)
        .compile_fds(descriptors)?;
    Ok(())
}

/// Where `proto` is found among `includes` (for cargo's change tracking).
fn find(proto: &str, includes: &[&str]) -> String {
    includes
        .iter()
        .map(|i| format!("{i}/{proto}"))
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| proto.to_string())
}

fn main() -> Result {
    compile(&["tessera/v1/tessera.proto"], &["proto"], true, true)?;
    compile(
        &["github.com/containerd/containerd/api/services/snapshots/v1/snapshots.proto"],
        &["third_party"],
        true,
        false,
    )?;
    // Clients only. prost writes one file per package, so this set names
    // `types/mount.proto` too: its `containerd.types` (mount and descriptor) replaces the
    // one the set above wrote (mount alone).
    compile(
        &[
            "github.com/containerd/containerd/api/services/content/v1/content.proto",
            "github.com/containerd/containerd/api/services/images/v1/images.proto",
            "github.com/containerd/containerd/api/services/leases/v1/leases.proto",
            "github.com/containerd/containerd/api/services/containers/v1/containers.proto",
            "github.com/containerd/containerd/api/services/tasks/v1/tasks.proto",
            "github.com/containerd/containerd/runtime/v2/runc/options/oci.proto",
            "github.com/containerd/containerd/api/types/mount.proto",
        ],
        &["third_party"],
        false,
        false,
    )?;
    compile(
        &["k8s.io/cri-api/pkg/apis/runtime/v1/api.proto"],
        &["third_party"],
        true,
        false,
    )?;
    Ok(())
}
