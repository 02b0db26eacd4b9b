/* persistent_probe.cu: how fast could the products of a decode step run as ONE persistent kernel? A probe
 * for issue 7's roofline target, not part of the engine.
 *
 * The engine runs a Qwen3-4B step as ~330 kernels; with every other kernel left out, its 145 Q8_0 products
 * alone chain to 2.06 ms (50 % of the copy bandwidth, bench/RESULTS.md): each pays ~6 us of boundary. This
 * probe runs the same 145 products (36 x [qkv 6144x2560, wo 2560x4096, gate/up 19456x2560, down 2560x9728]
 * + lm_head 151936x2560; random bytes in the backend's tile layout: 512-byte int8 tiles of 16 rows x one
 * 32-block, 32 bytes of f16 scales) in one cooperative kernel of one block per SM:
 *   - a producer thread streams the block's share of every product, in order, through a ring of shared-memory
 *     slots with cp.async.bulk and mbarriers, never waiting for the products' data dependencies, only for
 *     free slots;
 *   - 16 consumer warps wait at a grid barrier for the previous product's output, quantise it to Q8_0 in
 *     shared memory (every block for itself), and take the slots' tiles through mma.m16n8k32 as the engine
 *     does (one token), adding rows into a per-block tile buffer, then once a product into the output;
 *   - shares are contiguous runs of (row tile, 32-block) units, the same count for every block.
 * So the weights keep streaming while the blocks wait at the barriers. Mode 1 leaves the barriers and the
 * quantisation out (the stream alone), mode 2 the weights (the chain of barriers alone). Not bit-exact with
 * the engine (atomics); the sums are not checked beyond being finite for a chained product of random data:
 * this measures time only. Built for sm_90a only (bulk copies, mbarrier waits).
 * usage: persistent_probe [reps=5] */
#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda/cuda_device.cuh"

/* ring: 4 slots of 64 units (32 KB); 16 consumer warps of 4 units a slot. Measured alternatives: 6 slots
 * (1.63 ms), 12 slots of 32 units with 8 warps (1.82 ms), 8 slots of 32 with 8 warps one unit at a time
 * (3.82). */
enum {
    NPROD = 145,
    SLOTS = 4,
    CHU = 64 /* units a slot */,
    CONS = 16 /* consumer warps */,
    UPW = CHU / CONS
};
enum { MAXK = 9728, MAXT = 80 /* tiles of a block's share, lm_head: 9496 * 80 / 132 / 80 + 2 */ };

struct prod {
    const uint8_t *qs;
    const uint32_t *sc;
    int N, K;
};
__constant__ prod P[NPROD];

#define CK(x)                                                                                                \
    do {                                                                                                     \
        cudaError_t e_ = (x);                                                                                \
        if (e_ != cudaSuccess) {                                                                             \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

__device__ __forceinline__ void cons_sync() { /* the consumer threads only */
    asm volatile("bar.sync 1, %0;" ::"n"(CONS * 32) : "memory");
}
__device__ __forceinline__ void mma_s8(int (&d)[4], const int4 &a, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0));
}

/* The share [u0, u1) of product p's units for block b of nb. */
__device__ __forceinline__ void share(int p, int b, int nb, int mode, long *u0, long *u1) {
    const long U = (long)((P[p].N + 15) / 16) * (P[p].K / 32);
    *u0 = U * b / nb;
    *u1 = mode == 2 ? *u0 : U * (b + 1) / nb; /* mode 2: no weights, the barriers' chain alone */
}

struct smem_t {
    int4 ring[SLOTS][CHU * 32];   /* 512 bytes a unit */
    uint32_t scr[SLOTS][CHU * 8]; /* 32 bytes a unit */
    int8_t xq[MAXK];              /* the input, quantised */
    float xd[MAXK / 32];
    float ytile[MAXT][16];
    uint64_t full[SLOTS], empty[SLOTS];
};

__global__ void __launch_bounds__((CONS + 1) * 32, 1)
    k_probe(float *y0, float *y1, float *y2, unsigned *counter, unsigned base, int mode) {
    extern __shared__ __align__(128) unsigned char raw[];
    smem_t &S = *(smem_t *)raw;
    float *ybuf[3] = {y0, y1, y2};
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nb = gridDim.x, b = blockIdx.x;
    if (threadIdx.x == 0)
        for (int s = 0; s < SLOTS; s++) mb_init(&S.full[s], 1), mb_init(&S.empty[s], CONS);
    for (int i = threadIdx.x; i < MAXT * 16; i += blockDim.x) (&S.ytile[0][0])[i] = 0.0f;
    __syncthreads();

    if (warp == CONS) { /* producer */
        if (lane == 0) {
            unsigned seq = 0;
            for (int p = 0; p < NPROD; p++) {
                long u0, u1;
                share(p, b, nb, mode, &u0, &u1);
                for (long cs = u0; cs < u1; cs += CHU, seq++) {
                    const int cnt = (int)(u1 - cs < CHU ? u1 - cs : CHU), s = seq % SLOTS;
                    if (seq >= SLOTS) mb_wait(&S.empty[s], (seq / SLOTS - 1) & 1);
                    mb_expect(&S.full[s], cnt * 544);
                    bulk_copy(S.ring[s], P[p].qs + cs * 512, cnt * 512, &S.full[s]);
                    bulk_copy(S.scr[s], P[p].sc + cs * 8, cnt * 32, &S.full[s]);
                }
            }
        }
        return;
    }

    const int g = lane >> 2, c = lane & 3;
    unsigned seq = 0;
    for (int p = 0; p < NPROD; p++) {
        const int K = P[p].K, NB = K / 32;
        const float *in = ybuf[(p + 2) % 3];
        if (mode != 1) {
            if (p > 0) { /* grid barrier: every block done with product p - 1 */
                if (threadIdx.x == 0) {
                    const unsigned target = base + (unsigned)p * nb;
                    unsigned v;
                    do asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(counter));
                    while ((int)(v - target) < 0);
                }
                cons_sync();
            }
            /* quantise the input (one 32-block a thread), and zero this block's stripe of the output two
             * products ahead (nobody reads or writes it until then) */
            for (int j = threadIdx.x; j < K / 4; j += CONS * 32) { /* a float4 a thread, 8 lanes a block */
                const float4 v = __ldcg((const float4 *)in + j);
                float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
                const unsigned grp = 0xffu << (lane & 24);
                amax = fmaxf(amax, __shfl_xor_sync(grp, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(grp, amax, 2));
                amax = fmaxf(amax, __shfl_xor_sync(grp, amax, 4));
                const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
                char4 q = make_char4((signed char)roundf(v.x * id), (signed char)roundf(v.y * id),
                                     (signed char)roundf(v.z * id), (signed char)roundf(v.w * id));
                *(char4 *)(S.xq + 4 * j) = q;
                if ((j & 7) == 0) S.xd[j >> 3] = d;
            }
            if (p + 1 < NPROD) {
                float *z = ybuf[(p + 1) % 3];
                const int n = P[p + 1].N, lo = n * b / nb, hi = n * (b + 1) / nb;
                for (int i = lo + threadIdx.x; i < hi; i += CONS * 32) z[i] = 0.0f;
            }
            cons_sync();
        }
        long u0, u1;
        share(p, b, nb, mode, &u0, &u1);
        const long t0 = u0 / NB;
        float acc0 = 0.0f, acc1 = 0.0f;
        int cur = -1;
        auto flush = [&]() {
            if (cur >= 0 && c == 0) {
                atomicAdd(&S.ytile[cur - t0][g], acc0);
                atomicAdd(&S.ytile[cur - t0][g + 8], acc1);
            }
            acc0 = acc1 = 0.0f;
        };
        for (long cs = u0; cs < u1; cs += CHU, seq++) {
            const int cnt = (int)(u1 - cs < CHU ? u1 - cs : CHU), s = seq % SLOTS;
            mb_wait(&S.full[s], (seq / SLOTS) & 1);
            const int ub = warp * UPW;
            int tile = (int)((cs + ub) / NB), kb = (int)(cs + ub - (long)tile * NB);
            /* the warp's UPW units: all loads, then all products, then the sums in unit order */
            int4 A[UPW];
            uint32_t sc2[UPW], b0[UPW], b1[UPW];
            float dx[UPW];
            int tl[UPW];
#pragma unroll
            for (int k = 0; k < UPW; k++) {
                tl[k] = tile;
                A[k] = S.ring[s][(ub + k) * 32 + lane];
                sc2[k] = S.scr[s][(ub + k) * 8 + g];
                b0[k] = g == 0 ? *(const uint32_t *)(S.xq + kb * 32 + 4 * c) : 0u;
                b1[k] = g == 0 ? *(const uint32_t *)(S.xq + kb * 32 + 16 + 4 * c) : 0u;
                dx[k] = S.xd[kb];
                if (++kb == NB) kb = 0, tile++;
            }
            int d[UPW][4];
#pragma unroll
            for (int k = 0; k < UPW; k++) mma_s8(d[k], A[k], b0[k], b1[k]);
#pragma unroll
            for (int k = 0; k < UPW; k++) {
                if (ub + k >= cnt) break;
                if (tl[k] != cur) flush(), cur = tl[k];
                acc0 = fmaf((float)d[k][0],
                            __half2float(__ushort_as_half((unsigned short)(sc2[k] & 0xffff))) * dx[k], acc0);
                acc1 = fmaf((float)d[k][2],
                            __half2float(__ushort_as_half((unsigned short)(sc2[k] >> 16))) * dx[k], acc1);
            }
            __syncwarp();
            if (lane == 0) mb_arrive(&S.empty[s]);
        }
        flush();
        cons_sync();
        /* this block's rows into the output, then arrive at the barrier */
        const long nt = (u1 + NB - 1) / NB - t0;
        float *out = ybuf[p % 3];
        for (int i = threadIdx.x; i < nt * 16; i += CONS * 32) {
            const long row = t0 * 16 + i;
            if (row < P[p].N && mode != 1) atomicAdd(out + row, S.ytile[i / 16][i % 16]);
            S.ytile[i / 16][i % 16] = 0.0f;
        }
        cons_sync();
        if (threadIdx.x == 0 && mode != 1) {
            __threadfence();
            atomicAdd(counter, 1u);
        }
    }
}

int main(int argc, char **argv) {
    const int reps = argc > 1 ? atoi(argv[1]) : 5;
    cudaDeviceProp dp;
    CK(cudaGetDeviceProperties(&dp, 0));
    const int nb = dp.multiProcessorCount;
    /* shapes */
    const int L = 36, D = 2560;
    std::vector<prod> h(NPROD);
    const int shp[4][2] = {{6144, 2560}, {2560, 4096}, {19456, 2560}, {2560, 9728}};
    size_t total = 0;
    for (int p = 0; p < NPROD; p++) {
        const int N = p < 4 * L ? shp[p % 4][0] : 151936, K = p < 4 * L ? shp[p % 4][1] : D;
        h[p].N = N, h[p].K = K;
        const size_t units = (size_t)((N + 15) / 16) * (K / 32);
        uint8_t *qs;
        uint32_t *sc;
        CK(cudaMalloc(&qs, units * 512));
        CK(cudaMalloc(&sc, units * 32));
        /* random quants; scales: f16 1/256 (0x1c00) so that the chain neither explodes nor vanishes fast */
        CK(cudaMemset(qs, 0x5a, units * 512));
        std::vector<uint32_t> s(units * 8, 0x1c001c00u);
        CK(cudaMemcpy(sc, s.data(), s.size() * 4, cudaMemcpyHostToDevice));
        h[p].qs = qs, h[p].sc = sc;
        total += units * 544;
    }
    /* gate/up's output is 2 x 9728 rows but down takes 9728: the probe's down reads the first 9728 */
    CK(cudaMemcpyToSymbol(P, h.data(), sizeof(prod) * NPROD));
    float *y[3];
    for (int i = 0; i < 3; i++) {
        CK(cudaMalloc(&y[i], 151936 * 4));
        CK(cudaMemset(y[i], 0, 151936 * 4));
    }
    std::vector<float> x0(D);
    for (int i = 0; i < D; i++) x0[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
    unsigned *counter;
    CK(cudaMalloc(&counter, 4));
    CK(cudaMemset(counter, 0, 4));
    const size_t smem = sizeof(smem_t);
    CK(cudaFuncSetAttribute(k_probe, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    /* copy bandwidth for the ratio */
    void *ca, *cb;
    const size_t cbytes = (size_t)1 << 30;
    CK(cudaMalloc(&ca, cbytes));
    CK(cudaMalloc(&cb, cbytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0), cudaEventCreate(&e1);
    std::vector<float> cms;
    for (int i = 0; i < 12; i++) {
        cudaEventRecord(e0);
        cudaMemcpy(cb, ca, cbytes, cudaMemcpyDeviceToDevice);
        cudaEventRecord(e1);
        cudaEventSynchronize(e1);
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (i >= 2) cms.push_back(t);
    }
    std::sort(cms.begin(), cms.end());
    const double bw = 2.0 * cbytes / (cms[cms.size() / 2] * 1e-3) / 1e9;
    printf("RESULT device: %s, %d SMs; copy bandwidth %.0f GB/s\n", dp.name, nb, bw);
    printf("RESULT %d products, %.3f GB of weights + scales; %zu bytes of shared memory a block\n", NPROD,
           total / 1e9, smem);
    unsigned base = 0;
    for (int mode = 0; mode < 3; mode++) {
        std::vector<float> ms;
        for (int r = 0; r < reps + 1; r++) {
            CK(cudaMemcpy(y[2], x0.data(), D * 4, cudaMemcpyHostToDevice));
            CK(cudaMemset(y[0], 0, 151936 * 4));
            int m = mode;
            void *args[] = {&y[0], &y[1], &y[2], &counter, &base, &m};
            cudaEventRecord(e0);
            CK(cudaLaunchCooperativeKernel((void *)k_probe, nb, (CONS + 1) * 32, args, smem, 0));
            cudaEventRecord(e1);
            CK(cudaEventSynchronize(e1));
            CK(cudaGetLastError());
            float t;
            cudaEventElapsedTime(&t, e0, e1);
            if (r > 0) ms.push_back(t);
            if (mode != 1) base += (unsigned)NPROD * nb;
        }
        std::sort(ms.begin(), ms.end());
        const double t = ms[ms.size() / 2];
        float probe = 0;
        CK(cudaMemcpy(&probe, y[(NPROD - 1) % 3] + 7, 4, cudaMemcpyDeviceToHost));
        printf(
            "RESULT %s: %.3f ms (median of %d) = %.0f GB/s = %.1f%% of the copy bandwidth (an output %g)\n",
            mode == 0   ? "products with barriers + quantisation"
            : mode == 1 ? "stream alone (no barriers)"
                        : "barriers + quantisation alone (no weights)",
            t, reps, total / (t * 1e-3) / 1e9, 100.0 * total / (t * 1e-3) / 1e9 / bw, probe);
    }
    return 0;
}
