#!/usr/bin/env bash
# Regenerates every report under tuning/reports that SimDevice produces, each with the command
# its own header names, so that none is left from an older build (steady-nvidia-h200.md once
# stayed a GPU lease old: it said 309 ms a pass at 1.5x where the allocator then paid 0.46).
#
#   scripts/reports.sh          rewrite the reports in place (about 10 minutes here)
#   scripts/reports.sh --check  write them to a scratch folder and list the ones that differ
#                               from the checkout's (exit status 1 if any does)
#
# Not here: BENCHMARKS.md (scripts/benchmarks.sh, with timed benches: run it alone),
# hotpath.md (scripts/hotpath.sh, callgrind), and the reports measured on a GPU
# (gpu-*.md, written by `adaptalloc gpu-bench` and scripts/gpu-run.sh on the machine).
# Needs ../shared/traces beside the checkout; without it the reports would hold only the
# bundled workloads, so the script stops.
set -euo pipefail
cd "$(dirname "$0")/.."

check=false
case "${1:-}" in
    "") ;;
    --check) check=true ;;
    *) echo "usage: scripts/reports.sh [--check]" >&2; exit 2 ;;
esac
if [ ! -d ../shared/traces ]; then
    echo "scripts/reports.sh: ../shared/traces is absent; the reports are made from those traces" >&2
    exit 2
fi

out=tuning/reports
if $check; then
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
fi

cargo build --release -q --examples
cargo build --release -q --features peers --example peers_md
ex=target/release/examples
run() { # NAME COMMAND...: one report
    local name=$1
    shift
    echo "$name" >&2
    "$@" > "$out/$name"
}
run steady.md "$ex/steady_eval"
run steady-nvidia-h200.md "$ex/steady_eval" --cost-model tuning/cost-models/nvidia-h200.toml
run robustness.md "$ex/robustness"
run tenants.md "$ex/tenant_eval"
run policy-eval.md "$ex/policy_eval"
run peers.md "$ex/peers_md"
echo profile.md >&2
python3 scripts/second-run.py --out "$out/profile.md" > /dev/null

if $check; then
    stale=0
    for f in "$out"/*.md; do
        name=$(basename "$f")
        if ! cmp -s "$f" "tuning/reports/$name"; then
            echo "stale: tuning/reports/$name (scripts/reports.sh rewrites it)"
            stale=1
        fi
    done
    [ "$stale" = 0 ] && echo "every report matches this build"
    exit "$stale"
fi
echo "wrote steady.md, steady-nvidia-h200.md, robustness.md, tenants.md, policy-eval.md, peers.md, profile.md"
