//! One module per group of subcommands, and the flag parsers several groups share
//! (here, so that no group depends on another for them).

pub mod agent;
pub mod checkpoint;
pub mod containerd;
pub mod convert;
pub mod image;
pub mod index;
pub mod pull;
pub mod registry;

/// Parses `4096`, `64K`, `1M`, `1MiB`, `16m` into a size that fits a u32 (chunk and
/// upload sizes); the units are the agent config's.
pub fn parse_size(s: &str) -> Result<u32, String> {
    let n = tessera_agent::config::parse_size(s)?;
    u32::try_from(n).map_err(|_| format!("{s:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("1MiB"), Ok(1 << 20));
        assert!(parse_size("5G").is_err());
        assert!(parse_size("x").is_err());
    }
}
