#!/usr/bin/env bash
# Runs every agent fuzz target for FUZZ_SECONDS (default 120) each, from the seeds.
# Needs the nightly toolchain and cargo-fuzz (installed here if missing).
set -euo pipefail
cd "$(dirname "$0")"
seconds=${FUZZ_SECONDS:-120}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
rustup toolchain list | grep -q nightly || rustup toolchain install nightly
for target in challenge manifest image_config docker_config wire_message criu_pagemap; do
  mkdir -p "corpus/$target"
  cargo +nightly fuzz run "$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10
done
