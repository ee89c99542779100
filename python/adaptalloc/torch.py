"""adaptalloc as PyTorch's CUDA allocator. Imports torch only when called.

    import adaptalloc.torch
    adaptalloc.torch.install()            # before anything touches the GPU

See docs/pytorch.md for what of PyTorch's memory API works under a pluggable allocator.
"""

import os

from . import library_path


# PyTorch's setters on the allocator object (torch._C._CUDAPluggableAllocator, behind
# CUDAPluggableAllocator.allocator()), each with the hook of adaptalloc_torch_hook() it takes.
HOOKS = {
    "set_init_fn": "init",
    "set_reset_fn": "reset",
    "set_memory_fraction_fn": "memory_fraction",
    "set_record_stream_fn": "record_stream",
    "set_begin_allocate_to_pool": "begin_allocate_to_pool",
    "set_end_allocate_to_pool_fn": "end_allocate_to_pool",
    "set_release_pool": "release_pool",
}


def hook_addresses():
    """{setter: address}: the function adaptalloc gives each of PyTorch's hook setters."""
    import ctypes

    lib = ctypes.CDLL(library_path())
    lib.adaptalloc_torch_hook.restype = ctypes.c_void_p
    lib.adaptalloc_torch_hook.argtypes = [ctypes.c_char_p]
    out = {}
    for setter, name in HOOKS.items():
        address = lib.adaptalloc_torch_hook(name.encode())
        if not address:
            raise RuntimeError("adaptalloc_torch_hook(%r) returned NULL: a library older than this package?" % name)
        out[setter] = address
    return out


def allocator():
    """A ``torch.cuda.memory.CUDAPluggableAllocator`` over adaptalloc's C ABI, with every hook
    PyTorch lets a pluggable allocator set: ``torch.cuda.empty_cache()``, ``Tensor.record_stream``,
    ``set_per_process_memory_fraction``, CUDA initialization, and the private pools of CUDA graph
    capture (``torch.cuda.graph``, ``torch.compile(mode="reduce-overhead")``). A torch without
    the pool setters (before 2.3) gets the rest, with a warning."""
    import warnings

    import torch

    alloc = torch.cuda.memory.CUDAPluggableAllocator(library_path(), "adaptalloc_malloc", "adaptalloc_free")
    raw = alloc.allocator()
    missing = []
    for setter, address in hook_addresses().items():
        if hasattr(raw, setter):
            getattr(raw, setter)(address)
        else:
            missing.append(setter)
    if missing:
        warnings.warn(
            "torch %s has no %s: those hooks are not set (CUDA graph capture needs the pool hooks of torch 2.3 or later)"
            % (getattr(torch, "__version__", "?"), ", ".join(missing)),
            RuntimeWarning,
            stacklevel=2,
        )
    return alloc


_installed = None


LOG_LEVELS = ("off", "error", "warn", "info", "debug", "trace")


def install(policy=None, report=None, log=None, profile=None):
    """Makes adaptalloc PyTorch's CUDA allocator: ``policy`` (a preset name or a policy file),
    ``report`` (a tuning report written at exit: .md, .toml or .json), ``log`` (the level from
    which the allocator's events go to stderr: off, error, warn, the default, info for every
    route change and release, debug or trace) and ``profile`` (a workload profile: the peak
    earlier runs of this script showed, read at the start where the file exists and updated at
    exit, so that later runs back memory with large handles from their first request; one file
    per workload) set ADAPTALLOC_POLICY, ADAPTALLOC_REPORT, ADAPTALLOC_LOG and
    ADAPTALLOC_PROFILE. Call it before anything allocates on the GPU. Every hook is set
    (``allocator()``): ``torch.cuda.empty_cache()``, ``Tensor.record_stream``,
    ``set_per_process_memory_fraction`` and CUDA graph capture reach adaptalloc.

    The policy, the profile and the report's name are checked first (a ValueError naming the preset, or the
    file, line and key), so a typo never leaves PyTorch with an allocator that refuses every
    request. A second call with the same arguments does nothing (a re-run notebook cell); one
    with other arguments is a RuntimeError, since PyTorch cannot swap an allocator it has used."""
    global _installed
    from . import _native

    if policy is not None:
        _native.check_policy(os.fspath(policy))
    if report is not None and os.path.splitext(os.fspath(report))[1] not in (".md", ".markdown", ".toml", ".json"):
        raise ValueError("report %r: a tuning report is written as .md, .toml or .json" % (os.fspath(report),))
    if log is not None and log not in LOG_LEVELS:
        raise ValueError("log %r: give one of %s" % (log, ", ".join(LOG_LEVELS)))
    if profile is not None:
        _native.check_profile(os.fspath(profile))
    wanted = (
        None if policy is None else os.fspath(policy),
        None if report is None else os.fspath(report),
        log,
        None if profile is None else os.fspath(profile),
    )
    if _installed is not None:
        if _installed == wanted:
            return
        raise RuntimeError(
            "adaptalloc.torch.install() already ran with policy=%r, report=%r, log=%r, profile=%r; PyTorch "
            "cannot swap an allocator it has used, so policy=%r, report=%r, log=%r, profile=%r cannot take "
            "effect in this process"
            % (_installed + wanted)
        )
    import torch

    if policy is not None:
        os.environ["ADAPTALLOC_POLICY"] = wanted[0]
    if report is not None:
        os.environ["ADAPTALLOC_REPORT"] = wanted[1]
    if log is not None:
        os.environ["ADAPTALLOC_LOG"] = log
    if profile is not None:
        os.environ["ADAPTALLOC_PROFILE"] = wanted[3]
    try:
        torch.cuda.memory.change_current_allocator(allocator())
    except RuntimeError as e:
        raise RuntimeError(
            "adaptalloc.torch.install(): PyTorch's CUDA allocator is already initialized (something "
            "allocated on the GPU, or another allocator was installed, before this call); call "
            "install() first in the process: %s" % e
        ) from e
    _installed = wanted
