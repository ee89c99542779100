#!/usr/bin/env bash
# On a machine with an NVIDIA GPU and no network: builds, calibrates the cost model (cuMemAlloc /
# cuMemFree over 512 B .. 4 GiB, and cuMemAllocAsync / cuMemFreeAsync on the default pool with
# its release threshold at the maximum) into tuning/cost-models/<gpu-name>.toml, then replays
# ../shared/traces (when present) and the bundled workloads through CudaDevice with every
# strategy, gpu-alloc, and CUDA's stream-ordered pool, timing every event. Writes
# tuning/reports/gpu-bench-<gpu-name>.md (also printed).
#
#   scripts/gpu-bench.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
cargo build --release --features peers
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr '[:upper:]' '[:lower:]' | sed 's/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
traces=()
if [ -d ../shared/traces ]; then
    while IFS= read -r f; do traces+=("$f"); done < <(ls ../shared/traces/*.csv 2>/dev/null)
fi
# The bundled workloads come in when no trace is named; with traces, run both sets.
target/release/adaptalloc gpu-bench "$@" --results "tuning/reports/gpu-bench-$gpu.md"
if [ ${#traces[@]} -gt 0 ]; then
    target/release/adaptalloc gpu-bench "$@" --cost-model "out/gpu-bench/$gpu-again.toml" \
        --results "tuning/reports/gpu-bench-$gpu-traces.md" "${traces[@]}"
fi
echo "cost model: tuning/cost-models/$gpu.toml"
