"""The `adaptalloc` Python package (pip install ./python), with pytest. No torch and no GPU needed:
allocation runs on a simulated device (ADAPTALLOC_DEVICE=sim:1GiB, in a child process, since the
C ABI reads its environment once per process); snapshot analysis is checked against the command
line (target/release/adaptalloc, built by `cargo build --release`) on every snapshot in
../shared/traces/snapshots (skipped, saying so, where that folder is absent)."""

import ctypes
import glob
import json
import os
import pickle
import subprocess
import sys
import tempfile

import pytest

import adaptalloc

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SNAPSHOTS = sorted(glob.glob(os.path.join(ROOT, "..", "shared", "traces", "snapshots", "*.pickle")))
CLI = os.path.join(ROOT, "target", "release", "adaptalloc")


def without_timing(result):
    """A compare result without its wall-clock times (they differ from run to run) and with the
    trace's name left out (a snapshot given as bytes has none)."""
    for t in result["traces"]:
        t["trace"] = "-"
        for r in t["results"]:
            r.pop("wall_ns")
    return result


def test_the_library_exports_the_c_abi():
    lib = ctypes.CDLL(adaptalloc.library_path())
    for name in ("adaptalloc_malloc", "adaptalloc_free", "adaptalloc_stats", "adaptalloc_empty_cache",
                 "adaptalloc_reset_peak_stats", "adaptalloc_synchronize_stream", "adaptalloc_record_stream",
                 "adaptalloc_last_error"):
        assert hasattr(lib, name), name


CHILD = r"""
import ctypes, json, adaptalloc
lib = ctypes.CDLL(adaptalloc.library_path())
lib.adaptalloc_malloc.restype = ctypes.c_void_p
lib.adaptalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.adaptalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
try:
    adaptalloc.memory_stats(0)
    raise SystemExit("stats before any allocation should raise")
except RuntimeError as e:
    before = str(e)
ptrs = [lib.adaptalloc_malloc(1 << 20, 0, None) for _ in range(8)]
assert all(ptrs) and len(set(ptrs)) == 8, ptrs
assert not lib.adaptalloc_malloc(2 << 30, 0, None)  # can never fit: PyTorch's num_ooms
s = adaptalloc.memory_stats()
for p in ptrs[:6]:
    lib.adaptalloc_free(p, 1 << 20, 0, None)
adaptalloc.synchronize_stream(0)
released = adaptalloc.empty_cache()
after_free = adaptalloc.memory_stats(0)
adaptalloc.reset_peak_stats(0)
reset = adaptalloc.memory_stats(0)
for p in ptrs[6:]:
    lib.adaptalloc_free(p, 1 << 20, 0, None)
print(json.dumps(dict(before=before, s=s, released=released, after_free=after_free, reset=reset)))
"""


def test_allocation_stats_reset_empty_cache_and_synchronize_on_a_simulated_device():
    env = dict(os.environ, ADAPTALLOC_DEVICE="sim:1GiB")
    env.pop("ADAPTALLOC_POLICY", None)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert "memory_stats(device=0)" in r["before"]
    s = r["s"]
    assert s["live_bytes"] == 8 << 20 and s["live_blocks"] == 8
    assert s["allocated_bytes.all.current"] == s["live_bytes"], "PyTorch's name for the same figure"
    # PyTorch's keys with PyTorch's meanings (docs/pytorch.md).
    assert s["requested_bytes.all.peak"] == 8 << 20 and s["allocated_bytes.all.allocated"] == 8 << 20
    assert s["reserved_bytes.all.current"] == s["reserved_bytes"] and s["active.all.current"] == 8
    assert s["num_ooms"] == 1 and s["failed_allocs"] == 1 and s["num_alloc_retries"] == 0
    assert s["num_device_alloc"] >= 1 and s["num_device_free"] == 0
    # One owner: PyTorch's names for adaptalloc's own physical counts (C ABI version 5).
    assert (s["num_device_alloc"], s["num_device_free"]) == (s["driver_allocs"], s["driver_frees"])
    assert s["vmm_calls"] >= 1, "a simulated device maps pages"
    assert s["inactive_split_bytes.all.current"] <= s["idle_bytes"]
    a = r["after_free"]
    assert a["allocated_bytes.all.freed"] == 6 << 20 and a["requested_bytes.all.current"] == 2 << 20
    assert a["inactive_split_bytes.all.current"] == 0, "after empty_cache, nothing idle is left to strand"
    assert s["reserved_bytes"] >= s["live_bytes"]
    assert r["after_free"]["live_bytes"] == 2 << 20
    assert r["released"] >= 0 and r["after_free"]["idle_bytes"] == 0, "empty_cache gave idle memory back"
    assert r["reset"]["peak_live_bytes"] == 2 << 20, "the peak restarts from the current value"


@pytest.mark.skipif(not SNAPSHOTS, reason="../shared/traces/snapshots is absent")
@pytest.mark.skipif(not os.path.exists(CLI), reason="target/release/adaptalloc is not built")
@pytest.mark.parametrize("snapshot", SNAPSHOTS, ids=os.path.basename)
def test_analysis_equals_the_command_line(snapshot):
    ours = adaptalloc.analyze_snapshot(snapshot, capacity_factor=1.5)
    # The same strategies on both sides: the command line may have been built with the `peers`
    # feature (CI's peers step rebuilds it so), which adds gpu-alloc to its default set.
    strategies = ",".join(r["strategy"] for r in ours["traces"][0]["results"])
    assert strategies.split(",")[:4] == ["passthrough", "caching", "suballoc", "adaptive"], strategies
    cli = subprocess.run([CLI, "compare", snapshot, "--capacity-factor", "1.5", "--format", "json",
                          "--strategies", strategies], capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    assert ours["traces"][0]["trace"] == os.path.basename(snapshot)
    assert without_timing(ours) == without_timing(json.loads(cli.stdout))


@pytest.mark.skipif(not SNAPSHOTS, reason="../shared/traces/snapshots is absent")
def test_a_snapshot_as_bytes_or_as_a_dict_gives_the_same_analysis():
    path = SNAPSHOTS[0]
    args = dict(capacity=64 << 30, strategies=["adaptive", "pytorch", "pytorch-expandable"],
                pytorch_conf="max_split_size_mb:128")
    by_path = without_timing(adaptalloc.analyze_snapshot(path, **args))
    with open(path, "rb") as f:
        data = f.read()
    assert without_timing(adaptalloc.analyze_snapshot(data, **args)) == by_path
    assert without_timing(adaptalloc.analyze_snapshot(pickle.loads(data), **args)) == by_path
    assert [r["strategy"] for r in by_path["traces"][0]["results"]] == args["strategies"]
    text = adaptalloc.report(path, capacity_factor=2.0, policy="training")
    assert text.startswith("# adaptalloc tuning report") and "## Recommendation" in text


def test_bad_input_is_a_clear_error():
    with pytest.raises(TypeError, match="snapshot: give a path"):
        adaptalloc.analyze_snapshot(42)
    with pytest.raises(ValueError, match="no-such-file.pickle"):
        adaptalloc.analyze_snapshot("no-such-file.pickle")
    with pytest.raises(ValueError, match="snapshot: not a readable pickle"):
        adaptalloc.analyze_snapshot(b"not a pickle at all")
    path = SNAPSHOTS[0] if SNAPSHOTS else None
    if path:
        with pytest.raises(ValueError, match="unknown strategy \"nope\"; known: "):
            adaptalloc.analyze_snapshot(path, strategies=["nope"])
        with pytest.raises(ValueError, match="capacity_factor must be a positive number"):
            adaptalloc.analyze_snapshot(path, capacity_factor=-1.0)
        with pytest.raises(ValueError, match="expandable_segmentz"):
            adaptalloc.analyze_snapshot(path, pytorch_conf="expandable_segmentz:True")
        with pytest.raises(ValueError, match="presets"):
            adaptalloc.report(path, policy="no-such-preset")


def test_device_and_stream_arguments_are_checked_before_ctypes():
    # ctypes would truncate 2**32 to device 0, and fail on '0' inside its own formatting.
    for call in (adaptalloc.memory_stats, adaptalloc.reset_peak_stats):
        with pytest.raises(ValueError, match="device 4294967296: adaptalloc serves devices 0 to 63"):
            call(2**32)
        with pytest.raises(ValueError, match="device -1: adaptalloc serves devices 0 to 63"):
            call(-1)
        for bad in ("0", 0.0, True):
            with pytest.raises(TypeError, match="device: give an int from 0 to 63"):
                call(bad)
    # No device: the current one, which is 0 where torch has not initialized CUDA.
    assert adaptalloc.current_device() == 0
    with pytest.raises(RuntimeError, match="device 0"):
        adaptalloc.memory_stats()
    with pytest.raises(ValueError, match="device 64"):
        adaptalloc.synchronize_stream(0, device=64)
    with pytest.raises(TypeError, match="stream: give a cudaStream_t as an int"):
        adaptalloc.synchronize_stream("0x1000")
    with pytest.raises(ValueError, match="stream -1"):
        adaptalloc.synchronize_stream(-1)


def test_one_strategy_name_is_one_strategy_and_refusals_are_counted(tmp_path):
    trace = tmp_path / "t.csv"
    trace.write_text("op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,4096,0\nalloc,2,0x20,8192,0\n"
                     "free,3,0x10,4096,0\nfree,4,0x20,8192,0\n")
    result = adaptalloc.analyze_snapshot(str(trace), capacity=1 << 30, strategies="adaptive")
    assert [r["strategy"] for r in result["traces"][0]["results"]] == ["adaptive"]
    with pytest.raises(TypeError, match="strategies: give a name or a list of names"):
        adaptalloc.analyze_snapshot(str(trace), strategies=["adaptive", 3])
    # On a 1-byte device both requests are refused, and the report counts them.
    text = adaptalloc.report(str(trace), capacity=1)
    assert "| failed / recovered OOM / pressure events | 2 / 0 / 0 |" in text, text


@pytest.mark.skipif(not os.path.exists(CLI), reason="target/release/adaptalloc is not built")
def test_passes_and_prices_reach_the_analysis_as_on_the_command_line(tmp_path):
    trace, fast = str(tmp_path / "serving.csv"), os.path.join(ROOT, "tuning", "cost-models", "vmm-fast.toml")
    subprocess.run([CLI, "synth", "serving", "--out", trace], check=True, capture_output=True)
    args = dict(capacity_factor=1.5, strategies=["adaptive", "pytorch"])
    ours = adaptalloc.analyze_snapshot(trace, repeat=3, cost_model=fast, **args)
    cli = subprocess.run([CLI, "compare", trace, "--capacity-factor", "1.5", "--strategies", "adaptive,pytorch",
                          "--repeat", "3", "--cost-model", fast, "--format", "json"],
                         capture_output=True, text=True, timeout=600)
    assert cli.returncode == 0, cli.stderr
    assert without_timing(ours) == without_timing(json.loads(cli.stdout))
    adaptive = ours["traces"][0]["results"][0]
    assert adaptive["steady_pass_ns"] is not None and adaptive["first_pass_ns"] > 0
    default = adaptalloc.analyze_snapshot(trace, repeat=3, **args)["traces"][0]["results"][0]
    assert adaptive["modeled_driver_ns"] < default["modeled_driver_ns"] / 2, "cuMemCreate 25x cheaper"
    # The report at those prices: one pass's driver time as `adaptalloc replay` gives it.
    text = adaptalloc.report(trace, capacity_factor=1.5, repeat=3, cost_model=fast)
    replay = subprocess.run([CLI, "replay", trace, "--capacity-factor", "1.5", "--repeat", "3", "--cost-model", fast],
                            capture_output=True, text=True, timeout=600)
    assert replay.returncode == 0, replay.stderr
    summary = [line for line in text.splitlines() if line.startswith("| driver time |")]
    assert summary and summary[0] in replay.stdout, (summary, replay.stdout)
    for bad, error, match in [(0, ValueError, "repeat must be 1 to 10,000 \\(got 0\\)"),
                              (10_001, ValueError, "got 10001"), (True, TypeError, "repeat: give an int"),
                              (2.0, TypeError, "repeat: give an int")]:
        with pytest.raises(error, match=match):
            adaptalloc.analyze_snapshot(trace, repeat=bad)
        with pytest.raises(error, match=match):
            adaptalloc.report(trace, repeat=bad)
    with pytest.raises(ValueError, match="no-such-prices.toml"):
        adaptalloc.analyze_snapshot(trace, cost_model="no-such-prices.toml")
    bad_model = tmp_path / "bad.toml"
    bad_model.write_text('description = "x"\nbogus = 1\n')
    with pytest.raises(ValueError, match="bad.toml:2.*bogus"):
        adaptalloc.report(trace, cost_model=bad_model)
    with pytest.raises(TypeError, match="cost_model: give the path"):
        adaptalloc.report(trace, cost_model=3)


@pytest.mark.skipif(not os.path.exists(CLI), reason="target/release/adaptalloc is not built")
def test_tune_matches_the_command_line_and_its_policy_loads(tmp_path):
    trace = str(tmp_path / "serving.csv")
    subprocess.run([CLI, "synth", "serving", "--out", trace], check=True, capture_output=True)
    args = ["--capacity-factor", "1.5", "--repeat", "3"]
    # A co-tenant of 71% of the slack: some variant leaves it room (cli/tests/prices.rs).
    for tenant in (None, "1200MiB@0.4..0.6"):
        ours = adaptalloc.tune(trace, capacity_factor=1.5, repeat=3, tenant=tenant)
        cli = subprocess.run([CLI, "tune", trace, *args, *(["--tenant", tenant] if tenant else [])],
                             capture_output=True, text=True, timeout=600)
        assert cli.returncode == 0, cli.stderr
        assert ours["markdown"] == cli.stdout
        winner = ours["trials"][ours["best"]]
        assert winner["failed_allocs"] == 0 and winner["tenant_failures"] == 0, winner
        assert ours["repeat"] == 3 and ours["tenant"] == (tenant is not None)
        policy = tmp_path / "tuned.toml"
        policy.write_text(ours["policy_toml"])
        adaptalloc._native.check_policy(str(policy))
        assert "tuned by adaptalloc tune: " + winner["label"] in ours["policy_toml"]
    with pytest.raises(ValueError, match="tenant \"2GiB\": no '@'"):
        adaptalloc.tune(trace, tenant="2GiB")
    with pytest.raises(TypeError, match="tenant: give SIZE@START..END"):
        adaptalloc.tune(trace, tenant=2 << 30)
    with pytest.raises(ValueError, match="repeat must be 1 to 10,000"):
        adaptalloc.tune(trace, repeat=0)


def test_a_pickle_whose_shared_references_explode_is_one_clear_error():
    deep = os.path.join(ROOT, "fuzz", "seeds", "snapshot", "shared-lists-40-deep.pickle")
    with pytest.raises(ValueError, match="shared references expand"):
        adaptalloc.analyze_snapshot(deep)


FAKE_TORCH = r"""
import sys, types
calls, hooks = [], {}
class Raw:  # torch._C._cuda_CUDAAllocator: the setters install() calls
    def __getattr__(self, setter):
        if not setter.startswith("set_"):
            raise AttributeError(setter)
        return lambda address: hooks.__setitem__(setter, address)
class Pluggable:
    def __init__(self, path, malloc, free):
        self.args, self.raw = (path, malloc, free), Raw()
    def allocator(self):
        return self.raw
torch = types.ModuleType("torch")
torch.cuda = types.SimpleNamespace(memory=types.SimpleNamespace(
    CUDAPluggableAllocator=Pluggable, change_current_allocator=lambda a: calls.append(a.args)))
sys.modules["torch"] = torch
import ctypes, os, adaptalloc, adaptalloc.torch as at
open("bad-profile.toml", "w").write("version = 1\nspeed = 2\n")
for bad, word in ((dict(policy="trainig"), "presets"), (dict(report="rep.pdf"), ".md, .toml or .json"),
                  (dict(log="verbose"), "off, error, warn, info, debug, trace"),
                  (dict(profile="bad-profile.toml"), "bad-profile.toml")):
    try:
        at.install(**bad)
        raise SystemExit("accepted %r" % bad)
    except ValueError as e:
        assert word in str(e), e
assert calls == [] and hooks == {}, "nothing swapped on a bad policy or report name"
at.install(policy="training", log="info", profile="job.toml")
at.install(policy="training", log="info", profile="job.toml")  # a re-run notebook cell: nothing happens
assert os.environ["ADAPTALLOC_LOG"] == "info" and os.environ["ADAPTALLOC_PROFILE"] == "job.toml"
assert calls == [(adaptalloc.library_path(), "adaptalloc_malloc", "adaptalloc_free")], calls
# Every hook set, each with the address the library exports for it.
lib = ctypes.CDLL(adaptalloc.library_path())
lib.adaptalloc_torch_hook.restype = ctypes.c_void_p
expected = {s: lib.adaptalloc_torch_hook(n.encode()) for s, n in at.HOOKS.items()}
assert hooks == expected and len(hooks) == 7 and all(hooks.values()), hooks
exported = {n: ctypes.cast(getattr(lib, f), ctypes.c_void_p).value for n, f in (
    ("reset", "adaptalloc_torch_empty_cache"), ("record_stream", "adaptalloc_torch_record_stream"),
    ("memory_fraction", "adaptalloc_set_memory_fraction"), ("init", "adaptalloc_torch_init"))}
for setter, name in at.HOOKS.items():
    if name in exported:
        assert hooks[setter] == exported[name], (setter, hooks[setter], exported[name])
try:
    at.install(policy="default")
    raise SystemExit("a second install with other arguments was accepted")
except RuntimeError as e:
    assert "already ran with policy='training', report=None, log='info', profile='job.toml'" in str(e), e
print("install ok")
"""


def test_install_checks_its_arguments_first_and_runs_once():
    # A stand-in torch module with the two calls install() makes (the real wheel is 5 GB).
    with tempfile.TemporaryDirectory() as cwd:  # install()'s files land here
        out = subprocess.run([sys.executable, "-c", FAKE_TORCH], capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, ADAPTALLOC_DEVICE="sim:1GiB"), cwd=cwd)
    assert out.returncode == 0 and "install ok" in out.stdout, out.stdout + out.stderr


def test_importing_the_package_does_not_import_torch():
    out = subprocess.run([sys.executable, "-c", "import sys, adaptalloc, adaptalloc.torch; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_the_torch_allocator_where_torch_imports():
    torch = pytest.importorskip("torch", reason="torch is not installed here")
    import adaptalloc.torch

    alloc = adaptalloc.torch.allocator()
    assert isinstance(alloc, torch.cuda.memory.CUDAPluggableAllocator)
