"""adaptalloc as PyTorch's CUDA allocator. Imports torch only when called.

    import adaptalloc.torch
    adaptalloc.torch.install()            # before anything touches the GPU

See docs/pytorch.md for what of PyTorch's memory API works under a pluggable allocator.
"""

import os

from . import library_path


def allocator():
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over adaptalloc's C ABI."""
    import torch

    return torch.cuda.memory.CUDAPluggableAllocator(library_path(), "adaptalloc_malloc", "adaptalloc_free")


def install(policy=None, report=None):
    """Makes adaptalloc PyTorch's CUDA allocator: ``policy`` (a preset name or a policy file) and
    ``report`` (a tuning report written at exit: .md, .toml or .json) set ADAPTALLOC_POLICY and
    ADAPTALLOC_REPORT. Call it before anything allocates on the GPU."""
    import torch

    if policy is not None:
        os.environ["ADAPTALLOC_POLICY"] = os.fspath(policy)
    if report is not None:
        os.environ["ADAPTALLOC_REPORT"] = os.fspath(report)
    try:
        torch.cuda.memory.change_current_allocator(allocator())
    except RuntimeError as e:
        raise RuntimeError(
            "adaptalloc.torch.install() must run before anything allocates on the GPU "
            "(PyTorch cannot swap an allocator it has used): %s" % e
        ) from e
