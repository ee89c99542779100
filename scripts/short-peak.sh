#!/usr/bin/env bash
# What a peak given short costs under `suballoc.backing = "auto"` (or BACKING): for each trace in
# ../shared/traces (where present) and each bundled workload, the peak footprint a default run
# at 2x peak live reports, given at FACTOR times itself with "auto", replayed over two passes
# at each capacity (a multiple of passthrough's smallest device). Prints the workloads that
# failed any request, with their failed allocations and modelled driver time. About 10 s a
# capacity and factor here.
#
#   [BACKING=pages] scripts/short-peak.sh [FACTOR...]   (default 0.5 0.75 0.9; capacities 1.0 1.05 1.1 1.2)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p adaptalloc-cli
bin=target/release/adaptalloc
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
traces=()
if [ -d ../shared/traces ]; then
    traces+=(../shared/traces/*.csv)
fi
for w in training serving phase-change small-churn; do
    "$bin" synth "$w" --out "$work/$w.csv"
    traces+=("$work/$w.csv")
done
factors=("$@")
[ ${#factors[@]} -gt 0 ] || factors=(0.5 0.75 0.9)
declare -A peak min
for t in "${traces[@]}"; do
    "$bin" replay "$t" --capacity-factor 2 --repeat 2 --report "$work/r.json" > /dev/null
    peak[$t]=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['memory']['peak_footprint_bytes'])" "$work/r.json")
    min[$t]=$("$bin" sweep "$t" --strategies passthrough --format json |
        python3 -c "import json,sys; print(json.load(sys.stdin)['traces'][0]['min_capacity'][0]['bytes'])")
done
for k in 1.0 1.05 1.1 1.2; do
    for g in "${factors[@]}"; do
        failed=()
        for t in "${traces[@]}"; do
            given=$(python3 -c "print(int(${peak[$t]} * $g))")
            capacity=$(python3 -c "print(int(${min[$t]} * $k))")
            printf '[bounds]\nexpected_peak = %s\n[suballoc]\nbacking = "%s"\n' "$given" "${BACKING:-auto}" > "$work/p.toml"
            line=$("$bin" replay "$t" --capacity "$capacity" --repeat 2 --policy "$work/p.toml" | head -1)
            n=$(sed -E 's/.* ([0-9]+) failed allocations.*/\1/' <<< "$line")
            if [ "$n" != 0 ]; then
                ms=$(sed -E 's/.*modelled driver time ([0-9.]+) ms.*/\1/' <<< "$line")
                failed+=("$(basename "$t") $n failed, $ms ms")
            fi
        done
        echo "capacity ${k}x passthrough's minimum, peak given at ${g}x: ${#failed[@]} of ${#traces[@]} failed$(printf '; %s' "${failed[@]+"${failed[@]}"}")"
    done
done
