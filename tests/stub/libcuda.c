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

enum { SUCCESS = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, NOT_INITIALIZED = 3, INVALID_DEVICE = 101 };
enum { MAX_BLOCKS = 1 << 16 };

static struct { CUdeviceptr ptr; size_t size; } blocks[MAX_BLOCKS];
static size_t used, capacity;
static int initialized;
static int context_token;

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
    if (ordinal != 0) return INVALID_DEVICE;
    *dev = 0;
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev) {
    if (dev != 0) return INVALID_DEVICE;
    *ctx = &context_token;
    return SUCCESS;
}

CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev) { return dev == 0 ? SUCCESS : INVALID_DEVICE; }

CUresult cuCtxSetCurrent(CUcontext ctx) { return ctx == &context_token || ctx == 0 ? SUCCESS : INVALID_VALUE; }

CUresult cuDeviceGetName(char *name, int len, CUdevice dev) {
    if (dev != 0 || len <= 0) return INVALID_VALUE;
    strncpy(name, "adaptalloc stub GPU", (size_t)len - 1);
    name[len - 1] = 0;
    return SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total) {
    *free_bytes = cap() - used;
    *total = cap();
    return SUCCESS;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size) {
    if (size == 0) return INVALID_VALUE;
    if (size > cap() - used) return OUT_OF_MEMORY;
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (!blocks[i].ptr) {
            void *p = aligned_alloc(256, (size + 255) & ~(size_t)255);
            if (!p) return OUT_OF_MEMORY;
            blocks[i].ptr = (CUdeviceptr)(uintptr_t)p;
            blocks[i].size = size;
            used += size;
            *dptr = blocks[i].ptr;
            return SUCCESS;
        }
    }
    return OUT_OF_MEMORY;
}

CUresult cuMemFree_v2(CUdeviceptr ptr) {
    for (int i = 0; i < MAX_BLOCKS; i++) {
        if (blocks[i].ptr == ptr && ptr) {
            free((void *)(uintptr_t)ptr);
            used -= blocks[i].size;
            blocks[i].ptr = 0;
            return SUCCESS;
        }
    }
    return INVALID_VALUE;
}

/* The stream-ordered pool: allocations as above (no caching), the pool's high watermark kept. */
typedef void *CUmemoryPool;
typedef void *CUstream;
static int pool_token;
static size_t pool_high;
enum { ATTR_RELEASE_THRESHOLD = 4, ATTR_RESERVED_MEM_HIGH = 6 };

CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool, CUdevice dev) {
    if (dev != 0) return INVALID_DEVICE;
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
CUresult cuMemFreeAsync(CUdeviceptr ptr, CUstream stream) { (void)stream; return cuMemFree_v2(ptr); }
CUresult cuStreamSynchronize(CUstream stream) { (void)stream; return SUCCESS; }
CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t keep) { (void)keep; return pool == &pool_token ? SUCCESS : INVALID_VALUE; }
