// PyTorch's CUDA graph pool hooks, with the exact C++ types that PyTorch's
// CUDAPluggableAllocator casts the hook addresses to (torch/csrc/cuda/Module.cpp:
// set_begin_allocate_to_pool, set_end_allocate_to_pool_fn, set_release_pool). The filter arrives
// as a std::function passed by value, which only C++ can take, keep and call: it is moved to the
// heap and handed to the C ABI (capi/src/lib.rs) as a context with a call and a drop function.
// Compiled into libadaptalloc.so (and the Python extension) by the build scripts with the cc
// crate; capi/src/lib.rs exports the addresses through adaptalloc_torch_hook().

#include <cstdint>
#include <functional>
#include <utility>

struct CUstream_st;
using cudaStream_t = CUstream_st *;  // as CUDA's driver_types.h declares it
// c10::cuda::MempoolId_t: std::pair<CaptureId_t, CaptureId_t>, CaptureId_t = unsigned long long.
using MempoolId = std::pair<unsigned long long, unsigned long long>;
using StreamFilter = std::function<bool(cudaStream_t)>;

extern "C" {
// capi/src/lib.rs. adaptalloc_begin_pool takes ownership of ctx: it calls drop(ctx) once, when
// the window ends (or at once, when the call fails).
int adaptalloc_begin_pool(int device, uint64_t id0, uint64_t id1, int (*filter)(void *, void *), void *ctx,
                          void (*drop)(void *));
int adaptalloc_end_pool(int device, uint64_t id0, uint64_t id1);
int adaptalloc_release_pool(int device, uint64_t id0, uint64_t id1);
}

namespace {

// A filter that throws accepts nothing: no exception crosses into Rust.
int call_filter(void *ctx, void *stream) noexcept {
    try {
        return (*static_cast<StreamFilter *>(ctx))(static_cast<cudaStream_t>(stream)) ? 1 : 0;
    } catch (...) {
        return 0;
    }
}

void drop_filter(void *ctx) noexcept { delete static_cast<StreamFilter *>(ctx); }

// The hooks. Errors are left in adaptalloc_last_error() (the hooks return void to PyTorch).
void begin_allocate_to_pool(int device, MempoolId id, StreamFilter filter) {
    if (!filter) {  // no filter: every stream of this device allocates to the pool
        adaptalloc_begin_pool(device, id.first, id.second, nullptr, nullptr, nullptr);
        return;
    }
    auto *held = new StreamFilter(std::move(filter));
    adaptalloc_begin_pool(device, id.first, id.second, call_filter, held, drop_filter);
}

void end_allocate_to_pool(int device, MempoolId id) { adaptalloc_end_pool(device, id.first, id.second); }

void release_pool(int device, MempoolId id) { adaptalloc_release_pool(device, id.first, id.second); }

}  // namespace

// The address of hook `which` (0 begin, 1 end, 2 release), for adaptalloc_torch_hook.
extern "C" void *adaptalloc_shim_pool_hook(int which) {
    switch (which) {
        case 0: return reinterpret_cast<void *>(&begin_allocate_to_pool);
        case 1: return reinterpret_cast<void *>(&end_allocate_to_pool);
        case 2: return reinterpret_cast<void *>(&release_pool);
        default: return nullptr;
    }
}
