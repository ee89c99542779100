"""PyTorch's allocator against adaptalloc on a real GPU: the training loop of example_torch.py in
alternating processes (an allocator is chosen once per process), and torch.empty + del pairs.

    python3 python/gpu_step_ab.py [--pairs K] [--steps N] [--out FILE.md]

Each pair runs both allocators, in alternating order (native first in even pairs), so that a
drift of the machine during the run falls on both. Reports each run's time per step, the host
time to queue a step's work, and the driver allocations and frees after the first tenth of the
steps, and the peak reserved; then the mean paired difference with its 95% confidence interval
(Student's t over the pairs). Needs libadaptalloc.so in target/release (a cargo build, or scripts/gpu-run.sh).
"""
import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
# Two-sided 95% Student's t quantiles by degrees of freedom.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262,
       10: 2.228, 12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df):
    return T95.get(df) or T95[max(k for k in T95 if k <= df)]


def mean_ci(xs):
    """Mean and half-width of its 95% confidence interval."""
    m = statistics.fmean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, t95(len(xs) - 1) * statistics.stdev(xs) / math.sqrt(len(xs))


def run_loop(native, steps, timeout):
    cmd = [sys.executable, os.path.join(HERE, "example_torch.py"), "--steps", str(steps), "--json"]
    if native:
        cmd.append("--native")
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}): {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def empty_del(mode, n):
    """Child: microseconds per torch.empty + del pair at 4 KiB and 1 MiB, after a warm-up."""
    import torch
    if mode == "adaptalloc":
        sys.path.insert(0, HERE)
        import example_torch
        example_torch.install()
    out = {}
    for size in (4096, 1 << 20):
        for _ in range(1000):
            del_me = torch.empty(size, dtype=torch.uint8, device="cuda")
            del del_me
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            x = torch.empty(size, dtype=torch.uint8, device="cuda")
            del x
        torch.cuda.synchronize()
        out[str(size)] = 1e6 * (time.perf_counter() - t0) / n
    print(json.dumps(out))


def run_empty_del(mode, n, timeout):
    # The tuning report (ADAPTALLOC_REPORT) is the training loop's, not this one's.
    env = {k: v for k, v in os.environ.items() if k != "ADAPTALLOC_REPORT"}
    p = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", mode, "--n", str(n)],
                       capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        raise RuntimeError(f"empty/del child {mode} failed: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--n", type=int, default=20000, help="torch.empty + del pairs per size")
    ap.add_argument("--out", default=None, help="also write the Markdown here")
    ap.add_argument("--timeout", type=int, default=120, help="seconds per process")
    ap.add_argument("--child", choices=["native", "adaptalloc"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        empty_del(args.child, args.n)
        return

    import torch
    lines = [f"# PyTorch's allocator against adaptalloc: {args.pairs} pairs of {args.steps} steps",
             "", f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}. "
             "Each run: python/example_torch.py in its own process; the mean of the steps after the "
             "first tenth. Queue: host time until the step's work is queued. Driver calls: "
             "allocations and frees after the first tenth of the steps.", "",
             "| pair | order | native ms/step | adaptalloc ms/step | difference | native queue ms | "
             "adaptalloc queue ms | native driver calls | adaptalloc driver calls | "
             "peak reserved MiB, native / adaptalloc |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    diffs, qdiffs = [], []
    for i in range(args.pairs):
        order = [True, False] if i % 2 == 0 else [False, True]
        res = {}
        for native in order:
            res[native] = run_loop(native, args.steps, args.timeout)
        n, a = res[True], res[False]
        d = a["ms_per_step"] - n["ms_per_step"]
        diffs.append(d)
        qdiffs.append(a["host_ms_per_step"] - n["host_ms_per_step"])
        lines.append(f"| {i + 1} | {'native first' if order[0] else 'adaptalloc first'} | "
                     f"{n['ms_per_step']:.2f} | {a['ms_per_step']:.2f} | {d:+.2f} | "
                     f"{n['host_ms_per_step']:.2f} | {a['host_ms_per_step']:.2f} | "
                     f"{n['driver_calls_after_warmup']} | {a['driver_calls_after_warmup']} | "
                     f"{n['peak_reserved_mib']:.0f} / {a['peak_reserved_mib']:.0f} |")
        print(lines[-1], flush=True)
    m, h = mean_ci(diffs)
    qm, qh = mean_ci(qdiffs)
    lines += ["", f"adaptalloc minus native, mean over the pairs: {m:+.2f} ms a step "
              f"(95% CI {m - h:+.2f} to {m + h:+.2f}); time to queue a step {qm:+.2f} ms "
              f"({qm - qh:+.2f} to {qm + qh:+.2f})."]
    nat = run_empty_del("native", args.n, args.timeout)
    ada = run_empty_del("adaptalloc", args.n, args.timeout)
    lines += ["", f"`torch.empty` + `del`, {args.n} pairs after 1,000 to warm up, us a pair:", "",
              "| size | native | adaptalloc |", "|---|---|---|"]
    for size, label in (("4096", "4 KiB"), (str(1 << 20), "1 MiB")):
        lines.append(f"| {label} | {nat[size]:.2f} | {ada[size]:.2f} |")
    md = "\n".join(lines) + "\n"
    print(md)
    if args.out:
        with open(args.out, "w") as f:
            f.write(md)


if __name__ == "__main__":
    main()
