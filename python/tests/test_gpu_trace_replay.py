"""python/gpu_trace_replay.py without a GPU: a trace's events become dense slots (reused once
freed, frees of blocks allocated before the trace skipped), a bad trace is an error naming its
line, one pass frees what is still live at its end, and the report subtracts the interpreter's
own time and sums the traces."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# Loaded from its file, as test_gpu_step_ab.py does (python/ on sys.path would shadow the package).
_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gpu_trace_replay.py")
_SPEC = importlib.util.spec_from_file_location("gpu_trace_replay", _PATH)
replay_mod = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(replay_mod)

TRACE = """op,timestamp_ns,ptr,size,stream
free,0,0x10,512,0
alloc,1,0xa,1024,0
alloc,2,0xb,2048,0
free,3,0xa,1024,0
alloc,4,0xc,4096,0
alloc,5,0xa,0,0
"""


def write(tmp_path, text, name="t.csv"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def test_events_use_dense_slots_reused_after_a_free(tmp_path):
    events, slots = replay_mod.load_trace(write(tmp_path, TRACE))
    # The free of 0x10 (allocated before the trace) and the zero-size request are skipped; 0xc
    # takes the slot 0xa left.
    assert events == [(0, 1024), (1, 2048), (0, 0), (0, 4096)]
    assert slots == 2


@pytest.mark.parametrize("text, line, words", [
    ("op,timestamp_ns,ptr\n", 1, "header"),
    ("op,timestamp_ns,ptr,size,stream\nalloc,0,0xa,big,0\n", 2, "size 'big'"),
    ("op,timestamp_ns,ptr,size,stream\nalloc,0,0xa,8,0\nmalloc,1,0xb,8,0\n", 3, "op 'malloc'"),
    ("op,timestamp_ns,ptr,size,stream\nalloc,0,0xa,8,0\nalloc,1,0xa,8,0\n", 3, "allocated again"),
])
def test_a_bad_trace_names_its_line(tmp_path, text, line, words):
    with pytest.raises(ValueError) as e:
        replay_mod.load_trace(write(tmp_path, text))
    assert f"line {line}" in str(e.value) and words in str(e.value)


def test_a_pass_frees_what_is_still_live_at_its_end(tmp_path):
    events, slots = replay_mod.load_trace(write(tmp_path, TRACE))
    made, freed = [], []

    def alloc(size):
        made.append(size)
        return 100 + len(made)

    ns = replay_mod.replay(events, slots, alloc, freed.append, lambda: None)
    assert ns >= 0
    assert made == [1024, 2048, 4096]
    assert sorted(freed) == [101, 102, 103]


def test_the_report_subtracts_the_interpreter_and_sums_the_traces():
    runs = [
        {"mode": "python", "trace": "a", "pass_ns": [1_000_000, 1_000_000, 1_000_000]},
        {"mode": "pytorch", "trace": "a", "pass_ns": [5_000_000, 2_000_000, 2_000_000], "driver_calls": [4, 0, 0]},
        {"mode": "python", "trace": "b", "pass_ns": [1_000_000, 1_000_000, 1_000_000]},
        {"mode": "pytorch", "trace": "b", "pass_ns": [3_000_000, 1_000_000, 3_000_000], "driver_calls": [2, 1, 1]},
        {"mode": "adaptalloc", "trace": "a", "error": "Traceback\nRuntimeError: no GPU"},
        {"mode": "adaptalloc", "trace": "b", "pass_ns": [2_000_000, 1_000_000, 1_000_000], "driver_calls": [3, 0, 0],
         "counted": "map and unmap calls"},
    ]
    text = replay_mod.markdown(runs, ["python", "pytorch", "adaptalloc"], 3)
    rows = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}
    # a: first 5 - 1 = 4 ms, later 1 ms, warm-up 3 ms; b: first 2, later (0 + 2) / 2 = 1, warm-up 1.
    assert "4.0 / 1.00 / 3.0 | 4 / 0.0" in rows["a"]
    assert "2.0 / 1.00 / 1.0 | 2 / 1.0" in rows["b"]
    assert "6.0 / 2.00 / 4.0" in rows["sum"]
    assert "failed" in rows["a"] and "(incomplete)" in rows["sum"]
    # Counts a library before ABI version 5 made (map calls, not handles) are marked as such.
    assert rows["b"].endswith("1.0 / 0.00 / 1.0 | 3 / 0.0 (map calls) |")
    assert "a under adaptalloc: RuntimeError: no GPU" in text


def test_the_python_mode_runs_end_to_end_without_torch(tmp_path):
    out = tmp_path / "runs.json"
    p = subprocess.run([sys.executable, _PATH, write(tmp_path, TRACE), "--modes", "python", "--passes", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    runs = json.loads(out.read_text())
    assert [r["mode"] for r in runs] == ["python"]
    assert runs[0]["events"] == 4 and len(runs[0]["pass_ns"]) == 2 and runs[0]["driver_calls"] == [0, 0]


def test_unknown_modes_and_a_single_pass_are_refused(tmp_path):
    trace = write(tmp_path, TRACE)
    for extra, words in ((["--modes", "cudaMalloc"], "unknown mode(s) cudaMalloc"), (["--passes", "1"], "at least 2")):
        p = subprocess.run([sys.executable, _PATH, trace, *extra], capture_output=True, text=True, timeout=60)
        assert p.returncode == 2 and words in p.stderr


def test_package_counts_are_zero_before_the_first_allocation_and_handles_after():
    class Package:
        stats = None

        def memory_stats(self):
            if self.stats is None:
                raise RuntimeError("adaptalloc: memory_stats(device=0) failed: adaptalloc_stats_sized: "
                                   "no allocator for device 0 yet (nothing was allocated on it)")
            return self.stats

    pkg = Package()
    assert replay_mod.package_calls(pkg) == 0
    pkg.stats = {"num_device_alloc": 7, "num_device_free": 2, "driver_allocs": 1}
    assert replay_mod.package_calls(pkg) == 9

    class Broken:
        def memory_stats(self):
            raise RuntimeError("adaptalloc: the library is older than this package")

    with pytest.raises(RuntimeError, match="older"):
        replay_mod.package_calls(Broken())
