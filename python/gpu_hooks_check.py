"""On a GPU: PyTorch's hooks under adaptalloc, end to end (scripts/gpu-run.sh runs it; it
needs the package installed: pip install ./python). Each case runs in a child process, since
PyTorch swaps its allocator once per process. Prints one line per case; exits non-zero when any
case failed.

    python3 python/gpu_hooks_check.py [CASE...]
"""
import subprocess
import sys

CASES = {
    # A block recorded on a busy side stream is not reused while that stream's work runs: a 64 MiB
    # block used on the side stream, recorded there, freed, and the same size asked for at once.
    "record_stream": r"""
import torch, adaptalloc, adaptalloc.torch as at
at.install()
side = torch.cuda.Stream()
# Load the kernels first: a kernel's first launch can wait for the device (lazy module loading),
# which would finish the side stream's work before the reuse is tried and prove nothing.
w = torch.empty(1024, dtype=torch.uint8, device="cuda")
with torch.cuda.stream(side):
    torch.cuda._sleep(1000)
    w.add_(1)
torch.cuda.synchronize()
x = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
ptr = x.data_ptr()
with torch.cuda.stream(side):
    torch.cuda._sleep(1_000_000_000)  # keeps the side stream busy for about half a second
    x.add_(1)
x.record_stream(side)
busy = not side.query()
del x
y = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
reused, done = y.data_ptr() == ptr, side.query()
torch.cuda.synchronize()
assert busy, "the side stream's work was done before the free: the check proves nothing"
assert not (reused and not done), "a block recorded on a busy side stream was reused while its work ran"
print("record_stream ok: %s" % ("the block waited" if not reused else "reused after the side stream's work"))
""",
    "graph": r"""
import torch, adaptalloc, adaptalloc.torch as at
at.install()
model = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)).cuda()
static_in = torch.randn(64, 512, device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    for _ in range(3):
        model(static_in)
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    static_out = model(static_in)
for _ in range(5):
    static_in.copy_(torch.randn(64, 512, device="cuda"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(static_out, model(static_in), atol=1e-5), "a replay differs from eager"
reserved = adaptalloc.memory_stats()["reserved_bytes"]
del g, static_out
torch.cuda.empty_cache()
print("graph ok: 5 replays equal eager; reserved %d -> %d after the graph's release" % (reserved, adaptalloc.memory_stats()["reserved_bytes"]))
""",
    # torch.compile's reduce-overhead mode with CUDA graph trees off: plain graph capture, through
    # the pool hooks.
    "compile": r"""
import torch, adaptalloc.torch as at
import torch._inductor.config as inductor
at.install()
inductor.triton.cudagraph_trees = False
f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x.T), mode="reduce-overhead")
x = torch.randn(256, 256, device="cuda")
for _ in range(4):
    out = f(x)
torch.cuda.synchronize()
assert torch.allclose(out, torch.nn.functional.gelu(x @ x.T), atol=1e-4)
print("torch.compile reduce-overhead ok (cudagraph_trees off)")
""",
    # With CUDA graph trees (the default), torch 2.11 asks the allocator for
    # checkPoolLiveAllocations, which PyTorch's CUDAPluggableAllocator refuses for every pluggable
    # allocator: a limitation of PyTorch, tracked here so that a torch that lifts it is noticed.
    "compile_trees": r"""
import torch, adaptalloc.torch as at
at.install()
f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x.T), mode="reduce-overhead")
x = torch.randn(256, 256, device="cuda")
try:
    for _ in range(4):
        out = f(x)
    torch.cuda.synchronize()
    assert torch.allclose(out, torch.nn.functional.gelu(x @ x.T), atol=1e-4)
    print("torch.compile reduce-overhead with cudagraph trees ok: this torch lifted the limitation")
except RuntimeError as e:
    if "pluggable does not yet support checkPoolLiveAllocations" not in str(e):
        raise
    print("torch %s: cudagraph trees refuse every pluggable allocator (checkPoolLiveAllocations); "
          "set torch._inductor.config.triton.cudagraph_trees = False" % torch.__version__)
""",
    "empty_cache_and_fraction": r"""
import torch, adaptalloc, adaptalloc.torch as at
at.install()
x = torch.empty(256 << 20, dtype=torch.uint8, device="cuda"); del x
assert adaptalloc.memory_stats()["idle_bytes"] > 0
torch.cuda.empty_cache()
assert adaptalloc.memory_stats()["idle_bytes"] == 0
torch.cuda.set_per_process_memory_fraction(0.01)
total = torch.cuda.get_device_properties(0).total_memory
before = adaptalloc.memory_stats()["num_ooms"]
y = torch.empty(int(total * 0.02), dtype=torch.uint8, device="cuda")  # NULL: PyTorch does not check
assert adaptalloc.memory_stats()["num_ooms"] == before + 1
print("empty_cache and memory fraction ok")
""",
    "mempool_oom": r"""
import torch, adaptalloc.torch as at
pool = torch.cuda.MemPool(at.allocator().allocator())
with torch.cuda.use_mem_pool(pool):
    x = torch.empty(1 << 20, device="cuda")
    try:
        torch.empty(1 << 45, dtype=torch.uint8, device="cuda")
        raise SystemExit("no error")
    except torch.OutOfMemoryError as e:
        print("MemPool route ok: OutOfMemoryError raised:", str(e).splitlines()[0][:100])
""",
}


def main():
    failed = 0
    names = sys.argv[1:] or list(CASES)  # e.g. `python3 python/gpu_hooks_check.py record_stream`
    unknown = [n for n in names if n not in CASES]
    if unknown:
        sys.exit("no such case: %s (the cases: %s)" % (", ".join(unknown), ", ".join(CASES)))
    for name in names:
        code = CASES[name]
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        # What the case printed last; on a failure, the end of its error (torch's warnings go to
        # stderr and would hide a passing case's own line).
        text = (out.stdout if out.returncode == 0 else out.stdout + out.stderr).strip().splitlines()
        print("%-26s %s" % (name, "ok" if out.returncode == 0 else "FAILED"), "|", text[-1] if text else "")
        failed += out.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
