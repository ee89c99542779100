#!/usr/bin/env bash
# On a machine with an NVIDIA GPU, PyTorch and no network: builds the cdylib, runs the same
# PyTorch training loop (a small Transformer, varying batch shapes) with PyTorch's own caching
# allocator and with adaptalloc, and prints time per step, peak reserved and peak allocated for
# both, then adaptalloc's tuning report. Also runs the CUDA tests, the cudarc example and
# python/gpu_hooks_check.py (PyTorch's hooks and CUDA graphs).
#
#   scripts/gpu-check.sh [STEPS]        (default 300)
set -euo pipefail
cd "$(dirname "$0")/.."
steps=${1:-300}
out=${OUT:-out/gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
cargo build --release -p adaptalloc-capi
cargo test --release --test cuda -- --nocapture 2>&1 | tee "$out/cuda-tests.txt"
cargo run --release --example cudarc_slice 2>&1 | tee "$out/cudarc-example.txt"
python3 python/example_torch.py --steps "$steps" --native 2>&1 | tee "$out/native.txt"
ADAPTALLOC_REPORT="$out/report.md" python3 python/example_torch.py --steps "$steps" 2>&1 | tee "$out/adaptalloc.txt"
# PyTorch's hooks on a GPU: record_stream, a CUDA graph, torch.compile's reduce-overhead,
# empty_cache, the memory fraction, and the MemPool route's OutOfMemoryError.
# The package without pip (no network here): the extension built by cargo, beside its Python files.
cargo build --release -p adaptalloc-python
pkg="$(mktemp -d)"
cp -r python/adaptalloc "$pkg/"
cp target/release/lib_native.so "$pkg/adaptalloc/_native.abi3.so"
PYTHONPATH="$pkg" python3 python/gpu_hooks_check.py 2>&1 | tee "$out/hooks.txt" || true
echo
cat "$out/native.txt" "$out/adaptalloc.txt"
echo
cat "$out/report.md"
