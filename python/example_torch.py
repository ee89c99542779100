"""Train a small Transformer with adaptalloc as PyTorch's CUDA allocator.

    cargo build --release -p adaptalloc-capi
    ADAPTALLOC_REPORT=report.md python3 python/example_torch.py [--steps N] [--native]

The allocator must be installed before PyTorch allocates any CUDA memory. Prints time per
step, peak reserved and peak allocated; with ADAPTALLOC_REPORT set, adaptalloc writes its tuning
report when the process exits. --native runs PyTorch's own caching allocator for comparison.
"""
import argparse
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
    args = ap.parse_args()
    if not args.native:
        install()
    torch.manual_seed(0)
    dev = torch.device("cuda")
    layer = torch.nn.TransformerEncoderLayer(d_model=512, nhead=8, dim_feedforward=2048, batch_first=True)
    model = torch.nn.TransformerEncoder(layer, num_layers=6).to(dev)
    head = torch.nn.Linear(512, 1000).to(dev)
    opt = torch.optim.AdamW(list(model.parameters()) + list(head.parameters()), lr=1e-4)
    times = []
    for step in range(args.steps):
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
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    warm = times[len(times) // 10:]
    name = "pytorch-native" if args.native else "adaptalloc"
    # With a pluggable allocator PyTorch cannot see reserved memory; read adaptalloc's own stats.
    if args.native:
        reserved, allocated = torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated()
    else:
        import ctypes
        import sys
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from test_ctypes import Stats, load
        s = Stats()
        load().adaptalloc_stats(torch.cuda.current_device(), ctypes.byref(s))
        reserved, allocated = s.peak_reserved_bytes, s.peak_live_bytes
    print(f"{name}: {1e3 * sum(warm) / len(warm):.2f} ms/step over {len(warm)} steps, "
          f"peak reserved {reserved / 2**20:.1f} MiB, peak allocated {allocated / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
