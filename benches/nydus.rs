//! How the benchmarks build a Nydus image beside Tessera's, in one place: RAFS v6 from a
//! directory, zstd (its level 3, as Tessera's default), 1 MiB chunks (as Tessera's). Included with `#[path]` by the
//! benchmarks of both packages; `read.sh` and `convert.sh` spell the same options.

/// `nydus-image create` options every side-by-side build uses (after `create`).
pub const NYDUS_CREATE_OPTIONS: [&str; 8] = [
    "--type",
    "dir-rafs",
    "--fs-version",
    "6",
    "--compressor",
    "zstd",
    "--chunk-size",
    // Read as hexadecimal: 1 MiB.
    "0x100000",
];
