#!/usr/bin/env bash
# Builds everything the GPU checks run, on a machine with a Rust toolchain, for a GPU machine
# without one (x86-64 Linux, the NVIDIA driver, and for the PyTorch checks python3 with torch):
# the `adaptalloc` binary (with the peers), the CUDA integration tests, the cudarc example, the
# C ABI library and the Python extension, stripped, into DIR/bin. With --traces, also the
# allocation traces of ../shared/traces (CSV), into DIR/traces, for a machine that cannot see
# them. Then, on the GPU machine, from a checkout of the same commit:
#
#   scripts/gpu-stage.sh DIR [--traces]          (here)
#   scripts/gpu-run.sh DIR [OUT] [SECONDS]       (there)
#
# DIR is relative to the repository root and must be a folder git ignores (out/ is): traces are
# never committed.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu-stage.sh DIR [--traces]}
mkdir -p "$dir/bin"
cargo build --release -p adaptalloc-cli --features peers --bin adaptalloc
cargo build --release --example cudarc_slice
cargo build --release -p adaptalloc-capi -p adaptalloc-python
tests=$(cargo test --release --test cuda --no-run --message-format=json 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cuda" and m.get("executable"):
        print(m["executable"])')
[ -n "$tests" ] || { echo "gpu-stage: the cuda test binary was not built" >&2; exit 1; }
cp target/release/adaptalloc "$dir/bin/adaptalloc"
cp "$tests" "$dir/bin/cuda-tests"
cp target/release/examples/cudarc_slice "$dir/bin/cudarc_slice"
cp target/release/libadaptalloc.so "$dir/bin/libadaptalloc.so"
cp target/release/lib_native.so "$dir/bin/_native.abi3.so"
strip "$dir"/bin/*
if [ "${2:-}" = "--traces" ] && [ -d ../shared/traces ]; then
    mkdir -p "$dir/traces"
    cp ../shared/traces/*.csv "$dir/traces/"
fi
git describe --always --dirty >"$dir/commit"
du -sh "$dir"
