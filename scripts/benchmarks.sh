#!/usr/bin/env bash
# Regenerates BENCHMARKS.md: runs the criterion benches (ours and peers in one run), then the
# compare and sweep tables over ../shared/traces and the bundled workloads. About 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo bench --features peers --bench peers -- --warm-up-time 1 --measurement-time 3
cargo run --release --features peers --example benchmarks_md > BENCHMARKS.md
echo "wrote BENCHMARKS.md"
