/* stream_probe.cu: how many bytes a second one SM can pull from HBM into itself, by each way of loading the
 * persistent step could use. A probe for issue 7, not part of the engine.
 *
 * Why: the persistent step's products end with their busiest blocks (gate/up: 40 blocks with 12 tiles, 92
 * with 8), and a block has streamed ~20-30 GB/s whatever the depth of its rings or the number of its warps
 * (bench/RESULTS.md). With all 132 SMs streaming the HBM binds (~23 GB/s each); in a product's tail only a
 * few SMs stream, and if their own rate is capped the HBM idles. This measures that cap: one block of 12
 * warps per SM on `blocks` SMs, each warp streaming its own contiguous 512 KB (far past L2 in all):
 *   bulk   lane 0 refills a ring of `ns` stages of `sb` bytes by cp.async.bulk (mbarrier completion), as the
 *          persistent step does (with its L2 evict-first policy, or without);
 *   ldg    every lane loads 16 bytes, 8 such loads in flight (the product kernels' register loop);
 *   ldgsts every lane copies 16 bytes to shared memory by cp.async, a commit group a stage, LDGSTS_NS in
 *          flight.
 * Each config runs 3 times; the fastest is printed as GB/s in all and per block.
 * usage: stream_probe */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "cuda/cuda_device.cuh"

enum {
    WARPS = 12,
    PER_WARP = 512 << 10,
    SMEM = 200 << 10,
    LDGSTS_NS = 7 /* cp.async.wait_group takes a constant */
};

#define CK(x)                                                                                                \
    do {                                                                                                     \
        cudaError_t e_ = (x);                                                                                \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "stream_probe: %s: %s\n", #x, cudaGetErrorString(e_));                           \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* mode 0: bulk copies, 1: the same with evict-first, 2: ldg, 3: ldgsts */
__global__ void __launch_bounds__(WARPS * 32, 1)
    k_stream(const unsigned char *src, int mode, int sb, int ns, unsigned *sink) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const unsigned char *w = src + ((size_t)blockIdx.x * WARPS + warp) * PER_WARP;
    unsigned acc = 0;
    if (mode <= 1) {
        unsigned char *ring = smem + (size_t)warp * ns * sb;
        uint64_t *full = (uint64_t *)(smem + (size_t)WARPS * ns * sb) + warp * ns;
        const uint64_t pol = l2_evict_first();
        const int n = PER_WARP / sb;
        auto issue = [&](int i) {
            uint64_t *b = full + i % ns;
            mb_expect(b, sb);
            if (mode)
                bulk_copy_hint(ring + (size_t)(i % ns) * sb, w + (size_t)i * sb, sb, b, pol);
            else
                bulk_copy(ring + (size_t)(i % ns) * sb, w + (size_t)i * sb, sb, b);
        };
        if (lane == 0) {
            for (int i = 0; i < ns; i++) mb_init(full + i, 1);
            asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
            for (int i = 0; i < ns && i < n; i++) issue(i);
        }
        __syncwarp();
        for (int i = 0; i < n; i++) {
            mb_wait(full + i % ns, (i / ns) & 1);
            acc ^= ((const unsigned *)(ring + (size_t)(i % ns) * sb))[lane];
            __syncwarp();
            if (lane == 0 && i + ns < n) issue(i + ns);
        }
    } else if (mode == 2) {
        const int4 *p = (const int4 *)w + lane;
        for (int i = 0; i < PER_WARP / 16; i += 8 * 32) {
            int4 v[8];
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = __ldcs(p + i + k * 32);
#pragma unroll
            for (int k = 0; k < 8; k++) acc ^= v[k].x ^ v[k].w;
        }
    } else {
        ns = LDGSTS_NS;
        unsigned char *ring = smem + (size_t)warp * ns * sb;
        const int n = PER_WARP / sb;
        for (int i = 0; i < n + ns - 1; i++) {
            if (i < n)
                for (int j = lane * 16; j < sb; j += 512)
                    cp_async16(ring + (size_t)(i % ns) * sb + j, w + (size_t)i * sb + j);
            cp_async_commit();
            if (i >= ns - 1) {
                cp_async_wait<LDGSTS_NS - 1>(); /* the oldest of the groups in flight has landed */
                __syncwarp();
                acc ^= ((const unsigned *)(ring + (size_t)((i - ns + 1) % ns) * sb))[lane];
                __syncwarp(); /* read before the slot's refill */
            }
        }
    }
    if (acc == 0x12345678u) sink[0] = acc; /* keeps the loads */
}

int main(void) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    const size_t bytes = (size_t)sms * WARPS * PER_WARP;
    unsigned char *src = NULL;
    unsigned *sink = NULL;
    CK(cudaMalloc(&src, bytes));
    CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(src, 1, bytes));
    CK(cudaFuncSetAttribute(k_stream, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    printf("stream_probe: %s, %d SMs, %d warps a block, %d KB a warp\n", prop.name, sms, WARPS,
           PER_WARP >> 10);
    struct cfg {
        const char *name;
        int mode, sb, ns;
    } cfgs[] = {{"bulk 2 KB x 6", 0, 2048, 6},
                {"bulk 2 KB x 6 evict-first", 1, 2048, 6},
                {"bulk 8 KB x 2", 0, 8192, 2},
                {"bulk 8 KB x 2 evict-first", 1, 8192, 2},
                {"bulk 1 KB x 12 evict-first", 1, 1024, 12},
                {"ldg 8 x 16 B a lane", 2, 0, 0},
                {"ldgsts 1 KB x 7", 3, 1024, LDGSTS_NS}};
    const int nblk[] = {sms, sms / 2, 40, 16, 4, 1};
    for (const cfg &c : cfgs) {
        if (c.mode <= 1 && (size_t)WARPS * c.ns * (c.sb + 8) > SMEM) continue;
        for (int nb : nblk) {
            float best = 1e30f;
            for (int r = 0; r < 3; r++) {
                CK(cudaEventRecord(e0));
                k_stream<<<nb, WARPS * 32, SMEM>>>(src, c.mode, c.sb, c.ns, sink);
                CK(cudaEventRecord(e1));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float ms = 0;
                CK(cudaEventElapsedTime(&ms, e0, e1));
                if (ms < best) best = ms;
            }
            const double gbs = (double)nb * WARPS * PER_WARP / (best * 1e-3) / 1e9;
            printf("RESULT stream %-28s blocks %3d: %7.1f GB/s, %5.1f GB/s a block\n", c.name, nb, gbs,
                   gbs / nb);
        }
    }
    CK(cudaFree(src));
    CK(cudaFree(sink));
    return 0;
}
