#!/usr/bin/env bash
# Runs every fuzz target for FUZZ_SECONDS (default 300) each, from the seed corpus.
# Needs the nightly toolchain and cargo-fuzz (installed here if missing).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-300}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
rustup toolchain list | grep -q nightly || rustup toolchain install nightly
[ -d corpus ] || ./seed.sh
export TMPDIR=${TMPDIR:-/dev/shm}
cargo +nightly fuzz run bootstrap corpus/bootstrap -- \
  -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10
for target in layer layer_roundtrip; do
  mkdir -p "corpus/$target"
  cargo +nightly fuzz run "$target" "corpus/$target" corpus/layer -- -dict=layer.dict \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=20
done
mkdir -p corpus/gzip
cargo +nightly fuzz run gzip corpus/gzip seeds/gzip -- \
  -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10
