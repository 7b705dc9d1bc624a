//! Compiles `proto/tessera/v1/tessera.proto` with protox (a protobuf compiler written
//! in Rust), so a fresh machine builds with cargo alone: no protoc to install.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "proto/tessera/v1/tessera.proto";
    println!("cargo:rerun-if-changed={proto}");
    let descriptors = protox::compile([proto], ["proto"])?;
    tonic_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    Ok(())
}
