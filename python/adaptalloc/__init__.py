"""adaptalloc: a GPU memory allocator with a policy engine.

- ``library_path()``: the shared library that exports adaptalloc's C ABI (the file PyTorch's
  ``CUDAPluggableAllocator`` loads; ``adaptalloc.torch.install()`` does that for you).
- ``memory_stats()``, ``reset_peak_stats()``, ``empty_cache()``, ``synchronize_stream()``: the
  allocator in this process, where PyTorch's own calls raise under a pluggable allocator.
- ``analyze_snapshot()``: what adaptalloc, and the allocators people run, would do on a PyTorch
  memory snapshot (the command line's ``adaptalloc compare --format json``); ``report()``: the
  tuning report of one policy on it.

Importing this package never imports torch. See docs/pytorch.md in the repository.
"""

import ctypes
import json
import os
import pickle

from . import _native

__all__ = [
    "library_path",
    "current_device",
    "memory_stats",
    "reset_peak_stats",
    "empty_cache",
    "synchronize_stream",
    "last_error",
    "analyze_snapshot",
    "tune",
    "report",
]

_STAT_FIELDS = (
    "live_bytes",
    "peak_live_bytes",
    "reserved_bytes",
    "peak_reserved_bytes",
    "idle_bytes",
    "live_blocks",
    "driver_allocs",
    "driver_frees",
    "failed_allocs",
    "oom_recoveries",
    "stream_reclaims",
    "stream_waits",
    "vmm_calls",
)

class _Stats(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in _STAT_FIELDS]


_lib = None


def library_path():
    """The path of the shared library exporting adaptalloc's C ABI (adaptalloc_malloc, ...)."""
    return os.path.abspath(_native.__file__)


def _c():
    """The C ABI of this very library, through ctypes (the same allocators PyTorch uses)."""
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(library_path())
        lib.adaptalloc_stats_sized.restype = ctypes.c_int
        lib.adaptalloc_stats_sized.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats), ctypes.c_size_t]
        lib.adaptalloc_reset_peak_stats.restype = ctypes.c_int
        lib.adaptalloc_reset_peak_stats.argtypes = [ctypes.c_int]
        lib.adaptalloc_empty_cache.restype = ctypes.c_uint64
        lib.adaptalloc_empty_cache.argtypes = []
        lib.adaptalloc_synchronize_stream.restype = ctypes.c_int
        lib.adaptalloc_synchronize_stream.argtypes = [ctypes.c_int, ctypes.c_void_p]
        lib.adaptalloc_last_error.restype = ctypes.c_char_p
        lib.adaptalloc_last_error.argtypes = []
        _lib = lib
    return _lib


def last_error():
    """Why the last failing call on this thread failed, or None."""
    e = _c().adaptalloc_last_error()
    return e.decode() if e else None


_MAX_DEVICES = 64


def _device(device):
    """``device`` checked before ctypes sees it (which would truncate 2**32 to 0): an int
    from 0 to 63."""
    if isinstance(device, bool) or not isinstance(device, int):
        raise TypeError("device: give an int from 0 to %d (got %r)" % (_MAX_DEVICES - 1, device))
    if not 0 <= device < _MAX_DEVICES:
        raise ValueError("device %d: adaptalloc serves devices 0 to %d" % (device, _MAX_DEVICES - 1))
    return device


def _stream(stream):
    """A ``cudaStream_t`` as an int (0: the default stream), checked to fit a pointer."""
    if isinstance(stream, bool) or not isinstance(stream, int):
        raise TypeError("stream: give a cudaStream_t as an int, e.g. torch.cuda.Stream().cuda_stream (got %r)" % (stream,))
    if not 0 <= stream < 1 << 64:
        raise ValueError("stream %d: a cudaStream_t is a pointer, from 0 to 2**64 - 1" % stream)
    return stream


def _check(rc, what):
    if rc != 0:
        raise RuntimeError("adaptalloc: %s failed: %s" % (what, last_error() or "no allocator on that device yet"))


def current_device():
    """The device the calls below use when given none: torch.cuda.current_device() where torch
    is imported and CUDA initialized (as torch.cuda's own calls default), else 0. Never imports
    torch nor initializes CUDA."""
    import sys

    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.current_device())
    except Exception:  # a stand-in or broken torch: the first device
        pass
    return 0


def _device_or_current(device):
    return current_device() if device is None else _device(device)


def memory_stats(device=None):
    """The allocator's statistics on ``device`` (default: the current device), a dict.

    Keys of PyTorch's ``torch.cuda.memory_stats()`` keep PyTorch's meanings:
    ``allocated_bytes``, ``requested_bytes``, ``active_bytes``, ``reserved_bytes``,
    ``allocation`` and ``active`` (each ``.all.current``, ``.all.peak``, ``.all.allocated``,
    ``.all.freed``), ``inactive_split_bytes.all.current``, ``num_alloc_retries``, ``num_ooms``,
    ``num_device_alloc`` and ``num_device_free``; docs/pytorch.md maps each one. adaptalloc's own
    counters carry their own names (``live_bytes``, ``idle_bytes``, ``driver_allocs``,
    ``stream_waits``...). RuntimeError when nothing was allocated on ``device`` yet."""
    device = _device_or_current(device)
    s = _Stats()
    _check(_c().adaptalloc_stats_sized(device, ctypes.byref(s), ctypes.sizeof(s)), "memory_stats(device=%d)" % device)
    out = {name: getattr(s, name) for name in _STAT_FIELDS}
    out.update(_native.torch_stats(device) or {})
    return out


def reset_peak_stats(device=None):
    """Restarts ``device``'s (default: the current device's) peak statistics from their current
    values."""
    device = _device_or_current(device)
    _check(_c().adaptalloc_reset_peak_stats(device), "reset_peak_stats(device=%d)" % device)


def empty_cache():
    """Gives idle memory of every device back to the driver; returns the bytes released."""
    return int(_c().adaptalloc_empty_cache())


def synchronize_stream(stream, device=None):
    """Says that ``stream``'s queued work is done (after you synchronized it): memory freed on
    it then serves every stream. ``stream`` is a ``cudaStream_t`` as an int (``torch.cuda.Stream
    .cuda_stream``) or 0 for the default stream; ``device`` defaults to the current device."""
    device, stream = _device_or_current(device), _stream(stream)
    _check(
        _c().adaptalloc_synchronize_stream(device, ctypes.c_void_p(stream or None)),
        "synchronize_stream(device=%d)" % device,
    )


def _source(snapshot):
    """(path, data) for the native calls: a path, bytes of a pickled snapshot, or the dict
    torch.cuda.memory._snapshot() returns."""
    if isinstance(snapshot, (str, os.PathLike)):
        return os.fspath(snapshot), None
    if isinstance(snapshot, (bytes, bytearray, memoryview)):
        return None, bytes(snapshot)
    if isinstance(snapshot, dict):
        return None, pickle.dumps(snapshot)
    raise TypeError(
        "snapshot: give a path, the bytes of a pickled snapshot, or the dict of "
        "torch.cuda.memory._snapshot() (got %s)" % type(snapshot).__name__
    )


def _repeat(repeat):
    """``repeat`` checked before the native call: an int of passes, 1 to 10,000."""
    if isinstance(repeat, bool) or not isinstance(repeat, int):
        raise TypeError("repeat: give an int of passes, 1 to 10,000 (got %r)" % (repeat,))
    if not 1 <= repeat <= 10_000:
        raise ValueError("repeat must be 1 to 10,000 (got %d)" % repeat)
    return repeat


def _cost_model(cost_model):
    """``cost_model`` as a path string, or None for the built-in default model."""
    if cost_model is None:
        return None
    if not isinstance(cost_model, (str, os.PathLike)):
        raise TypeError("cost_model: give the path of a cost model file (got %s)" % type(cost_model).__name__)
    return os.fspath(cost_model)


def analyze_snapshot(snapshot, capacity=None, capacity_factor=None, strategies=None, pytorch_conf=None,
                     repeat=1, cost_model=None):
    """What adaptalloc's strategies and the allocators people run (PyTorch's, with
    ``pytorch_conf`` as PYTORCH_CUDA_ALLOC_CONF; CUDA's pool; RMM; IREE) do on ``snapshot``, on a
    simulated device of ``capacity`` bytes or ``capacity_factor`` x the snapshot's peak (80 GiB
    when neither is given). ``strategies``: one name or a list (all of them when None).
    ``repeat``: passes back to back (training steps; with 2 or more, each result splits its
    modelled time into ``first_pass_ns``, ``warmup_ns`` and ``steady_pass_ns``). ``cost_model``:
    a cost model file to price driver calls with (``adaptalloc gpu-bench`` writes one for your
    GPU; the built-in default when None). The same structure as ``adaptalloc compare --format
    json``."""
    path, data = _source(snapshot)
    repeat, cost_model = _repeat(repeat), _cost_model(cost_model)
    if isinstance(strategies, str):
        strategies = [strategies]  # one name, not its letters
    if strategies is not None:
        strategies = list(strategies)
        for name in strategies:
            if not isinstance(name, str):
                raise TypeError("strategies: give a name or a list of names (got %r in it)" % (name,))
    text = _native.compare_json(
        path=path,
        data=data,
        capacity=capacity,
        capacity_factor=capacity_factor,
        strategies=strategies,
        pytorch_conf=pytorch_conf,
        repeat=repeat,
        cost_model=cost_model,
    )
    return json.loads(text)


def tune(snapshot, capacity=None, capacity_factor=None, policy=None, repeat=1, cost_model=None, tenant=None):
    """``adaptalloc tune`` on ``snapshot``: the base policy (``policy``, a preset name or a policy
    file; the default when None) and a grid of variants of it, ``suballoc.backing`` included,
    each replayed ``repeat`` times on a simulated device of ``capacity`` bytes or
    ``capacity_factor`` x the snapshot's peak, priced by ``cost_model`` (a file; the built-in
    default when None), beside the co-tenant ``tenant`` ("SIZE@START..END", e.g.
    "2GiB@0.3..0.6") when given. The winner fails least (a co-tenant's refused take counts),
    then takes the least modelled driver time over all passes. Returns a dict: ``trials``,
    ``best`` (the winner's index), ``why``, ``smallest`` (the smallest device each trace
    completes on, under the base policy and the winner), ``policy_toml`` (the winner as a
    policy file, for ``ADAPTALLOC_POLICY`` or ``install(policy=...)``) and ``markdown`` (the
    command line's table)."""
    path, data = _source(snapshot)
    repeat, cost_model = _repeat(repeat), _cost_model(cost_model)
    if tenant is not None and not isinstance(tenant, str):
        raise TypeError("tenant: give SIZE@START..END as a str, e.g. \"2GiB@0.3..0.6\" (got %s)"
                        % type(tenant).__name__)
    text = _native.tune_json(
        path=path, data=data, capacity=capacity, capacity_factor=capacity_factor, policy=policy,
        repeat=repeat, cost_model=cost_model, tenant=tenant,
    )
    return json.loads(text)


def report(snapshot, capacity=None, capacity_factor=None, policy=None, repeat=1, cost_model=None):
    """The tuning report (Markdown) of the default policy, or ``policy`` (a preset name or a
    policy file), replaying ``snapshot`` ``repeat`` times on a simulated device, priced by
    ``cost_model`` (a file; the built-in default when None). Its advice is kept only where
    replaying it over ten passes, at those prices, fails nothing more, costs less in all and
    no more a pass once warm."""
    path, data = _source(snapshot)
    repeat, cost_model = _repeat(repeat), _cost_model(cost_model)
    return _native.report_markdown(
        path=path, data=data, capacity=capacity, capacity_factor=capacity_factor, policy=policy,
        repeat=repeat, cost_model=cost_model,
    )
