#!/usr/bin/env bash
# Instructions per operation on the allocator's hot paths, as Markdown on stdout (kept in
# tuning/reports/hotpath.md): callgrind counts of examples/hotpath at 200,000 and 100,000
# operations, the difference divided by 100,000, so that start-up (building the simulated
# device, the first slabs) cancels out. Counts repeat exactly from run to run, unlike timings on
# a shared machine. Issue 24's bar: within 3% of 728 (pair), 1,302 (suballoc churn) and 1,711
# (adaptive churn). About a minute.
#
#   scripts/hotpath.sh > tuning/reports/hotpath.md
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v valgrind >/dev/null; then
    echo "scripts/hotpath.sh: valgrind not found (install valgrind to count instructions)" >&2
    exit 1
fi
cargo build --release --example hotpath >&2
bin=target/release/examples/hotpath

# Instructions callgrind counts for one run of `hotpath WORKLOAD N`.
count() {
    valgrind --tool=callgrind --callgrind-out-file=/dev/null "$bin" "$1" "$2" 2>&1 |
        awk '/Collected/ { print $4 }'
}

echo "# Hot path: instructions per operation"
echo
echo "\`scripts/hotpath.sh\` at $(git rev-parse --short HEAD 2>/dev/null || echo 'an unknown commit'):"
echo "callgrind, \`examples/hotpath\` at 200,000 operations less 100,000, per operation."
echo
echo "| workload | instructions per operation | issue 24's bar (+3%) | within |"
echo "|---|---|---|---|"
for row in "pair 728" "churn 1302" "churn-adaptive 1711"; do
    set -- $row
    small=$(count "$1" 100000)
    large=$(count "$1" 200000)
    if [ -z "$small" ] || [ -z "$large" ]; then
        echo "scripts/hotpath.sh: no callgrind count for $1" >&2
        exit 1
    fi
    awk -v w="$1" -v a="$small" -v b="$large" -v bar="$2" 'BEGIN {
        per = (b - a) / 100000; lim = bar * 1.03
        printf "| %s | %.1f | %d (%.0f) | %s |\n", w, per, bar, lim, (per <= lim ? "yes" : "no")
    }'
done
