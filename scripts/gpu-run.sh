#!/usr/bin/env bash
# On a GPU machine with no Rust toolchain: runs the GPU checks from binaries that
# scripts/gpu-stage.sh built elsewhere (see there), most valuable first, each under a time limit,
# the whole within SECONDS (default 420). Writes into OUT (default out/gpu-run):
#   log.txt              every step's output, then a line per step (exit status, seconds)
#   <gpu>.toml           the calibrated cost model (cuMemAlloc/cuMemFree by size, every
#                        virtual-memory call on handles of 2 MiB to 1 GiB, the stream-ordered pool)
#   gpu-bench.md         the bundled workloads replayed through the driver by every allocator
#   gpu-bench-traces.md  the same for DIR/traces/*.csv, as far as the time allowed
#   step-ab.md           the training loop under PyTorch's allocator and adaptalloc, in pairs
#   trace-replay.md      DIR/traces/*.csv through PyTorch's allocators and adaptalloc: first pass,
#                        later passes, physical allocations and frees (and trace-replay.json)
#   report.md            adaptalloc's tuning report after its last training loop
#   profile-run1.md,     the training loop run twice with one workload profile
#   profile-run2.md      (ADAPTALLOC_PROFILE=profile.toml): each run's tuning report, the
#                        second given the peak the first wrote (driver time by kind in each)
#
#   scripts/gpu-run.sh DIR [OUT] [SECONDS]
set -uo pipefail
cd "$(dirname "$0")/.."
dir=${1:?usage: scripts/gpu-run.sh DIR [OUT] [SECONDS]}
out=${2:-out/gpu-run}
budget=${3:-420}
bin="$dir/bin"
mkdir -p "$out"
log="$out/log.txt"
: >"$log"
deadline=$((SECONDS + budget))
summary=""

# step NAME CAP COMMAND...: runs COMMAND for at most CAP seconds (less if the deadline is nearer).
step() {
    local name=$1 cap=$2
    shift 2
    local left=$((deadline - SECONDS - 5))
    if [ "$left" -lt 10 ]; then
        summary+="$(printf '%-28s %s' "$name" "not run: out of time")"$'\n'
        return
    fi
    [ "$cap" -gt "$left" ] && cap=$left
    echo "=== $name (at most ${cap}s)" | tee -a "$log"
    local t0=$SECONDS
    timeout --kill-after=5 "$cap" "$@" 2>&1 | tee -a "$log"
    local rc=${PIPESTATUS[0]}
    summary+="$(printf '%-28s rc=%-4s %4ss' "$name" "$rc" "$((SECONDS - t0))")"$'\n'
}

step gpu 10 nvidia-smi --query-gpu=name,memory.total,memory.used,driver_version,clocks.sm,clocks.mem --format=csv
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr '[:upper:]' '[:lower:]' |
    sed 's/[^a-z0-9]\+/-/g; s/^-//; s/-$//')
step "gpu-bench calibrate+bundled" 150 "$bin/adaptalloc" gpu-bench --cost-model "$out/${gpu:-gpu}.toml" \
    --results "$out/gpu-bench.md"
step "cuda tests" 90 "$bin/cuda-tests" --test-threads=1 --nocapture \
    --skip release_after_a_free_with_queued_work_does_not_fault_on_a_gpu
# In a process of its own: a fault there would end every later test.
step "cuda unmap after queued work" 60 "$bin/cuda-tests" --nocapture --exact \
    release_after_a_free_with_queued_work_does_not_fault_on_a_gpu
step "cudarc example" 30 "$bin/cudarc_slice"
if python3 -c 'import torch; assert torch.cuda.is_available()' 2>/dev/null; then
    # example_torch.py loads the C ABI from target/release, as after a cargo build.
    mkdir -p target/release
    cp "$bin/libadaptalloc.so" target/release/libadaptalloc.so
    # The training loop under both allocators, alternating processes (python/gpu_step_ab.py).
    step "torch training A/B" 300 env ADAPTALLOC_REPORT="$out/report.md" \
        python3 python/gpu_step_ab.py --pairs 6 --steps 300 --out "$out/step-ab.md"
    # A workload profile: the first run writes the peak it showed, the second is given it.
    rm -f "$out/profile.toml"
    for run in 1 2; do
        step "torch profile run $run" 60 env ADAPTALLOC_PROFILE="$out/profile.toml" \
            ADAPTALLOC_REPORT="$out/profile-run$run.md" python3 python/example_torch.py --steps 50
    done
    pkg=$(mktemp -d)
    cp -r python/adaptalloc "$pkg/"
    cp "$bin/_native.abi3.so" "$pkg/adaptalloc/_native.abi3.so"
    step "torch hooks" 180 env PYTHONPATH="$pkg" python3 python/gpu_hooks_check.py
    if ls "$dir"/traces/*.csv >/dev/null 2>&1; then
        # Issue 24's yardstick measured: each trace through PyTorch's allocators and adaptalloc,
        # first pass and later passes (python/gpu_trace_replay.py), smallest first.
        step "torch trace replay" 300 env PYTHONPATH="$pkg" python3 python/gpu_trace_replay.py \
            $(ls -Sr "$dir"/traces/*.csv) --passes 5 --seconds 270 --timeout 50 \
            --out "$out/trace-replay.md" --json "$out/trace-replay.json"
    fi
else
    summary+="torch checks                 not run: no python3 with torch and a GPU"$'\n'
fi
if ls "$dir"/traces/*.csv >/dev/null 2>&1; then
    # Smallest first: a run that runs out of time keeps the most traces (rows are written after each).
    mapfile -t traces < <(ls -Sr "$dir"/traces/*.csv)
    step "gpu-bench traces" 600 "$bin/adaptalloc" gpu-bench --cost-model "$out/${gpu:-gpu}-again.toml" \
        --results "$out/gpu-bench-traces.md" "${traces[@]}"
fi
echo | tee -a "$log"
printf '%s' "$summary" | tee -a "$log"
