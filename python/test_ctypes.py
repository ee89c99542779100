"""Loads libadaptalloc with ctypes, on a machine with no GPU and no torch.

Run from the repository root after `cargo build --release -p adaptalloc-capi`:
    python3 python/test_ctypes.py
Checks: without a GPU, adaptalloc_malloc returns NULL with a readable reason, not a crash; on a
simulated device (ADAPTALLOC_DEVICE=sim:...) malloc, free, stats, empty_cache and the tuning
report at exit work; include/adaptalloc.h declares exactly the symbols the library exports.
"""
import ctypes
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "target", "release", "libadaptalloc.so")
HEADER = os.path.join(ROOT, "include", "adaptalloc.h")


class Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "live_bytes", "peak_live_bytes", "reserved_bytes", "peak_reserved_bytes", "idle_bytes",
        "live_blocks", "driver_allocs", "driver_frees", "failed_allocs", "oom_recoveries",
        "stream_reclaims", "stream_waits", "vmm_calls")]


def load():
    lib = ctypes.CDLL(LIB)
    lib.adaptalloc_malloc.restype = ctypes.c_void_p
    lib.adaptalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.adaptalloc_free.restype = None
    lib.adaptalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.adaptalloc_empty_cache.restype = ctypes.c_uint64
    lib.adaptalloc_stats.restype = ctypes.c_int
    lib.adaptalloc_stats.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.adaptalloc_stats_sized.restype = ctypes.c_int
    lib.adaptalloc_stats_sized.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    lib.adaptalloc_abi_version.restype = ctypes.c_uint32
    lib.adaptalloc_abi_version.argtypes = []
    lib.adaptalloc_last_error.restype = ctypes.c_char_p
    lib.adaptalloc_synchronize_stream.restype = ctypes.c_int
    lib.adaptalloc_synchronize_stream.argtypes = [ctypes.c_int, ctypes.c_void_p]
    lib.adaptalloc_record_stream.restype = ctypes.c_int
    lib.adaptalloc_record_stream.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    lib.adaptalloc_reset_peak_stats.restype = ctypes.c_int
    lib.adaptalloc_reset_peak_stats.argtypes = [ctypes.c_int]
    return lib


def child(mode):
    """Runs in a fresh process, so each case gets its own environment and allocators."""
    lib = load()
    if mode == "no-gpu":
        ptr = lib.adaptalloc_malloc(1 << 20, 0, None)
        assert ptr is None, "expected NULL without a GPU"
        reason = lib.adaptalloc_last_error().decode()
        assert "no CUDA driver found" in reason, reason
        assert lib.adaptalloc_stats(0, ctypes.byref(Stats())) == -1
        print("no-gpu ok:", reason)
    elif mode == "sim":
        ptrs = [lib.adaptalloc_malloc(size, 0, None) for size in (1000, 1 << 20, 3 << 20, 1000)]
        assert all(p and p % 256 == 0 for p in ptrs), ptrs
        s = Stats()
        assert lib.adaptalloc_stats(0, ctypes.byref(s)) == 0
        assert s.live_blocks == 4 and s.live_bytes == 2000 + (4 << 20), (s.live_blocks, s.live_bytes)
        for p, size in zip(ptrs, (1000, 1 << 20, 3 << 20, 1000)):
            lib.adaptalloc_free(p, size, 0, None)
        lib.adaptalloc_free(ctypes.c_void_p(0xdead00), 8, 0, None)  # unknown: an error, not a crash
        assert "not a live allocation" in lib.adaptalloc_last_error().decode()
        assert lib.adaptalloc_malloc(1 << 50, 0, None) is None  # larger than the device
        assert "can never fit" in lib.adaptalloc_last_error().decode()
        p = lib.adaptalloc_malloc(4096, 0, None)
        assert lib.adaptalloc_last_error() == b"", "a success clears the last error"
        lib.adaptalloc_free(p, 4096, 0, None)
        assert lib.adaptalloc_last_error() == b""
        assert lib.adaptalloc_synchronize_stream(0, None) == 0
        assert lib.adaptalloc_synchronize_stream(3, None) == -1  # nothing on device 3
        assert "device 3" in lib.adaptalloc_last_error().decode()
        p = lib.adaptalloc_malloc(4096, 0, None)
        assert lib.adaptalloc_record_stream(p, 0, ctypes.c_void_p(0x3000)) == 0
        lib.adaptalloc_free(p, 4096, 0, None)
        assert lib.adaptalloc_last_error() == b""
        assert lib.adaptalloc_record_stream(p, 0, ctypes.c_void_p(0x3000)) == -1  # freed: not live
        assert "not a live allocation" in lib.adaptalloc_last_error().decode()
        for bad in (-1, 64):  # one wording from every call given a device out of range
            calls = [
                lambda: lib.adaptalloc_malloc(4096, bad, None),
                lambda: lib.adaptalloc_stats(bad, ctypes.byref(Stats())),
                lambda: lib.adaptalloc_synchronize_stream(bad, None),
                lambda: lib.adaptalloc_reset_peak_stats(bad),
                lambda: lib.adaptalloc_record_stream(ctypes.c_void_p(0x1000), bad, None),
            ]
            for call in calls:
                assert call() in (None, -1)
                reason = lib.adaptalloc_last_error().decode()
                assert f"device {bad}: adaptalloc serves devices 0 to 63" in reason, reason
        # Every successful call clears the last error: free(NULL) and empty_cache too.
        assert lib.adaptalloc_malloc(0, 0, None) is None and lib.adaptalloc_last_error() != b""
        lib.adaptalloc_free(None, 0, 0, None)
        assert lib.adaptalloc_last_error() == b"", "free(NULL) clears the last error"
        assert lib.adaptalloc_malloc(0, 0, None) is None
        lib.adaptalloc_empty_cache()
        assert lib.adaptalloc_last_error() == b"", "empty_cache clears the last error"
        # Every refused request counts: size 0 (twice above) and larger than the device (once).
        lib.adaptalloc_stats(0, ctypes.byref(s))
        assert s.failed_allocs == 3, s.failed_allocs
        assert lib.adaptalloc_reset_peak_stats(0) == 0
        lib.adaptalloc_stats(0, ctypes.byref(s))
        assert s.peak_live_bytes == s.live_bytes == 0, s.peak_live_bytes
        assert s.live_blocks == 0
        lib.adaptalloc_empty_cache()
        lib.adaptalloc_stats(0, ctypes.byref(s))
        assert s.reserved_bytes == s.live_bytes + s.idle_bytes, (s.reserved_bytes, s.idle_bytes)
        print("sim ok: driver allocs", s.driver_allocs)
    elif mode == "fork":
        # Threads allocate and free without pause while this process forks: a child must
        # neither deadlock on its first call (a parent thread may have held a lock at the fork)
        # nor hang in exit() writing the parent's report.
        import threading, time
        libc = ctypes.CDLL(None)
        assert lib.adaptalloc_malloc(4096, 0, None)  # allocators exist before the forks
        stop = threading.Event()

        def churn(seed):
            # Sizes from 64 KiB to 64 MiB: driver calls, slab growth and releases keep the
            # allocator's locks held longer than a cache hit would.
            sizes = [(1 << 16) << ((seed + k) % 11) for k in range(64)]
            while not stop.is_set():
                held = [(lib.adaptalloc_malloc(n, 0, None), n) for n in sizes[:8]]
                for p, n in held:
                    lib.adaptalloc_free(p, n, 0, None)
                lib.adaptalloc_empty_cache()
                sizes.append(sizes.pop(0))

        threads = [threading.Thread(target=churn, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        children = []
        for i in range(400):
            pid = os.fork()
            if pid == 0:
                ok = True
                if i % 2 == 0:  # half call adaptalloc, half only exit (running the atexit hook)
                    p = lib.adaptalloc_malloc(4096, 0, None)
                    s = Stats()
                    lib.adaptalloc_stats(0, ctypes.byref(s))
                    # Its own allocator: the parent's live block (above) is not in it. The
                    # process id is cached; the fork handler renews it in the child.
                    ok = bool(p) and s.live_blocks == 1
                    lib.adaptalloc_free(p, 4096, 0, None)
                libc.exit(0 if ok else 3)
            children.append(pid)
        stop.set()
        for t in threads:
            t.join()
        deadline = time.time() + 20
        pending, failed = set(children), 0
        while pending and time.time() < deadline:
            for pid in list(pending):
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    pending.discard(pid)
                    failed += os.waitstatus_to_exitcode(status) != 0
            time.sleep(0.01)
        for pid in pending:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        assert not pending and not failed, f"{len(pending)} of 400 children hung, {failed} failed"
        report = os.environ["ADAPTALLOC_REPORT"]
        assert not os.path.exists(report), "a child wrote the parent's report"
        print("fork ok: 400 children forked while 3 threads allocated; none hung or failed")
    elif mode == "abi":
        # Version 3: every field with the size given, nothing past it; the 2-argument call the
        # ten fields of version 1 only, whatever header the caller was built against.
        assert lib.adaptalloc_abi_version() == 5
        assert int(re.search(r"#define ADAPTALLOC_ABI_VERSION (\d+)", open(HEADER).read()).group(1)) == 5
        assert ctypes.sizeof(Stats) == 13 * 8
        p = lib.adaptalloc_malloc(4096, 0, None)
        guard = 0xABABABABABABABAB
        for size, written in ((104, 13), (96, 12), (64, 8), (7, 0), (1000, 13)):
            buf = (ctypes.c_uint64 * 16)(*([guard] * 16))
            assert lib.adaptalloc_stats_sized(0, buf, size) == 0, size
            assert all(w != guard for w in buf[:written]) or written == 0, (size, list(buf))
            assert all(w == guard for w in buf[written:]), (size, "written past the size", list(buf))
        assert buf[0] == 4096 and buf[5] == 1, list(buf)  # live_bytes, live_blocks
        buf = (ctypes.c_uint64 * 16)(*([guard] * 16))
        assert lib.adaptalloc_stats(0, buf) == 0
        assert buf[0] == 4096 and all(w == guard for w in buf[10:]), list(buf)
        assert lib.adaptalloc_stats_sized(0, None, 96) == -1
        lib.adaptalloc_free(p, 4096, 0, None)
        print("abi ok: sized writes 0, 8, 12 and 13 fields, never past the size; the old call 10")
    elif mode == "devices":
        for device in (0, 1, 2):
            p = lib.adaptalloc_malloc(4096, device, None)
            assert p, lib.adaptalloc_last_error()
            lib.adaptalloc_free(p, 4096, device, None)
        print("devices ok: allocated on devices 0, 1 and 2")
    elif mode == "bad-device":
        for _ in range(3):
            assert lib.adaptalloc_malloc(4096, 0, None) is None
        reason = lib.adaptalloc_last_error().decode()
        assert "ADAPTALLOC_DEVICE" in reason, reason
        print("bad-device ok:", reason)
    elif mode == "bad-policy":
        for _ in range(3):
            assert lib.adaptalloc_malloc(4096, 0, None) is None
        reason = lib.adaptalloc_last_error().decode()
        assert "bad-policy.toml" in reason and "flavour" in reason, reason
        print("bad-policy ok:", reason)
    elif mode == "bad-profile":
        assert lib.adaptalloc_malloc(4096, 0, None) is None
        reason = lib.adaptalloc_last_error().decode()
        assert "bad-profile.toml" in reason and "speed" in reason, reason
        print("bad-profile ok:", reason)
    elif mode == "log":
        # 8 MiB blocks past the 16 MiB the policy gives as the peak: the engine warns once.
        mib = 1 << 20
        held = [lib.adaptalloc_malloc(8 * mib, 0, None) for _ in range(8)]
        assert all(held), lib.adaptalloc_last_error()
        for p in held:
            lib.adaptalloc_free(p, 8 * mib, 0, None)
        print("log ok: 64 MiB allocated past a 16 MiB given peak")
    elif mode == "streams":
        # Stream A (a fake handle: the simulated device ignores it) fills 512 MiB with 1 MiB
        # blocks and frees seven in eight without synchronizing; stream B then gets as many
        # blocks as plain cudaMalloc could give it.
        a, b, mib = ctypes.c_void_p(0x1000), ctypes.c_void_p(0x2000), 1 << 20
        held = []
        while True:
            p = lib.adaptalloc_malloc(mib, 0, a)
            if not p:
                break
            held.append(p)
        kept = [p for i, p in enumerate(held) if i % 8 == 0]
        for i, p in enumerate(held):
            if i % 8:
                lib.adaptalloc_free(p, mib, 0, a)
        want = (512 * mib - len(kept) * 2 * mib) // (2 * mib)  # 1 MiB takes a 2 MiB page alone
        got = [lib.adaptalloc_malloc(mib, 0, b) for _ in range(want)]
        assert all(got), (sum(1 for g in got if g), want, lib.adaptalloc_last_error())
        print(f"streams ok: B got {want} of {want} blocks beside A's {len(kept)}")


def run_child(mode, env):
    full = dict(os.environ)
    full.pop("ADAPTALLOC_DEVICE", None)
    full.update(env)
    out = subprocess.run([sys.executable, __file__, "--child", mode], env=full, capture_output=True, text=True)
    if out.returncode != 0:
        print(out.stdout, out.stderr, file=sys.stderr)
        raise SystemExit(f"{mode}: exit {out.returncode}")
    print(out.stdout.strip())


def build_and_run(compiler, source, flags=()):
    """Builds python/SOURCE with COMPILER against the library (linked, with its path as rpath),
    runs it on a simulated device and prints what it printed; it must exit 0."""
    with tempfile.TemporaryDirectory() as tmp:
        exe = os.path.join(tmp, os.path.splitext(source)[0])
        built = subprocess.run([compiler, *flags, os.path.join(ROOT, "python", source), "-o", exe,
                                "-L", os.path.dirname(LIB), "-ladaptalloc", "-Wl,-rpath," + os.path.dirname(LIB)],
                               capture_output=True, text=True)
        if built.returncode != 0:
            raise SystemExit(f"cannot build python/{source} with {compiler}: {built.stderr}")
        env = dict(os.environ, ADAPTALLOC_DEVICE="sim:1GiB")
        out = subprocess.run([exe], env=env, capture_output=True, text=True)
        assert out.returncode == 0, (out.returncode, out.stdout, out.stderr)
        print(out.stdout.strip())


def abi_v1_caller():
    """A C program built against the first header's ten-field struct (python/abi_v1.c), linked
    against the library: its memory past the struct is never written."""
    build_and_run(os.environ.get("CC", "cc"), "abi_v1.c")


def torch_hooks_caller():
    """PyTorch's hooks called through the function types PyTorch casts them to, from C++
    (python/torch_hooks.cpp): std::function wrappers, MempoolId_t and a std::function filter by
    value into the pool hooks (capi/src/torch_hooks.cpp)."""
    build_and_run(os.environ.get("CXX", "c++"), "torch_hooks.cpp", ("-std=c++17", "-Wall"))


def header_matches_exports():
    declared = set(re.findall(r"\b(adaptalloc_\w+)\s*\(", open(HEADER).read()))
    nm = subprocess.run(["nm", "-D", "--defined-only", LIB], capture_output=True, text=True, check=True).stdout
    exported = set(re.findall(r"\bT (adaptalloc_\w+)$", nm, re.M))
    assert declared == exported, f"header {sorted(declared)} != exports {sorted(exported)}"
    print("header ok:", ", ".join(sorted(declared)))


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(sys.argv[2])
        return
    if not os.path.exists(LIB):
        raise SystemExit(f"{LIB} is missing: run `cargo build --release -p adaptalloc-capi` first")
    header_matches_exports()
    try:
        ctypes.CDLL("libcuda.so.1")
        print("SKIPPED no-gpu case: a CUDA driver is present")
    except OSError:
        run_child("no-gpu", {})
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        run_child("sim", {"ADAPTALLOC_DEVICE": "sim:1GiB", "ADAPTALLOC_POLICY": "training", "ADAPTALLOC_REPORT": report})
        data = json.load(open(report))
        assert data["requests"] == 6 and "large-batch training" in data["policy"], data["requests"]
        print("report at exit ok:", report)
    run_child("streams", {"ADAPTALLOC_DEVICE": "sim:512MiB"})
    run_child("abi", {"ADAPTALLOC_DEVICE": "sim:1GiB"})
    abi_v1_caller()
    torch_hooks_caller()
    with tempfile.TemporaryDirectory() as tmp:
        policy = os.path.join(tmp, "bad-policy.toml")
        with open(policy, "w") as f:
            f.write("[routing]\nflavour = 3\n")
        env = dict(os.environ, ADAPTALLOC_DEVICE="sim:1GiB", ADAPTALLOC_POLICY=policy)
        out = subprocess.run([sys.executable, __file__, "--child", "bad-policy"], env=env,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        printed = [l for l in out.stderr.splitlines() if l.startswith("adaptalloc: cannot build")]
        assert len(printed) == 1 and "bad-policy.toml:2" in printed[0] and "flavour" in printed[0], out.stderr
        print(out.stdout.strip(), "| printed once to stderr")
    with tempfile.TemporaryDirectory() as tmp:
        # The engine's warnings reach stderr (ADAPTALLOC_LOG, warn when unset); off silences
        # them; an unknown level is printed once and warnings kept.
        policy = os.path.join(tmp, "short-peak.toml")
        with open(policy, "w") as f:
            f.write('[bounds]\nexpected_peak = "16MiB"\n')
        warning = "the workload outgrew bounds.expected_peak"
        for level, warned, complaint in ((None, True, False), ("off", False, False), ("loud", True, True)):
            env = dict(os.environ, ADAPTALLOC_DEVICE="sim:1GiB", ADAPTALLOC_POLICY=policy)
            env.pop("ADAPTALLOC_LOG", None)
            if level is not None:
                env["ADAPTALLOC_LOG"] = level
            report = os.path.join(tmp, "live.json")
            env["ADAPTALLOC_REPORT"] = report
            out = subprocess.run([sys.executable, __file__, "--child", "log"], env=env,
                                 capture_output=True, text=True)
            assert out.returncode == 0, out.stdout + out.stderr
            lines = out.stderr.splitlines()
            assert sum(warning in l and "WARN" in l for l in lines) == (1 if warned else 0), (level, out.stderr)
            assert sum("ADAPTALLOC_LOG" in l for l in lines) == (1 if complaint else 0), (level, out.stderr)
            # The report at exit gives the peak the run showed, and says that a live run's
            # advice was not replayed.
            advice = json.load(open(report))["recommendations"]
            assert any("past the 16MiB the policy gave" in r for r in advice), advice
            assert advice[-1].startswith("not replayed: a live run"), advice
        print(out.stdout.strip(), "| warned once on stderr; ADAPTALLOC_LOG=off silent; advice not replayed, said")
    with tempfile.TemporaryDirectory() as tmp:
        # ADAPTALLOC_PROFILE: the first run writes the peak it showed at exit; the second is
        # given it from its first request and counts itself; a broken profile is refused.
        prof = os.path.join(tmp, "job.toml")
        env = {"ADAPTALLOC_DEVICE": "sim:1GiB", "ADAPTALLOC_PROFILE": prof, "ADAPTALLOC_LOG": "info"}
        run_child("log", env)
        first = open(prof).read()
        assert "runs = 1" in first and f"peak_footprint_bytes = {64 << 20}" in first, first
        full = dict(os.environ, **env)
        out = subprocess.run([sys.executable, __file__, "--child", "log"], env=full, capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "the peak earlier runs showed is given" in out.stderr, out.stderr
        assert "runs = 2" in open(prof).read()
        bad = os.path.join(tmp, "bad-profile.toml")
        open(bad, "w").write(first + "speed = 2\n")
        run_child("bad-profile", {"ADAPTALLOC_DEVICE": "sim:1GiB", "ADAPTALLOC_PROFILE": bad})
        print("profile ok: written at exit, given to the next run, a broken one refused")
    with tempfile.TemporaryDirectory() as tmp:
        # Each device writes a report of its own, its number before the extension.
        report = os.path.join(tmp, "rep.md")
        run_child("devices", {"ADAPTALLOC_DEVICE": "sim:1GiB", "ADAPTALLOC_REPORT": report})
        written = sorted(os.listdir(tmp))
        assert written == ["rep.1.md", "rep.2.md", "rep.md"], written
        for name in written:
            assert open(os.path.join(tmp, name)).read().startswith("# adaptalloc tuning report"), name
        print("reports ok:", ", ".join(written))
    for spec in ("sim:", "sim:abc", "SIM:1GiB", " sim:1GiB", "gpu"):
        # A broken ADAPTALLOC_DEVICE is printed once to stderr, as a broken policy is.
        env = dict(os.environ, ADAPTALLOC_DEVICE=spec)
        out = subprocess.run([sys.executable, __file__, "--child", "bad-device"], env=env,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout + out.stderr
        printed = [l for l in out.stderr.splitlines() if l.startswith("adaptalloc: cannot build")]
        assert len(printed) == 1 and f"ADAPTALLOC_DEVICE={spec!r}".replace("'", '"') in printed[0], (spec, out.stderr)
    print("bad-device ok: each broken ADAPTALLOC_DEVICE printed once to stderr")
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "fork-report.md")
        run_child("fork", {"ADAPTALLOC_DEVICE": "sim:1GiB", "ADAPTALLOC_REPORT": report})
        assert os.path.exists(report), "the parent writes its report at exit"
    print("12 passed, 0 failed")


if __name__ == "__main__":
    main()
