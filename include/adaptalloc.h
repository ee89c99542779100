/* adaptalloc: a GPU memory allocator with a policy engine. C ABI.
 *
 * Build the library with:  cargo build --release -p adaptalloc-capi
 * (target/release/libadaptalloc.so). The signatures of adaptalloc_malloc and adaptalloc_free
 * are those of PyTorch's torch.cuda.memory.CUDAPluggableAllocator.
 *
 * Environment: ADAPTALLOC_POLICY (policy file or preset name; the default policy when unset),
 * ADAPTALLOC_REPORT (tuning report written at exit: .md, .toml or .json; device 0 writes the
 * path as given, device N puts N before the extension: rep.md, rep.1.md, rep.2.md),
 * ADAPTALLOC_PROFILE (a workload profile, per device as the report: read at the start, where the
 * file exists, for the peak earlier runs of the workload showed, so that this run backs memory
 * with large handles from its first request; updated at exit. One file per workload),
 * ADAPTALLOC_DEVICE (`cuda`, the default, or `sim:SIZE` for a simulated device),
 * ADAPTALLOC_LOG (the engine's events printed to stderr from this level up: off, error, warn
 * (the default), info (every route change and release), debug, trace).
 * A broken ADAPTALLOC_POLICY, ADAPTALLOC_PROFILE or ADAPTALLOC_DEVICE is printed once to stderr (file, line and key)
 * besides making adaptalloc_malloc return NULL with the reason in adaptalloc_last_error().
 * fork(): a child gets allocators of its own on its first call (never its parent's, whose locks
 * another parent thread may have held) and writes no report or profile.
 */
#ifndef ADAPTALLOC_H
#define ADAPTALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A cudaStream_t, without requiring the CUDA headers. */
typedef void *adaptalloc_stream_t;

/* The ABI version: 1, the first ten fields of AdaptallocStats; 2, stream_reclaims and
 * stream_waits added; 3, adaptalloc_stats_sized and adaptalloc_abi_version added, and
 * adaptalloc_stats writing the version-1 fields only; 4, PyTorch's other hooks
 * (adaptalloc_torch_hook and the calls below it) and private pools; 5, driver_allocs and
 * driver_frees count every physical handle (each cuMemCreate and cuMemRelease, not each
 * mapping call), and vmm_calls added. */
#define ADAPTALLOC_ABI_VERSION 5

/* Statistics of one device's allocator. Fields are only ever added at the end; the version each
 * came in is marked. Fill it with adaptalloc_stats_sized(device, &s, sizeof s). */
typedef struct AdaptallocStats {
    /* Version 1. */
    uint64_t live_bytes;
    uint64_t peak_live_bytes;
    uint64_t reserved_bytes;
    uint64_t peak_reserved_bytes;
    uint64_t idle_bytes;
    uint64_t live_blocks;
    /* Physical allocations and frees: cuMemAlloc calls and every handle created (cuMemCreate);
     * cuMemFree calls and every handle reference given back (cuMemRelease). Since version 5 a
     * handle each; before, a mapping call each. */
    uint64_t driver_allocs;
    uint64_t driver_frees;
    uint64_t failed_allocs;
    uint64_t oom_recoveries;
    /* Version 2. Times memory freed on a stream came to serve every stream because the stream's work was
     * done (queried), and waits on a stream's work before failing a request. */
    uint64_t stream_reclaims;
    uint64_t stream_waits;
    /* Version 5. Mapping calls: maps of new handles (a run mapped at once is one), moves of idle
     * handles to where they are needed, second mappings, and their unmaps. */
    uint64_t vmm_calls;
} AdaptallocStats;

/* Allocates size bytes on device for stream; 256-byte aligned. NULL on failure: read the
 * reason with adaptalloc_last_error(). */
void *adaptalloc_malloc(size_t size, int device, adaptalloc_stream_t stream);

/* Frees a pointer from adaptalloc_malloc, on the device and stream it was allocated on. */
void adaptalloc_free(void *ptr, size_t size, int device, adaptalloc_stream_t stream);

/* Gives idle memory of every device back to the driver; returns the bytes released. */
uint64_t adaptalloc_empty_cache(void);

/* Fills the first out_size bytes of *out (whole fields, at most sizeof(AdaptallocStats)) with
 * device's statistics, never more; 0 on success, -1 if out is NULL or nothing was allocated on
 * that device yet. Pass sizeof your struct: a library newer than your header writes only the
 * fields you know. (Since version 3.) */
int adaptalloc_stats_sized(int device, AdaptallocStats *out, size_t out_size);

/* Fills the version-1 fields of *out (the first ten, 80 bytes) and nothing beyond, for callers
 * built before adaptalloc_stats_sized; 0, or -1 as above. */
int adaptalloc_stats(int device, AdaptallocStats *out);

/* The library's ADAPTALLOC_ABI_VERSION. (Since version 3.) */
uint32_t adaptalloc_abi_version(void);

/* Tells device's allocator that all work queued on stream has completed (after
 * cudaStreamSynchronize): memory freed on it then serves every stream at once. Without it, such
 * memory serves other streams once the driver reports the stream idle, or after a wait before a
 * request would fail. 0, or -1 when nothing was allocated on device yet. */
int adaptalloc_synchronize_stream(int device, adaptalloc_stream_t stream);

/* Marks ptr (live, from adaptalloc_malloc on device) as used by stream too, as PyTorch's
 * recordStream does for a tensor used on a side stream (NCCL's, say): once freed, it is not
 * reused until stream's work up to the free is done. 0, or -1 (no allocator on device, or ptr
 * not live; the reason in adaptalloc_last_error()). */
int adaptalloc_record_stream(void *ptr, int device, adaptalloc_stream_t stream);

/* Restarts device's peak statistics from their current values. 0, or -1 as above. */
int adaptalloc_reset_peak_stats(int device);

/* Private pools (CUDA graph capture, torch.cuda.MemPool). Since version 4. */

/* A stream filter: nonzero when stream allocates to the pool. */
typedef int (*adaptalloc_stream_filter)(void *ctx, adaptalloc_stream_t stream);

/* Opens a window in which device's requests on streams filter takes (every stream when filter
 * is NULL) come from private pool (id0, id1), made on first use: its blocks are never handed out
 * outside it. Until the window ends the allocator gives no memory back to the driver and waits
 * on no stream (either could break a capture); a request that would need that fails, saying so.
 * Takes ownership of ctx: drop(ctx), if drop is not NULL, is called once, when the window ends
 * or before returning -1. filter must not call adaptalloc. 0, or -1. */
int adaptalloc_begin_pool(int device, uint64_t id0, uint64_t id1, adaptalloc_stream_filter filter,
                          void *ctx, void (*drop)(void *ctx));

/* Ends pool (id0, id1)'s latest window on device (call it after the capture ends): blocks freed
 * meanwhile go back. 0, or -1 (no such window). */
int adaptalloc_end_pool(int device, uint64_t id0, uint64_t id1);

/* Pool (id0, id1) is no longer needed: its memory goes back once its last block is freed. 0, or
 * -1 (no such pool). */
int adaptalloc_release_pool(int device, uint64_t id0, uint64_t id1);

/* PyTorch's CUDAPluggableAllocator hooks. Since version 4. */

/* The address to give PyTorch's setter for hook name: "malloc", "free", "reset"
 * (set_reset_fn), "record_stream", "memory_fraction", "init", "begin_allocate_to_pool",
 * "end_allocate_to_pool", "release_pool". Each has the signature PyTorch casts it to; the three
 * pool hooks are C++ functions taking c10::cuda::MempoolId_t and std::function by value
 * (capi/src/torch_hooks.cpp). NULL for another name. */
void *adaptalloc_torch_hook(const char *name);

/* reset: torch.cuda.empty_cache() gives every device's idle memory back. */
void adaptalloc_torch_empty_cache(void);

/* record_stream, with PyTorch's two arguments: as adaptalloc_record_stream on the device whose
 * allocator holds ptr. Errors go to adaptalloc_last_error(). */
void adaptalloc_torch_record_stream(void *ptr, adaptalloc_stream_t stream);

/* memory_fraction (set_per_process_memory_fraction): caps what device's allocator may hold at
 * fraction (0 < fraction <= 1) of the device's memory; a request past the cap releases idle
 * memory and retries, then fails as out-of-memory. */
void adaptalloc_set_memory_fraction(double fraction, int device);

/* init, when CUDA initializes: checks ADAPTALLOC_POLICY now (printing a broken one once). */
void adaptalloc_torch_init(int device_count);

/* The last error on this thread ("" when none: every successful call clears it); valid until
 * the next adaptalloc call. */
const char *adaptalloc_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* ADAPTALLOC_H */
