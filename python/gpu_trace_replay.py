"""Allocation traces replayed on a real GPU through PyTorch's own allocators and adaptalloc: issue
24's yardstick (the first pass, and the time per pass once warm) measured, not modelled.

    python3 python/gpu_trace_replay.py TRACE.csv... [--passes N] [--modes M,...] [--seconds S]
        [--out FILE.md] [--json FILE.json]

Each trace runs once per mode, in a process of its own (the first pass is what an allocator
pays once per process): every allocation and free of the trace, in order, through
torch.cuda's caching-allocator entry points (raw_alloc / raw_delete, what
torch.cuda.caching_allocator_alloc / caching_allocator_delete call), pass after pass; blocks
still live at the end of a pass are freed, as `adaptalloc compare --repeat` does. A pass is
timed on the host from its first call to a device synchronization after its last.

Modes: `pytorch` (PyTorch's caching allocator, its defaults), `pytorch-expandable` (the same with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), `adaptalloc` (the pluggable allocator over
target/release/libadaptalloc.so, default policy) and `python` (the same loop with no allocator
call: the interpreter's own share of a pass, subtracted from every other mode's). For each trace
and mode the report gives the first pass and the mean of the later ones less the interpreter's,
the warm-up (the first pass less a later one) and the physical allocations and frees each made
(num_device_alloc + num_device_free of torch.cuda.memory_stats() and of adaptalloc.memory_stats():
every cudaMalloc and mapped handle, every cudaFree and handle given back). adaptalloc's come from
its package where `import adaptalloc` finds it with its extension (PYTHONPATH), which then also
installs it; otherwise from target/release/libadaptalloc.so's own driver_allocs and driver_frees,
which count every handle from its ABI version 5 on (an older library counted map and unmap
calls, a run of handles mapped at once as one: such counts are marked so in the report).

Trace CSV: op,timestamp_ns,ptr,size,stream (op alloc or free); frees of blocks allocated before
the trace began are skipped. Every event goes to the current stream (the stream column is not
replayed: the traces of ../shared/traces use one). `python` mode needs no GPU and no torch
(`--modes python` checks a trace and the loop anywhere).
"""
import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("python", "pytorch", "pytorch-expandable", "adaptalloc")


def load_trace(path):
    """(events, slots): events are (slot, size) for an allocation and (slot, 0) for a free; a slot
    is a dense index for a live block, reused once freed."""
    events, live, free_slots, nslots = [], {}, [], 0
    with open(path, newline="") as f:
        rows = csv.reader(f)
        header = next(rows, None)
        if header is None or [h.strip() for h in header[:4]] != ["op", "timestamp_ns", "ptr", "size"]:
            raise ValueError(f"{path}: line 1: expected the header op,timestamp_ns,ptr,size,stream")
        for line, row in enumerate(rows, start=2):
            if not row:
                continue
            if len(row) < 4:
                raise ValueError(f"{path}: line {line}: expected op,timestamp_ns,ptr,size[,stream]")
            op, ptr = row[0].strip(), row[2].strip()
            if op == "alloc":
                try:
                    size = int(row[3])
                except ValueError:
                    raise ValueError(f"{path}: line {line}: size {row[3]!r} is not an integer") from None
                if size <= 0:
                    continue
                if ptr in live:
                    raise ValueError(f"{path}: line {line}: {ptr} allocated again while live")
                slot = free_slots.pop() if free_slots else nslots
                nslots = max(nslots, slot + 1)
                live[ptr] = slot
                events.append((slot, size))
            elif op == "free":
                slot = live.pop(ptr, None)
                if slot is None:
                    continue
                free_slots.append(slot)
                events.append((slot, 0))
            else:
                raise ValueError(f"{path}: line {line}: op {op!r} is neither alloc nor free")
    return events, nslots


def package_calls(package):
    """adaptalloc's physical allocations and frees so far, through its package: 0 before its first
    allocation (the package has no allocator for the device until then, and says so)."""
    try:
        st = package.memory_stats()
    except RuntimeError as e:
        if "no allocator for device" in str(e):
            return 0
        raise
    return st["num_device_alloc"] + st["num_device_free"]


def replay(events, nslots, alloc, free, sync):
    """One pass: nanoseconds from the first call to the synchronization after the last."""
    live = [0] * nslots
    t0 = time.perf_counter_ns()
    for slot, size in events:
        if size:
            live[slot] = alloc(size)
        else:
            free(live[slot])
            live[slot] = 0
    for p in live:
        if p:
            free(p)
    sync()
    return time.perf_counter_ns() - t0


def child(mode, path, passes):
    """Replays one trace `passes` times under `mode`; prints one JSON line."""
    events, nslots = load_trace(path)
    counted = "physical allocations and frees"
    if mode == "python":
        counter = iter(range(1, 1 << 62))
        alloc, free, sync, calls = (lambda size: next(counter)), (lambda p: None), (lambda: None), (lambda: 0)
    else:
        import torch
        package = None
        if mode == "adaptalloc":
            try:
                # The package (on PYTHONPATH with its _native): its install() and its counts of
                # physical handles come from one library. Not the source folder beside this
                # script, which has no _native.
                sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != HERE]
                import adaptalloc as package
                import adaptalloc.torch
                adaptalloc.torch.install()
            except ImportError:
                package = None
                sys.path.insert(0, HERE)
                import example_torch
                example_torch.install()
        torch.cuda.init()
        stream = torch.cuda.current_stream().cuda_stream
        raw_alloc = torch._C._cuda_cudaCachingAllocator_raw_alloc
        free = torch._C._cuda_cudaCachingAllocator_raw_delete
        sync = torch.cuda.synchronize

        def alloc(size):
            return raw_alloc(size, stream)

        if mode == "adaptalloc" and package is not None:
            def calls():
                return package_calls(package)
        elif mode == "adaptalloc":
            from test_ctypes import load
            if load().adaptalloc_abi_version() < 5:
                counted = "map and unmap calls"

            def calls():
                s = example_torch.adaptalloc_stats()
                return s.driver_allocs + s.driver_frees
        else:
            def calls():
                st = torch.cuda.memory_stats()
                if "num_device_alloc" in st:
                    return st["num_device_alloc"] + st["num_device_free"]
                return st.get("segment.all.allocated", 0) + st.get("segment.all.freed", 0)
        sync()
    ns, driver = [], []
    for _ in range(passes):
        before = calls()
        ns.append(replay(events, nslots, alloc, free, sync))
        driver.append(calls() - before)
    print(json.dumps({"mode": mode, "trace": os.path.basename(path), "events": len(events),
                      "pass_ns": ns, "driver_calls": driver,
                      "counted": counted}))


def run_child(mode, path, passes, timeout):
    env = {k: v for k, v in os.environ.items() if k not in ("ADAPTALLOC_REPORT", "PYTORCH_CUDA_ALLOC_CONF")}
    if mode == "pytorch-expandable":
        env["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    cmd = [sys.executable, os.path.abspath(__file__), "--child", mode, "--passes", str(passes), path]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if p.returncode != 0:
        return {"mode": mode, "trace": os.path.basename(path), "error": p.stderr.strip()[-1500:] or f"exit {p.returncode}"}
    return json.loads(p.stdout.strip().splitlines()[-1])


def ms(ns):
    return ns / 1e6


def summarize(r, base):
    """First pass and mean later pass, ms, less the interpreter's (`base`, the python mode's run;
    nothing where it is missing)."""
    own = [ms(a - b) for a, b in zip(r["pass_ns"], base["pass_ns"] if base else [0] * len(r["pass_ns"]))]
    return own[0], statistics.fmean(own[1:]) if len(own) > 1 else float("nan")


def markdown(results, modes, passes):
    by = {(r["trace"], r["mode"]): r for r in results}
    traces = list(dict.fromkeys(r["trace"] for r in results))
    shown = [m for m in modes if m != "python"]
    out = [f"Each trace once per allocator, {passes} passes, a process each; ms on the host, less the "
           "interpreter's own time for the same pass (mode `python`). Warm-up: the first pass less the "
           "mean later pass. Driver calls (physical allocations and frees): in the first pass / in each later "
           "pass (mean).", ""]
    head = "| trace | " + " | ".join(f"{m}: first / later / warm-up (ms) | {m}: driver calls" for m in shown) + " |"
    out += [head, "|---" * (1 + 2 * len(shown)) + "|"]
    sums = {m: [0.0, 0.0, 0.0] for m in shown}
    complete = {m: True for m in shown}
    for t in traces:
        base = by.get((t, "python"))
        cells = [t]
        for m in shown:
            r = by.get((t, m))
            if r is None or "error" in r:
                cells += ["not run" if r is None else "failed", ""]
                complete[m] = False
                continue
            first, later = summarize(r, base)
            sums[m][0] += first
            sums[m][1] += later
            sums[m][2] += first - later
            d = r["driver_calls"]
            marked = " (map calls)" if r.get("counted") == "map and unmap calls" else ""
            cells += [f"{first:.1f} / {later:.2f} / {first - later:.1f}",
                      f"{d[0]} / {statistics.fmean(d[1:]) if len(d) > 1 else 0:.1f}{marked}"]
        out.append("| " + " | ".join(cells) + " |")
    cells = ["sum"]
    for m, (first, later, warm) in sums.items():
        cells += [f"{first:.1f} / {later:.2f} / {warm:.1f}" + ("" if complete[m] else " (incomplete)"), ""]
    out.append("| " + " | ".join(cells) + " |")
    errors = [r for r in results if "error" in r]
    if errors:
        out += ["", "Failed runs:", ""]
        out += [f"- {r['trace']} under {r['mode']}: {r['error'].splitlines()[-1] if r['error'] else ''}" for r in errors]
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--passes", type=int, default=5, help="passes per trace (at least 2)")
    ap.add_argument("--modes", default=",".join(MODES), help="comma-separated, of " + ", ".join(MODES))
    ap.add_argument("--seconds", type=float, default=600, help="start no run after this many seconds")
    ap.add_argument("--timeout", type=float, default=120, help="seconds one run may take")
    ap.add_argument("--out", help="write the Markdown table here too")
    ap.add_argument("--json", help="write every run's raw figures here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.passes < 2:
        ap.error("--passes must be at least 2: the later passes are the steady state")
    if args.child:
        child(args.child, args.traces[0], args.passes)
        return
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"unknown mode(s) {', '.join(unknown)}: choose from {', '.join(MODES)}")
    for path in args.traces:
        load_trace(path)  # a bad trace is an error before any GPU time is spent
    start, results = time.monotonic(), []
    for path in args.traces:
        for mode in modes:
            if time.monotonic() - start > args.seconds:
                results.append({"mode": mode, "trace": os.path.basename(path), "error": "not run: out of time"})
                continue
            r = run_child(mode, path, args.passes, args.timeout)
            results.append(r)
            print(json.dumps(r)[:300], file=sys.stderr, flush=True)
    text = markdown(results, modes, args.passes)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
