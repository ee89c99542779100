#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, a Rust toolchain and no network: builds the GPU checks
# (scripts/gpu-stage.sh, into out/gpu-stage, with ../shared/traces where present) and runs them
# (scripts/gpu-run.sh): the CUDA tests (the unmap test in a process of its own), the cudarc
# example, the same PyTorch training loop under PyTorch's allocator and under adaptalloc (time
# per step, peak reserved and allocated, adaptalloc's tuning report), PyTorch's hooks
# (python/gpu_hooks_check.py) and gpu-bench. One list of steps for both routes: where the GPU
# machine has no Rust, run the two scripts on either side instead.
#
#   scripts/gpu-check.sh [SECONDS]      (default 3600; results in $OUT or out/gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/gpu-stage.sh out/gpu-stage --traces
scripts/gpu-run.sh out/gpu-stage "${OUT:-out/gpu-check}" "${1:-3600}"
