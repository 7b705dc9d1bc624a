//! Shared helpers for Tessera's benchmarks.
