/* A caller built against the first header (ABI version 1), whose AdaptallocStats has ten
 * fields: adaptalloc_stats must fill them and write nothing past them. Built and run by
 * python/test_ctypes.py against target/release/libadaptalloc.so on a simulated device. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef struct {
    uint64_t live_bytes, peak_live_bytes, reserved_bytes, peak_reserved_bytes, idle_bytes,
        live_blocks, driver_allocs, driver_frees, failed_allocs, oom_recoveries;
} AdaptallocStatsV1;

void *adaptalloc_malloc(size_t size, int device, void *stream);
void adaptalloc_free(void *ptr, size_t size, int device, void *stream);
int adaptalloc_stats(int device, AdaptallocStatsV1 *out);

int main(void) {
    struct {
        AdaptallocStatsV1 s;
        uint64_t guard[4];
    } m;
    memset(&m, 0xAB, sizeof m);
    void *p = adaptalloc_malloc(4096, 0, 0);
    if (!p) return 2;
    if (adaptalloc_stats(0, &m.s) != 0) return 3;
    for (int i = 0; i < 4; i++) {
        if (m.guard[i] != 0xABABABABABABABABull) {
            printf("guard word %d past the version-1 struct was overwritten\n", i);
            return 4;
        }
    }
    if (m.s.live_bytes != 4096 || m.s.live_blocks != 1 || m.s.failed_allocs != 0) {
        printf("live_bytes %llu live_blocks %llu\n", (unsigned long long)m.s.live_bytes,
               (unsigned long long)m.s.live_blocks);
        return 5;
    }
    adaptalloc_free(p, 4096, 0, 0);
    printf("abi v1 caller ok: live_bytes %llu, nothing written past its struct\n",
           (unsigned long long)m.s.live_bytes);
    return 0;
}
