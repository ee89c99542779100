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


_installed = None


def install(policy=None, report=None):
    """Makes adaptalloc PyTorch's CUDA allocator: ``policy`` (a preset name or a policy file) and
    ``report`` (a tuning report written at exit: .md, .toml or .json) set ADAPTALLOC_POLICY and
    ADAPTALLOC_REPORT. Call it before anything allocates on the GPU.

    The policy and the report's name are checked first (a ValueError naming the preset, or the
    file, line and key), so a typo never leaves PyTorch with an allocator that refuses every
    request. A second call with the same arguments does nothing (a re-run notebook cell); one
    with other arguments is a RuntimeError, since PyTorch cannot swap an allocator it has used."""
    global _installed
    from . import _native

    if policy is not None:
        _native.check_policy(os.fspath(policy))
    if report is not None and os.path.splitext(os.fspath(report))[1] not in (".md", ".markdown", ".toml", ".json"):
        raise ValueError("report %r: a tuning report is written as .md, .toml or .json" % (os.fspath(report),))
    wanted = (None if policy is None else os.fspath(policy), None if report is None else os.fspath(report))
    if _installed is not None:
        if _installed == wanted:
            return
        raise RuntimeError(
            "adaptalloc.torch.install() already ran with policy=%r, report=%r; PyTorch cannot swap an "
            "allocator it has used, so policy=%r, report=%r cannot take effect in this process"
            % (_installed + wanted)
        )
    import torch

    if policy is not None:
        os.environ["ADAPTALLOC_POLICY"] = wanted[0]
    if report is not None:
        os.environ["ADAPTALLOC_REPORT"] = wanted[1]
    try:
        torch.cuda.memory.change_current_allocator(allocator())
    except RuntimeError as e:
        raise RuntimeError(
            "adaptalloc.torch.install(): PyTorch's CUDA allocator is already initialized (something "
            "allocated on the GPU, or another allocator was installed, before this call); call "
            "install() first in the process: %s" % e
        ) from e
    _installed = wanted
