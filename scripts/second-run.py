#!/usr/bin/env python3
"""What a workload profile (ADAPTALLOC_PROFILE) buys later runs, against PyTorch's allocator.

For each trace in ../shared/traces (where present) and each bundled workload, at 1.5x, 2x and 4x
peak live and at 1.0x, 1.05x and 1.1x passthrough's smallest device, under the default cost
model and vmm-fast.toml: a first run of the default policy writes a profile (`adaptalloc replay
--profile`), a second run of ten passes reads and updates it, and a third reads that. Warm-up and
steady state are the yardstick's: replays of 5 and 10 passes from the same profile, steady =
(t10 - t5) / 5 a pass, warm-up = t5 - 5 x steady. Prints a Markdown table of sums and every
workload where a later run's warm-up is over 1.5x PyTorch's (from 1.5x peak live), its steady
state over the first run's (and PyTorch's) + 0.5 ms, or where it failed requests. About 10 minutes
here.

    scripts/second-run.py [--out FILE]
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = ROOT / "target/release/adaptalloc"
LINE = re.compile(r": (\d+) failed allocations, .* modelled driver time ([\d.]+) ms")


def replay(trace, cap, repeat, model, extra):
    out = subprocess.run(
        [str(BIN), "replay", str(trace), *cap, "--repeat", str(repeat), "--cost-model", model, *extra],
        check=True, capture_output=True, text=True, cwd=ROOT,
    ).stdout
    m = LINE.search(out.splitlines()[0])
    if not m:
        sys.exit(f"cannot read replay's first line: {out.splitlines()[0]}")
    return int(m.group(1)), float(m.group(2))


def yardstick(trace, cap, model, extra, profile=None):
    """Failed allocations (10 passes), warm-up ms and steady ms a pass."""
    runs = []
    for repeat in (5, 10):
        args = list(extra)
        if profile is not None:
            copy = profile.with_suffix(f".{repeat}.toml")
            shutil.copy(profile, copy)
            args += ["--profile", str(copy)]
        runs.append(replay(trace, cap, repeat, model, args))
    (_, t5), (failed, t10) = runs
    steady = (t10 - t5) / 5
    return failed, t5 - 5 * steady, steady


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="also write the Markdown here")
    args = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "-p", "adaptalloc-cli"], check=True, cwd=ROOT)
    work = Path(tempfile.mkdtemp())
    traces = sorted((ROOT / "../shared/traces").glob("*.csv")) if (ROOT / "../shared/traces").is_dir() else []
    for w in ("training", "serving", "phase-change", "small-churn"):
        subprocess.run([str(BIN), "synth", w, "--out", str(work / f"{w}.csv")], check=True, capture_output=True)
        traces.append(work / f"{w}.csv")
    mins = {}
    for t in traces:
        out = subprocess.run([str(BIN), "sweep", str(t), "--strategies", "passthrough", "--format", "json"],
                             check=True, capture_output=True, text=True).stdout
        mins[t] = int(re.search(r'"bytes": (\d+)', out).group(1))
    caps = [(f"{k}x min", lambda t, k=k: ["--capacity", str(int(mins[t] * k))]) for k in (1.0, 1.05, 1.1)]
    caps += [(f"{k}x", lambda t, k=k: ["--capacity-factor", str(k)]) for k in (1.5, 2, 4)]
    lines = ["| cost model | capacity | workloads | warm-up: PyTorch / first run / second / third | steady a pass: "
             "PyTorch / first / second / third | failed: first / second / third / PyTorch |",
             "|---|---|---|---|---|---|"]
    notes = []
    for model in ("tuning/cost-models/default.toml", "tuning/cost-models/vmm-fast.toml"):
        name = Path(model).stem
        for label, cap in caps:
            sums = [0.0] * 8
            fails = [0, 0, 0, 0]
            n = 0
            for t in traces:
                prof = work / "p.toml"
                prof.unlink(missing_ok=True)
                replay(t, cap(t), 1, model, ["--profile", str(prof)])  # the first run writes it
                f1, w1, s1 = yardstick(t, cap(t), model, [])
                f2, w2, s2 = yardstick(t, cap(t), model, [], profile=prof)
                replay(t, cap(t), 10, model, ["--profile", str(prof)])  # the second run updates it
                f3, w3, s3 = yardstick(t, cap(t), model, [], profile=prof)
                fp, wp, sp = yardstick(t, cap(t), model, ["--strategy", "pytorch"])
                fails = [a + (f > 0) for a, f in zip(fails, (f1, f2, f3, fp))]
                for run, f in (("second", f2), ("third", f3)):
                    if f > 0:
                        notes.append(f"- {name}, {label}, {t.name}: {run} run failed {f} requests")
                if fp > 0 or f1 > 0 or f2 > 0 or f3 > 0:
                    continue
                n += 1
                for i, v in enumerate((wp, w1, w2, w3, sp, s1, s2, s3)):
                    sums[i] += v
                if not label.endswith("min") and max(w2, w3) > 1.5 * wp:
                    notes.append(f"- {name}, {label}, {t.name}: warm-up of the second / third run {w2:.1f} / "
                                 f"{w3:.1f} ms, PyTorch's {wp:.1f} (first run {w1:.1f})")
                for run, st in (("second", s2), ("third", s3)):
                    if st > max(s1, sp) + 0.5:
                        notes.append(f"- {name}, {label}, {t.name}: {run} run's steady state {st:.2f} ms a pass, "
                                     f"the first run's {s1:.2f}, PyTorch's {sp:.2f}")
            lines.append(f"| {name} | {label} | {n} | {sums[0]:.1f} / {sums[1]:.1f} / {sums[2]:.1f} / {sums[3]:.1f} ms "
                         f"| {sums[4]:.2f} / {sums[5]:.2f} / {sums[6]:.2f} / {sums[7]:.2f} ms "
                         f"| {' / '.join(map(str, fails))} |")
            print(lines[-1], flush=True)
    head = [
        "# Workload profiles: what later runs of a workload cost",
        "",
        "`scripts/second-run.py`: each of the 13 traces in ../shared/traces and the 4 bundled workloads, "
        "on SimDevice. A first run of the default policy writes a profile (`adaptalloc replay --profile`, "
        "what `ADAPTALLOC_PROFILE` does for a live run); a second run of ten passes reads and updates it; "
        "a third reads that. Warm-up and steady state as issue 24 measures them: replays of 5 and 10 "
        "passes, steady = (t10 - t5) / 5 a pass, warm-up = t5 - 5 x steady (negative where later passes "
        "cost more than the first five). Sums over the workloads where every run and PyTorch's allocator "
        "completed; failures count workloads with any failed request over ten passes.",
        "",
    ]
    text = "\n".join(head + lines) + "\n\n" + ("\n".join(notes) if notes else "- nothing over the targets, nothing failed") + "\n"
    print()
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    shutil.rmtree(work)


if __name__ == "__main__":
    main()
