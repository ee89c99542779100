"""adaptalloc under a real torch (the CUDA wheel, which installs and runs these calls without a
GPU or driver): install() sets every hook, and torch's own entry points reach adaptalloc
through them. Runs where torch imports (CI installs it); skips elsewhere, saying so. Each case
runs in a child process, since PyTorch swaps its allocator once per process."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed here (CI installs it: .ci/run)")

CHILD = r"""
import ctypes, threading, warnings
warnings.simplefilter("error", RuntimeWarning)  # a missing setter would warn
import torch
import adaptalloc, adaptalloc.torch as at

at.install(policy="default")
at.install(policy="default")  # a second call with the same arguments: nothing
try:
    at.install(policy="training")
    raise SystemExit("a second install with other arguments was accepted")
except RuntimeError as e:
    assert "already ran" in str(e), e
assert set(at.HOOKS) <= set(dir(torch._C._CUDAPluggableAllocator)), "every setter exists on this torch"

lib = ctypes.CDLL(adaptalloc.library_path())
lib.adaptalloc_malloc.restype = ctypes.c_void_p
lib.adaptalloc_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
lib.adaptalloc_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
MIB = 1 << 20

# torch.cuda.empty_cache()'s entry point reaches the reset hook: idle memory goes back.
a = lib.adaptalloc_malloc(8 * MIB, 0, None)
lib.adaptalloc_free(a, 8 * MIB, 0, None)
assert adaptalloc.memory_stats(0)["idle_bytes"] > 0
torch._C._cuda_emptyCache()
assert adaptalloc.memory_stats(0)["idle_bytes"] == 0, "torch's emptyCache released nothing"

# set_per_process_memory_fraction's entry point: a cap (0.25 of the 1 GiB simulated device).
torch._C._cuda_setMemoryFraction(0.25, 0)
assert not lib.adaptalloc_malloc(300 * MIB, 0, None)
assert "set_per_process_memory_fraction" in adaptalloc.last_error()
assert adaptalloc.memory_stats(0)["num_ooms"] == 1
torch._C._cuda_setMemoryFraction(1.0, 0)

# A private pool through torch's own begin/end/release (its filter, a std::function, takes
# this thread's requests): the pool never reuses memory from outside, another thread's request
# in the window stays outside, and the pool's memory goes back at its release.
b = lib.adaptalloc_malloc(4 * MIB, 0, None)
lib.adaptalloc_free(b, 4 * MIB, 0, None)  # idle, outside any pool
torch._C._cuda_beginAllocateCurrentThreadToPool(0, (7, 0))
c = lib.adaptalloc_malloc(4 * MIB, 0, None)
other = []
t = threading.Thread(target=lambda: other.append(lib.adaptalloc_malloc(4 * MIB, 0, None)))
t.start(); t.join()
torch._C._cuda_endAllocateToPool(0, (7, 0))
assert c and c != b, "the pool took memory of its own"
assert other[0] == b, "another thread's request was served outside the pool"
lib.adaptalloc_free(other[0], 4 * MIB, 0, None)
held = adaptalloc.memory_stats(0)["reserved_bytes"]
lib.adaptalloc_free(c, 4 * MIB, 0, None)
torch._C._cuda_releasePool(0, (7, 0))
assert adaptalloc.memory_stats(0)["reserved_bytes"] < held, "the released pool gave its memory back"
print("real torch ok", torch.__version__)
"""


def test_install_sets_every_hook_and_torchs_entry_points_reach_them():
    env = dict(os.environ, ADAPTALLOC_DEVICE="sim:1GiB")
    env.pop("ADAPTALLOC_POLICY", None)
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "real torch ok" in out.stdout, out.stdout + out.stderr


def test_the_hook_addresses_are_the_librarys():
    import ctypes

    import adaptalloc
    import adaptalloc.torch as at

    lib = ctypes.CDLL(adaptalloc.library_path())
    addresses = at.hook_addresses()
    assert len(addresses) == 7 and len(set(addresses.values())) == 7
    assert addresses["set_reset_fn"] == ctypes.cast(lib.adaptalloc_torch_empty_cache, ctypes.c_void_p).value
    assert addresses["set_record_stream_fn"] == ctypes.cast(lib.adaptalloc_torch_record_stream, ctypes.c_void_p).value
