/* A stub CUDA driver for tests: exports just the driver functions CudaDevice calls, backed by
 * host memory with a set capacity (STUB_CUDA_CAPACITY bytes, default 64 MiB), refusing
 * allocations beyond it with CUDA_ERROR_OUT_OF_MEMORY. Built by tests/cuda_stub.rs with the
 * system C compiler and loaded through cudarc's dynamic loading (LD_LIBRARY_PATH). Not shipped. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef uint64_t CUdeviceptr;

enum { SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101,
       INVALID_CONTEXT = 201 };
enum { MAX_BLOCKS = 1 << 16, MAX_DEVICES = 8 };

/* Each block remembers the device whose context was current when it was allocated; freeing it
 * needs that context current again. Devices share one capacity. */
static struct { CUdeviceptr ptr; size_t size; int dev; } blocks[MAX_BLOCKS];
static size_t used, capacity;
static int initialized;
/* One primary context per device (STUB_CUDA_DEVICES, default 1), current per thread as in CUDA. */
static int context_tokens[MAX_DEVICES];
static __thread CUcontext current;
/* Queued work (see stub_queue_work below): ranges in use, and unmaps that hit one. */
static int queued, unsafe_unmaps;

static int devices(void) {
    const char *env = getenv("STUB_CUDA_DEVICES");
    int n = env ? atoi(env) : 1;
    return n < 1 ? 1 : n > MAX_DEVICES ? MAX_DEVICES : n;
}

/* The device whose context is current on this thread, or -1. */
static int current_device(void) {
    for (int d = 0; d < devices(); d++)
        if (current == &context_tokens[d]) return d;
    return -1;
}

static size_t cap(void) {
    if (!capacity) {
        const char *env = getenv("STUB_CUDA_CAPACITY");
        capacity = env ? (size_t)strtoull(env, 0, 10) : (size_t)64 << 20;
    }
    return capacity;
}

CUresult cuInit(unsigned flags) { (void)flags; initialized = 1; return SUCCESS; }

CUresult cuDeviceGet(CUdevice *dev, int ordinal) {
    if (!initialized) return NOT_INITIALIZED;
    if (ordinal < 0 || ordinal >= devices()) return INVALID_DEVICE;
    *dev = ordinal;
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (dev < 0 || dev >= devices()) return INVALID_DEVICE;
    *ctx = &context_tokens[dev];
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return dev >= 0 && dev < devices() ? SUCCESS : INVALID_DEVICE; }

CUresult cuCtxSetCurrent(CUcontext ctx) {
    if (ctx != 0) {
        int ok = 0;
        for (int d = 0; d < devices(); d++) ok |= ctx == &context_tokens[d];
        if (!ok) return INVALID_VALUE;
    }
    current = ctx;
    return SUCCESS;
}

CUresult cuCtxGetCurrent(CUcontext *ctx) { *ctx = current; return SUCCESS; }

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (dev < 0 || dev >= devices() || len <= 0) return INVALID_VALUE;
    strncpy(name, "adaptalloc stub GPU", (size_t)len - 1);
    name[len - 1] = 0;
    return SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    if (current_device() < 0) return INVALID_CONTEXT;
    *free_bytes = cap() - used;
    *total = cap();
    return SUCCESS;
}

typedef void *CUstream;
/* CUDA graph capture: stub_begin_capture(s) marks stream s as being captured until
 * stub_end_capture(s), and cuStreamIsCapturing answers. As the driver in the default (global)
 * capture mode, a query of or synchronization on a capturing stream, an event recorded there
 * (legal in a capture, but a graph node then, not a point the allocator may ask about), and a
 * cuMemFree or cuCtxSynchronize while any stream captures fail with
 * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and count in stub_capture_violations. */
enum { MAX_CAPTURES = 8, CAPTURE_UNSUPPORTED = 900 };
static CUstream captures[MAX_CAPTURES];
static int capture_count, capture_violations;
void stub_begin_capture(CUstream s) { if (capture_count < MAX_CAPTURES) captures[capture_count++] = s; }
void stub_end_capture(CUstream s) {
    for (int i = 0; i < capture_count; i++)
        if (captures[i] == s) { captures[i] = captures[--capture_count]; return; }
}
int stub_capture_violations(void) { return capture_violations; }
static int is_capturing(CUstream s) {
    for (int i = 0; i < capture_count; i++)
        if (captures[i] == s) return 1;
    return 0;
}
/* A call refused on a capturing stream (s), or (s == ANY_STREAM) while any capture is under way. */
#define ANY_STREAM ((CUstream)~0UL)
static int refused_in_capture(CUstream s) {
    if (s == ANY_STREAM ? capture_count > 0 : is_capturing(s)) { capture_violations++; return 1; }
    return 0;
}
/* The thread's capture mode (cuThreadExchangeStreamCaptureMode): 0 global (the default),
 * 1 thread-local, 2 relaxed. Outside relaxed mode, a cuMemAlloc, cuMemCreate or cuMemMap while
 * a capture is under way is refused and counted too (PyTorch relaxes the mode around them). */
static __thread int capture_mode;
CUresult cuThreadExchangeStreamCaptureMode(int *mode) {
    if (!mode || *mode < 0 || *mode > 2) return INVALID_VALUE;
    int old = capture_mode;
    capture_mode = *mode;
    *mode = old;
    return SUCCESS;
}
static int allocation_refused_in_capture(void) { return capture_mode != 2 && refused_in_capture(ANY_STREAM); }
CUresult cuStreamIsCapturing(CUstream stream, int *status) {
    if (!status) return INVALID_VALUE;
    *status = is_capturing(stream); /* CU_STREAM_CAPTURE_STATUS_NONE 0, _ACTIVE 1 */
    return SUCCESS;
}
CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    if (size == 0) return INVALID_VALUE;
    if (allocation_refused_in_capture()) return CAPTURE_UNSUPPORTED;
    if (current_device() < 0) return INVALID_CONTEXT;
    if (size > cap() - used) return OUT_OF_MEMORY;
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (!blocks[i].ptr) {
            void *p = aligned_alloc(256, (size + 255) & ~(size_t)255);
            if (!p) return OUT_OF_MEMORY;
            blocks[i].ptr = (CUdeviceptr)(uintptr_t)p;
            blocks[i].size = size;
            blocks[i].dev = current_device();
            used += size;
            *dptr = blocks[i].ptr;
            return SUCCESS;
        }
    }
    return OUT_OF_MEMORY;
}
static void synchronize_device(void);
/* cuMemFree synchronizes the device, as cudaFree does: queued work is done once it returns. */
static CUresult free_block(CUdeviceptr ptr, int sync) {
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (blocks[i].ptr == ptr && ptr) {
            if (blocks[i].dev != current_device()) return INVALID_CONTEXT;
            if (sync) synchronize_device();
            free((void *)(uintptr_t)ptr);
            used -= blocks[i].size;
            blocks[i].ptr = 0;
            return SUCCESS;
        }
    }
    return INVALID_VALUE;
}
CUresult cuMemFree_v2(CUdeviceptr ptr) {
    if (refused_in_capture(ANY_STREAM)) return CAPTURE_UNSUPPORTED;
    return free_block(ptr, 1);
}

/* The stream-ordered pool: allocations as above (no caching), the pool's high watermark kept. */
typedef void *CUmemoryPool;
static int pool_token;
static size_t pool_high;
enum { ATTR_RELEASE_THRESHOLD = 4, ATTR_RESERVED_MEM_HIGH = 6 };

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (dev < 0 || dev >= devices()) return INVALID_DEVICE;
    *pool = &pool_token;
    return SUCCESS;
}
CUresult cuMemPoolSetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (pool != &pool_token || !value) return INVALID_VALUE;
    if (attr == ATTR_RESERVED_MEM_HIGH) pool_high = used;
    return attr == ATTR_RELEASE_THRESHOLD || attr == ATTR_RESERVED_MEM_HIGH ? SUCCESS : INVALID_VALUE;
}
CUresult cuMemPoolGetAttribute(CUmemoryPool pool, int attr, void *value) {
    if (pool != &pool_token || !value || attr != ATTR_RESERVED_MEM_HIGH) return INVALID_VALUE;
    *(uint64_t *)value = pool_high;
    return SUCCESS;
}
CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t size, CUstream stream) {
    (void)stream;
    CUresult r = cuMemAlloc_v2(dptr, size);
    if (r == SUCCESS && used > pool_high) pool_high = used;
    return r;
}
/* Stream-ordered: no synchronization. */
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) { (void)stream; return free_block(ptr, 0); }
/* Kernels per stream, for tests: stub_stream_work(s, n) queues n on stream s (a handle value,
 * never dereferenced), stub_stream_finish(s, n) completes the oldest n. A stream is idle when
 * all it queued completed; cuStreamSynchronize completes its work (and, with cuCtxSynchronize,
 * the ranges of stub_queue_work below), counted in stub_stream_syncs. */
enum { MAX_STREAMS = 256, NOT_READY = 600 };
static struct { CUstream s; unsigned long queued, done; } streams[MAX_STREAMS];
static int stream_count, stream_syncs, event_syncs;
static int stream_slot(CUstream s) {
    for (int i = 0; i < stream_count; i++)
        if (streams[i].s == s) return i;
    if (stream_count == MAX_STREAMS) return -1;
    streams[stream_count].s = s;
    return stream_count++;
}
void stub_stream_work(CUstream s, int n) { int i = stream_slot(s); if (i >= 0) streams[i].queued += n; }
void stub_stream_finish(CUstream s, int n) {
    int i = stream_slot(s);
    if (i < 0) return;
    streams[i].done += n;
    if (streams[i].done > streams[i].queued) streams[i].done = streams[i].queued;
}
int stub_stream_pending(CUstream s) { int i = stream_slot(s); return i < 0 ? 0 : (int)(streams[i].queued - streams[i].done); }
/* Kernels completed on stream s so far (a kernel queued as the n-th on s is done once this is >= n). */
unsigned long stub_stream_completed(CUstream s) { int i = stream_slot(s); return i < 0 ? ~0UL : streams[i].done; }
int stub_stream_syncs(void) { return stream_syncs; }
int stub_event_syncs(void) { return event_syncs; }
CUresult cuStreamSynchronize(CUstream stream) {
    if (refused_in_capture(stream)) return CAPTURE_UNSUPPORTED;
    int i = stream_slot(stream);
    if (i >= 0) streams[i].done = streams[i].queued;
    stream_syncs++;
    queued = 0;
    return SUCCESS;
}
CUresult cuStreamQuery(CUstream stream) {
    if (refused_in_capture(stream)) return CAPTURE_UNSUPPORTED;
    int i = stream_slot(stream);
    return i < 0 || streams[i].done == streams[i].queued ? SUCCESS : NOT_READY;
}
/* Events: an event recorded on a stream completes once the stream's work queued before the
 * record has. cudarc's CudaSlice (AdaptSlice) and CudaDevice's checkpoints use them. */
typedef struct { CUstream s; unsigned long target; int recorded; } *CUevent;
static int live_events;
int stub_live_events(void) { return live_events; }
CUresult cuEventCreate(CUevent *ev, unsigned flags) {
    (void)flags;
    if (!current) return INVALID_CONTEXT;
    *ev = calloc(1, sizeof(**ev));
    if (!*ev) return OUT_OF_MEMORY;
    live_events++;
    return SUCCESS;
}
CUresult cuEventDestroy_v2(CUevent ev) { if (!ev) return INVALID_VALUE; free(ev); live_events--; return SUCCESS; }
CUresult cuEventRecord(CUevent ev, CUstream stream) {
    if (!ev) return INVALID_VALUE;
    if (refused_in_capture(stream)) return CAPTURE_UNSUPPORTED;
    int i = stream_slot(stream);
    ev->s = stream;
    ev->target = i < 0 ? 0 : streams[i].queued;
    ev->recorded = 1;
    return SUCCESS;
}
CUresult cuEventQuery(CUevent ev) {
    if (!ev) return INVALID_VALUE;
    int i = ev->recorded ? stream_slot(ev->s) : -1;
    return i < 0 || streams[i].done >= ev->target ? SUCCESS : NOT_READY;
}
CUresult cuEventSynchronize(CUevent ev) {
    if (!ev) return INVALID_VALUE;
    int i = ev->recorded ? stream_slot(ev->s) : -1;
    if (i >= 0 && streams[i].done < ev->target) streams[i].done = ev->target;
    event_syncs++;
    return SUCCESS;
}
CUresult cuStreamWaitEvent(CUstream stream, CUevent ev, unsigned flags) {
    (void)stream; (void)flags;
    return ev ? SUCCESS : INVALID_VALUE;
}
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) { (void)keep; return pool == &pool_token ? SUCCESS : INVALID_VALUE; }

/* Virtual memory management: address ranges from a counter (never dereferenced), physical pages
 * counted against the capacity from cuMemCreate until every reference is released (cuMemCreate
 * and cuMemRetainAllocationHandle take one) and every mapping unmapped. A page may be mapped at
 * up to MAX_MAPS addresses. */
typedef unsigned long long CUmemGenericAllocationHandle;
enum { ATTR_VMM_SUPPORTED = 102, MAX_HANDLES = 1 << 16, MAX_MAPS = 4, STUB_PAGE = 2 << 20, ILLEGAL_ADDRESS_COPY = 700 };
static struct { size_t size; int live, refs, maps; CUdeviceptr va[MAX_MAPS]; } handles[MAX_HANDLES];
static CUdeviceptr next_va = (CUdeviceptr)1 << 44;

/* The handle mapped at `ptr` and the mapping's slot, or 0. */
static int mapping_at(CUdeviceptr ptr, int *slot) {
    for (int i = 1; i < MAX_HANDLES; i++)
        for (int m = 0; handles[i].live && m < handles[i].maps; m++)
            if (handles[i].va[m] == ptr) { *slot = m; return i; }
    return 0;
}
CUresult cuDeviceGetAttribute(int *value, int attr, CUdevice dev) {
    if (dev < 0 || dev >= devices()) return INVALID_DEVICE;
    const char *vmm = getenv("STUB_CUDA_VMM");
    *value = attr == ATTR_VMM_SUPPORTED ? (vmm ? atoi(vmm) : 1) : 0;
    return SUCCESS;
}
CUresult cuMemGetAllocationGranularity(size_t *granularity, const void *prop, int option) {
    (void)prop; (void)option;
    *granularity = STUB_PAGE;
    return SUCCESS;
}
CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
    (void)alignment; (void)addr; (void)flags;
    if (size == 0 || size % STUB_PAGE) return INVALID_VALUE;
    *ptr = next_va;
    next_va += size + STUB_PAGE; /* a gap between reservations */
    return SUCCESS;
}
CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
    for (int i = 1; i < MAX_HANDLES; i++)
        for (int m = 0; handles[i].live && m < handles[i].maps; m++)
            if (handles[i].va[m] >= ptr && handles[i].va[m] < ptr + size) return INVALID_VALUE; /* still mapped */
    return SUCCESS;
}
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const void *prop, unsigned long long flags) {
    (void)prop; (void)flags;
    if (size == 0 || size % STUB_PAGE) return INVALID_VALUE;
    if (allocation_refused_in_capture()) return CAPTURE_UNSUPPORTED;
    if (size > cap() - used) return OUT_OF_MEMORY;
    for (int i = 1; i < MAX_HANDLES; i++) {
        if (!handles[i].live) {
            handles[i].size = size;
            handles[i].live = 1;
            handles[i].refs = 1;
            handles[i].maps = 0;
            used += size;
            *handle = (CUmemGenericAllocationHandle)i;
            return SUCCESS;
        }
    }
    return OUT_OF_MEMORY;
}
/* Contents, for tests of what copies keep: a tag per page of a handle (stub_write_tag,
 * stub_read_tag), carried by cuMemcpyDtoD_v2 and gone with the handle's memory. */
enum { MAX_TAGS = 1024 };
static struct { int h; size_t off; unsigned long long v; } tags[MAX_TAGS];
static void drop_tags(int h) {
    for (int t = 0; t < MAX_TAGS; t++)
        if (tags[t].h == h) tags[t].h = 0;
}
static void settle(int i) {
    if (handles[i].live && handles[i].refs == 0 && handles[i].maps == 0) {
        used -= handles[i].size;
        handles[i].live = 0;
        drop_tags(i);
    }
}
/* The handle mapped over `va` (anywhere in it) and the page's offset in the handle, or 0. */
static int mapped_over(CUdeviceptr va, size_t *off) {
    for (int i = 1; i < MAX_HANDLES; i++)
        for (int m = 0; handles[i].live && m < handles[i].maps; m++)
            if (va >= handles[i].va[m] && va < handles[i].va[m] + handles[i].size) {
                *off = (va - handles[i].va[m]) / STUB_PAGE * STUB_PAGE;
                return i;
            }
    return 0;
}
static int tag_slot(int h, size_t off) {
    for (int t = 0; t < MAX_TAGS; t++)
        if (tags[t].h == h && tags[t].off == off) return t;
    return -1;
}
static void set_tag(int h, size_t off, unsigned long long v) {
    int t = tag_slot(h, off);
    for (int f = 0; t < 0 && f < MAX_TAGS; f++)
        if (!tags[f].h) t = f;
    if (t >= 0) { tags[t].h = h; tags[t].off = off; tags[t].v = v; }
}
/* Writes `v` to the mapped page over `va`; 0 where nothing is mapped. */
int stub_write_tag(CUdeviceptr va, unsigned long long v) {
    size_t off;
    int h = mapped_over(va, &off);
    if (!h) return 0;
    set_tag(h, off, v);
    return 1;
}
/* The tag of the mapped page over `va`, or 0 (nothing mapped, or never written). */
unsigned long long stub_read_tag(CUdeviceptr va) {
    size_t off;
    int h = mapped_over(va, &off), t = h ? tag_slot(h, off) : -1;
    return t < 0 ? 0 : tags[t].v;
}
/* Copies between mapped pages and host memory, whole pages only (all the allocator copies):
 * a page's tag travels in the first 8 bytes of its host copy. */
CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t size) {
    if (size == 0 || size % STUB_PAGE || src % STUB_PAGE) return INVALID_VALUE;
    for (size_t o = 0; o < size; o += STUB_PAGE) {
        size_t so;
        int sh = mapped_over(src + o, &so);
        if (!sh) return ILLEGAL_ADDRESS_COPY;
        int t = tag_slot(sh, so);
        unsigned long long v = t < 0 ? 0 : tags[t].v;
        memcpy((char *)dst + o, &v, sizeof v);
    }
    return SUCCESS;
}
CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t size) {
    if (size == 0 || size % STUB_PAGE || dst % STUB_PAGE) return INVALID_VALUE;
    for (size_t o = 0; o < size; o += STUB_PAGE) {
        size_t dof;
        int dh = mapped_over(dst + o, &dof);
        if (!dh) return ILLEGAL_ADDRESS_COPY;
        unsigned long long v;
        memcpy(&v, (const char *)src + o, sizeof v);
        set_tag(dh, dof, v);
    }
    return SUCCESS;
}
/* Device-to-device copies of whole mapped pages (all the allocator copies): each page's tag. */
CUresult cuMemcpyDtoD_v2(CUdeviceptr dst, CUdeviceptr src, size_t size) {
    if (size == 0 || size % STUB_PAGE || dst % STUB_PAGE || src % STUB_PAGE) return INVALID_VALUE;
    for (size_t o = 0; o < size; o += STUB_PAGE) {
        size_t so, dof;
        int sh = mapped_over(src + o, &so), dh = mapped_over(dst + o, &dof);
        if (!sh || !dh) return ILLEGAL_ADDRESS_COPY;
        int t = tag_slot(sh, so);
        set_tag(dh, dof, t < 0 ? 0 : tags[t].v);
    }
    return SUCCESS;
}
CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
    (void)flags;
    if (allocation_refused_in_capture()) return CAPTURE_UNSUPPORTED;
    int slot;
    if (h == 0 || h >= MAX_HANDLES || !handles[h].live || handles[h].refs == 0) return INVALID_VALUE;
    if (offset != 0 || size != handles[h].size || ptr % STUB_PAGE || handles[h].maps == MAX_MAPS) return INVALID_VALUE;
    if (mapping_at(ptr, &slot)) return INVALID_VALUE; /* already mapped there */
    handles[h].va[handles[h].maps++] = ptr;
    return SUCCESS;
}
CUresult cuMemRetainAllocationHandle(CUmemGenericAllocationHandle *handle, void *addr) {
    int slot, i = mapping_at((CUdeviceptr)addr, &slot);
    if (!i) return INVALID_VALUE;
    handles[i].refs++;
    *handle = (CUmemGenericAllocationHandle)i;
    return SUCCESS;
}
CUresult cuMemRelease(CUmemGenericAllocationHandle h) {
    if (h == 0 || h >= MAX_HANDLES || !handles[h].live || handles[h].refs == 0) return INVALID_VALUE;
    handles[h].refs--;
    settle((int)h);
    return SUCCESS;
}
/* As the driver: the range is whole mappings, one after another (any number of them). */
CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const void *desc, size_t count) {
    (void)desc;
    if (count != 1 || size == 0) return INVALID_VALUE;
    CUdeviceptr va = ptr;
    while (va < ptr + size) {
        int slot, i = mapping_at(va, &slot);
        if (!i) return INVALID_VALUE;
        va += handles[i].size;
    }
    return va == ptr + size ? SUCCESS : INVALID_VALUE;
}
/* Queued work, for tests: stub_queue_work(ptr, size) says a kernel that uses ptr..ptr+size is
 * queued and has not finished. cuCtxSynchronize and cuStreamSynchronize finish all of it.
 * Unmapping memory that queued work uses is what the real driver turns into an illegal address
 * fault in that kernel: here the unmap fails with CUDA_ERROR_ILLEGAL_ADDRESS and is counted
 * (stub_unsafe_unmaps). */
enum { MAX_WORK = 1024, ILLEGAL_ADDRESS = 700 };
static struct { CUdeviceptr ptr; size_t size; } work[MAX_WORK];
void stub_queue_work(CUdeviceptr ptr, size_t size) {
    if (queued < MAX_WORK) { work[queued].ptr = ptr; work[queued].size = size; queued++; }
}
int stub_unsafe_unmaps(void) { return unsafe_unmaps; }
/* Kernels that use a range and run on a stream, for the stream harness: stub_stream_kernel(s,
 * ptr, size) queues one on stream s and returns its place in s's queue (it is done once
 * stub_stream_completed(s) reaches that). Unmapping a range a pending kernel uses fails as above. */
enum { MAX_KERNELS = 1 << 14 };
static struct { CUdeviceptr ptr; size_t size; int slot; unsigned long index; } kernels[MAX_KERNELS];
static int kernel_count;
static int kernel_pending(int k) { return streams[kernels[k].slot].done < kernels[k].index; }
unsigned long stub_stream_kernel(CUstream s, CUdeviceptr ptr, size_t size) {
    int i = stream_slot(s);
    if (i < 0) return 0;
    if (kernel_count == MAX_KERNELS) { /* forget the finished ones */
        int kept = 0;
        for (int k = 0; k < kernel_count; k++)
            if (kernel_pending(k)) kernels[kept++] = kernels[k];
        kernel_count = kept;
    }
    unsigned long index = ++streams[i].queued;
    if (kernel_count < MAX_KERNELS) {
        kernels[kernel_count].ptr = ptr;
        kernels[kernel_count].size = size;
        kernels[kernel_count].slot = i;
        kernels[kernel_count].index = index;
        kernel_count++;
    }
    return index;
}
static void synchronize_device(void) {
    queued = 0;
    kernel_count = 0;
    for (int i = 0; i < stream_count; i++) streams[i].done = streams[i].queued;
}
CUresult cuCtxSynchronize(void) {
    if (refused_in_capture(ANY_STREAM)) return CAPTURE_UNSUPPORTED;
    synchronize_device();
    return SUCCESS;
}
static int work_touches(CUdeviceptr ptr, size_t size) {
    for (int w = 0; w < queued; w++)
        if (work[w].ptr < ptr + size && ptr < work[w].ptr + work[w].size) return 1;
    for (int k = 0; k < kernel_count; k++)
        if (kernel_pending(k) && kernels[k].ptr < ptr + size && ptr < kernels[k].ptr + kernels[k].size) return 1;
    return 0;
}

CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
    if (work_touches(ptr, size)) { unsafe_unmaps++; return ILLEGAL_ADDRESS; }
    /* As the driver: only whole mappings unmap. */
    int slot, i = mapping_at(ptr, &slot);
    if (!i || handles[i].size != size) return INVALID_VALUE;
    handles[i].va[slot] = handles[i].va[--handles[i].maps];
    settle(i);
    return SUCCESS;
}
