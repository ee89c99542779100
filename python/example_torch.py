"""Train a small Transformer with adaptalloc as PyTorch's CUDA allocator.

    cargo build --release -p adaptalloc-capi
    ADAPTALLOC_REPORT=report.md python3 python/example_torch.py [--steps N] [--native] [--json]

The allocator must be installed before PyTorch allocates any CUDA memory. Prints time per
step, peak reserved and peak allocated; with ADAPTALLOC_REPORT set, adaptalloc writes its tuning
report when the process exits. --native runs PyTorch's own caching allocator for comparison.
--json prints one JSON line instead, with the host time a step took to queue its work and the
driver allocations and frees made after the first tenth of the steps (python/gpu_step_ab.py
compares the two allocators from these).
"""
import argparse
import json
import os
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIB = os.path.join(ROOT, "target", "release", "libadaptalloc.so")


def install():
    """As adaptalloc.torch.install() does, without the package: malloc and free, then every hook
    (adaptalloc_torch_hook gives each setter's address)."""
    import ctypes

    alloc = torch.cuda.memory.CUDAPluggableAllocator(LIB, "adaptalloc_malloc", "adaptalloc_free")
    lib = ctypes.CDLL(LIB)
    lib.adaptalloc_torch_hook.restype = ctypes.c_void_p
    lib.adaptalloc_torch_hook.argtypes = [ctypes.c_char_p]
    for setter, name in (("set_init_fn", b"init"), ("set_reset_fn", b"reset"),
                         ("set_memory_fraction_fn", b"memory_fraction"), ("set_record_stream_fn", b"record_stream"),
                         ("set_begin_allocate_to_pool", b"begin_allocate_to_pool"),
                         ("set_end_allocate_to_pool_fn", b"end_allocate_to_pool"), ("set_release_pool", b"release_pool")):
        getattr(alloc.allocator(), setter)(lib.adaptalloc_torch_hook(name))
    torch.cuda.memory.change_current_allocator(alloc)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--native", action="store_true", help="use PyTorch's own caching allocator")
    ap.add_argument("--json", action="store_true", help="one JSON line of results")
    args = ap.parse_args()
    if not args.native:
        install()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=6).to(dev)
    head = torch.nn.Linear(512, 1000).to(dev)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
    times, queued = [], []
    warm_from = args.steps // 10
    calls_at_warm = None
    for step in range(args.steps):
        if step == warm_from:
            calls_at_warm = driver_calls(args.native)
        # Varying batch shapes, as dynamic sequence lengths make them.
        batch, seq = 8 + (step % 4) * 8, 64 + (step % 7) * 32
        x = torch.randn(batch, seq, 512, device=dev)
        y = torch.randint(0, 1000, (batch, seq), device=dev)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(head(model(x)).reshape(-1, 1000), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        queued.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    warm = times[warm_from:]
    warm_calls = driver_calls(args.native) - (calls_at_warm or 0)
    name = "pytorch-native" if args.native else "adaptalloc"
    if args.native:
        reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    else:
        s = adaptalloc_stats()
        reserved, allocated = s.peak_reserved_bytes, s.peak_live_bytes
    ms, host_ms = 1e3 * sum(warm) / len(warm), 1e3 * sum(queued[warm_from:]) / len(warm)
    if args.json:
        print(json.dumps({"allocator": name, "steps": len(warm), "ms_per_step": ms, "host_ms_per_step": host_ms,
                          "driver_calls_after_warmup": warm_calls, "peak_reserved_mib": reserved / 2**20,
                          "peak_allocated_mib": allocated / 2**20}))
        return
    print(f"{name}: {ms:.2f} ms/step over {len(warm)} steps ({host_ms:.2f} ms to queue), "
          f"peak reserved {reserved / 2**20:.1f} MiB, peak allocated {allocated / 2**20:.1f} MiB, "
          f"{warm_calls} driver allocations and frees after step {warm_from}")


def adaptalloc_stats():
    """adaptalloc's own statistics (with a pluggable allocator PyTorch cannot see reserved memory)."""
    import ctypes
    import sys
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from test_ctypes import Stats, load
    s = Stats()
    load().adaptalloc_stats(torch.cuda.current_device(), ctypes.byref(s))
    return s


def driver_calls(native):
    """Driver allocations and frees so far: PyTorch's segments (cudaMalloc / cudaFree), or
    adaptalloc's driver_allocs + driver_frees."""
    if native:
        st = torch.cuda.memory_stats()
        return st.get("segment.all.allocated", 0) + st.get("segment.all.freed", 0)
    s = adaptalloc_stats()
    return s.driver_allocs + s.driver_frees


if __name__ == "__main__":
    main()
