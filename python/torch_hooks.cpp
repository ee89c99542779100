// PyTorch's hooks called as PyTorch calls them: each address from adaptalloc_torch_hook() is
// cast to the function type of CUDAPluggableAllocator's setter (torch/csrc/cuda/Module.cpp) and
// wrapped in a std::function, and the pool hooks get a MempoolId_t and a std::function filter
// by value. Built with c++ and run by python/test_ctypes.py against target/release/
// libadaptalloc.so on a simulated device (ADAPTALLOC_DEVICE=sim:1GiB).
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "../include/adaptalloc.h"

struct CUstream_st;
using cudaStream_t = CUstream_st *;
using MempoolId = std::pair<unsigned long long, unsigned long long>;

#define CHECK(cond)                                                                      \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            std::printf("line %d: %s failed (last error: %s)\n", __LINE__, #cond,        \
                        adaptalloc_last_error());                                        \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

template <typename F>
std::function<F> hook(const char *name) {
    void *address = adaptalloc_torch_hook(name);
    return address ? std::function<F>(reinterpret_cast<F *>(address)) : std::function<F>();
}

static int filters_alive = 0;

// A filter with state, as PyTorch's (a lambda capturing the graph): counted, to show that the
// copy the shim keeps is destroyed once, when the window ends.
struct Filter {
    cudaStream_t captured;
    explicit Filter(cudaStream_t s) : captured(s) { filters_alive++; }
    Filter(const Filter &o) : captured(o.captured) { filters_alive++; }
    ~Filter() { filters_alive--; }
    bool operator()(cudaStream_t s) const { return s == captured; }
};

static bool overlaps(uintptr_t a, size_t an, uintptr_t b, size_t bn) { return a < b + bn && b < a + an; }

int main() {
    auto malloc_fn = hook<void *(size_t, int, cudaStream_t)>("malloc");
    auto free_fn = hook<void(void *, size_t, int, cudaStream_t)>("free");
    auto reset_fn = hook<void()>("reset");
    auto record_fn = hook<void(void *, cudaStream_t)>("record_stream");
    auto fraction_fn = hook<void(double, int)>("memory_fraction");
    auto init_fn = hook<void(int)>("init");
    auto begin_fn = hook<void(int, MempoolId, std::function<bool(cudaStream_t)>)>("begin_allocate_to_pool");
    auto end_fn = hook<void(int, MempoolId)>("end_allocate_to_pool");
    auto release_fn = hook<void(int, MempoolId)>("release_pool");
    CHECK(malloc_fn && free_fn && reset_fn && record_fn && fraction_fn && init_fn && begin_fn && end_fn && release_fn);
    CHECK(adaptalloc_torch_hook("cacheInfo") == nullptr && std::strstr(adaptalloc_last_error(), "no such hook"));

    init_fn(1);
    cudaStream_t main_stream = reinterpret_cast<cudaStream_t>(0x100);
    cudaStream_t captured = reinterpret_cast<cudaStream_t>(0x700);
    cudaStream_t side = reinterpret_cast<cudaStream_t>(0x900);
    AdaptallocStats s;

    // Memory before the capture, some of it idle.
    void *before = malloc_fn(8 << 20, 0, main_stream);
    void *idle = malloc_fn(16 << 20, 0, main_stream);
    CHECK(before && idle);
    free_fn(idle, 16 << 20, 0, main_stream);

    // The capture: the captured stream allocates to pool (1, 0), frees there and reuses.
    MempoolId pool{1, 0};
    begin_fn(0, pool, Filter(captured));
    CHECK(filters_alive == 1);
    std::vector<std::pair<uintptr_t, size_t>> in_pool;
    void *a = malloc_fn(3 << 20, 0, captured);
    CHECK(a);
    in_pool.push_back({reinterpret_cast<uintptr_t>(a), 3 << 20});
    free_fn(a, 3 << 20, 0, captured);
    void *b = malloc_fn(3 << 20, 0, captured);
    CHECK(b == a);
    void *c = malloc_fn(5 << 20, 0, captured);
    CHECK(c);
    in_pool.push_back({reinterpret_cast<uintptr_t>(c), 5 << 20});
    record_fn(c, side);
    CHECK(std::strlen(adaptalloc_last_error()) == 0);
    // Another stream meanwhile takes memory from outside the pool.
    void *d = malloc_fn(1 << 20, 0, main_stream);
    CHECK(d);
    for (auto &r : in_pool) CHECK(!overlaps(reinterpret_cast<uintptr_t>(d), 1 << 20, r.first, r.second));
    free_fn(before, 8 << 20, 0, main_stream);
    CHECK(adaptalloc_stats_sized(0, &s, sizeof s) == 0);
    uint64_t frees = s.driver_frees;
    reset_fn();  // torch.cuda.empty_cache() during a capture: nothing goes back
    CHECK(adaptalloc_stats_sized(0, &s, sizeof s) == 0 && s.driver_frees == frees);
    end_fn(0, pool);
    CHECK(filters_alive == 0);
    CHECK(std::strlen(adaptalloc_last_error()) == 0);

    // After: empty_cache gives back what is idle outside the pool; the pool keeps its memory
    // (the graph's) and outside requests never land on it.
    reset_fn();
    CHECK(adaptalloc_stats_sized(0, &s, sizeof s) == 0 && s.driver_frees > frees);
    for (int i = 1; i <= 8; i++) {
        void *p = malloc_fn(static_cast<size_t>(i) << 20, 0, captured);
        CHECK(p);
        for (auto &r : in_pool) CHECK(!overlaps(reinterpret_cast<uintptr_t>(p), static_cast<size_t>(i) << 20, r.first, r.second));
        free_fn(p, static_cast<size_t>(i) << 20, 0, captured);
    }
    free_fn(b, 3 << 20, 0, captured);
    free_fn(c, 5 << 20, 0, captured);
    free_fn(d, 1 << 20, 0, main_stream);
    adaptalloc_synchronize_stream(0, side);
    release_fn(0, pool);
    reset_fn();
    CHECK(adaptalloc_stats_sized(0, &s, sizeof s) == 0 && s.reserved_bytes == 0 && s.live_bytes == 0);
    release_fn(0, pool);
    CHECK(std::strstr(adaptalloc_last_error(), "no private pool (1, 0)"));
    end_fn(0, MempoolId{9, 9});
    CHECK(std::strstr(adaptalloc_last_error(), "end_pool without begin_pool"));

    // A window on a device adaptalloc does not serve: refused, and the filter's copy destroyed.
    begin_fn(99, MempoolId{3, 0}, Filter(captured));
    CHECK(filters_alive == 0 && std::strstr(adaptalloc_last_error(), "device 99"));

    // An empty std::function: every stream allocates to the pool.
    begin_fn(0, MempoolId{2, 0}, std::function<bool(cudaStream_t)>());
    void *e = malloc_fn(1 << 20, 0, side);
    CHECK(e);
    end_fn(0, MempoolId{2, 0});
    free_fn(e, 1 << 20, 0, side);
    release_fn(0, MempoolId{2, 0});

    // The memory fraction: a cap on what the allocator holds (1 GiB device: 0.25 is 256 MiB).
    fraction_fn(0.25, 0);
    CHECK(std::strlen(adaptalloc_last_error()) == 0);
    void *big = malloc_fn(200 << 20, 0, main_stream);
    CHECK(big);
    CHECK(malloc_fn(100 << 20, 0, main_stream) == nullptr && std::strstr(adaptalloc_last_error(), "memory cap"));
    free_fn(big, 200 << 20, 0, main_stream);
    fraction_fn(1.5, 0);
    CHECK(std::strstr(adaptalloc_last_error(), "at most 1"));
    fraction_fn(1.0, 0);
    void *more = malloc_fn(300 << 20, 0, main_stream);
    CHECK(more);
    free_fn(more, 300 << 20, 0, main_stream);
    record_fn(reinterpret_cast<void *>(0x1234), side);
    CHECK(std::strstr(adaptalloc_last_error(), "not a live allocation"));
    std::printf("torch hooks ok: 9 hooks called through PyTorch's types, pool kept apart, filter destroyed, cap enforced\n");
    return 0;
}
