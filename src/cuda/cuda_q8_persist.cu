/* cuda_q8_persist.cu: an experiment for the benchmark only (bench_cuda with FM_BENCH_PERSIST): a step's
 * 1-token Q8_0 products, with nothing between them, run as one persistent launch instead of a graph of
 * kernels, to measure what kernel boundaries cost next to what the products' streaming costs
 * (bench/RESULTS.md, "One launch for a step's products"). Two forms, each with or without the wait for the
 * previous product:
 * - "virtual blocks": each resident block runs the narrow kernel's own per-block code (q8_gemm_block) for
 *   the blocks of every product in turn; the wait replaces griddepcontrol.wait;
 * - "ring": each warp streams its tiles of every product through one ring of shared-memory stages that runs
 *   on across products (weights never wait), taking each product's activations once it is ready; stages of
 *   one tile by cp.async, or ("bulk") of C tiles by the copy engine (cp.async.bulk). Same operations as the
 *   narrow kernel at T = 1 (checked bit for bit against it by fm_cuda_debug_persist).
 * A product's blocks count themselves done on a counter per product; every block is resident (the grid is
 * the occupancy), so the waits cannot deadlock. */
#include "cuda/cuda_q8_narrow.cuh"

static_assert((int)FMC_PERSIST_STORE == (int)Q8_STORE && (int)FMC_PERSIST_ADD == (int)Q8_ADD &&
                  (int)FMC_PERSIST_GLU == (int)Q8_GLU,
              "persist modes are the narrow kernel's");

enum { PERSIST_MAX = 160, PERSIST_WARPS = 4 };

struct persist_op {
    q8_args a;
    int mode;
    unsigned grid;
};
__constant__ persist_op c_ops[PERSIST_MAX];

/* Until `need` blocks of the previous product have counted themselves done (flag NULL: no wait). */
__device__ __forceinline__ void wait_done(const unsigned *flag, unsigned need) {
    while (ld_acquire(flag) < need) __nanosleep(32);
}

struct flag_sync {
    const unsigned *flag;
    unsigned need;
    __device__ __forceinline__ void start() const {}
    __device__ __forceinline__ void wait() const {
        if (!flag) return;
        if (threadIdx.x == 0) wait_done(flag, need);
        __syncthreads();
    }
};

__device__ __forceinline__ void count_done(unsigned *done) {
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(done, 1u);
    }
}

__global__ void __launch_bounds__(PERSIST_WARPS * 32) k_persist_blocks(int n, unsigned *done, int waits) {
    for (int p = 0; p < n; p++) {
        const flag_sync sy{waits && p ? done + p - 1 : nullptr, p ? c_ops[p - 1].grid : 0u};
        for (unsigned vb = blockIdx.x; vb < c_ops[p].grid; vb += gridDim.x) {
            switch (c_ops[p].mode) {
            case Q8_STORE:
                q8_gemm_block<1, Q8_STORE>(c_ops[p].a, vb, sy);
                break;
            case Q8_ADD:
                q8_gemm_block<1, Q8_ADD>(c_ops[p].a, vb, sy);
                break;
            default:
                q8_gemm_block<1, Q8_GLU>(c_ops[p].a, vb, sy);
                break;
            }
            count_done(done + p);
        }
    }
}

/* ---- ring ---- */

enum { RING = 16, RING_SB = 512 + 32, RING_XB = 40 /* most K blocks of a warp's share */ };
constexpr size_t RING_WARP = (size_t)RING * RING_SB + RING_XB * 36;
constexpr size_t RING_SMEM = PERSIST_WARPS * RING_WARP + (4 * 4 * 32 + 8 * 64) * 4;

/* A warp's share of one virtual block of one product: where its tiles are (the narrow kernel's split). */
struct ring_item {
    int p; /* n: past the last product */
    unsigned vb;
    int nbw, b0, tile, group, kci;
    bool active;
    const int4 *ap;
    const uint32_t *sp8;
};
__device__ __forceinline__ void ring_find(ring_item &c, int n, int warp) {
    while (c.p < n && c.vb >= c_ops[c.p].grid) c.p++, c.vb = blockIdx.x;
    if (c.p >= n) return;
    const q8_args &a = c_ops[c.p].a;
    const int NB = a.K >> 5, NT16 = (a.N + 15) >> 4, r = warp / a.sp.w, i = warp - r * a.sp.w;
    c.group = c.vb / a.sp.kc, c.kci = c.vb - c.group * a.sp.kc;
    c.tile = c_ops[c.p].mode == Q8_GLU ? (r < 2 ? 2 * c.group + r : NT16 / 2 + 2 * c.group + r - 2) : c.group;
    c.active = c.tile < NT16;
    const int lt = c.active ? c.tile : 0;
    c.nbw = NB / (a.sp.w * a.sp.kc);
    c.b0 = (c.kci * a.sp.w + i) * c.nbw;
    c.ap = a.qs + ((int64_t)lt * NB + c.b0) * 32;
    c.sp8 = a.sc + ((int64_t)lt * NB + c.b0) * 8;
}

/* Token 0's activations of a warp's K share into shared memory: every load first (one L2 round trip). */
__device__ __forceinline__ void ring_load_x(const q8_args &a, const ring_item &c, int lane, uint32_t *xs,
                                            float *ds) {
    constexpr int XW = RING_XB * 8 / 32, XD = (RING_XB + 31) / 32;
    uint32_t xv[XW];
    float dv[XD];
#pragma unroll
    for (int u = 0; u < XW; u++) { /* word k % 8 of lanes 0..3's 32 bytes of block b0 + k / 8 */
        const int k = lane + 32 * u;
        if (k < c.nbw * 8)
            xv[u] = __ldcg((const unsigned *)(a.xq + (size_t)(c.b0 + (k >> 3)) * 256) + (k & 7));
    }
#pragma unroll
    for (int u = 0; u < XD; u++)
        if (lane + 32 * u < c.nbw) dv[u] = __ldcg(a.xd + (size_t)(c.b0 + lane + 32 * u) * 8);
#pragma unroll
    for (int u = 0; u < XW; u++)
        if (lane + 32 * u < c.nbw * 8) xs[lane + 32 * u] = xv[u];
#pragma unroll
    for (int u = 0; u < XD; u++)
        if (lane + 32 * u < c.nbw) ds[lane + 32 * u] = dv[u];
    __syncwarp();
}

/* Before a warp's tiles of item c: the wait for the product before it (waits == 1) and its activations
 * (not in the stream-only mode, waits == 2). */
__device__ __forceinline__ void ring_begin(const ring_item &c, int waits, const unsigned *done, int lane,
                                           uint32_t *xs, float *ds) {
    if (waits == 1 && c.p > 0) {
        if (lane == 0) wait_done(done + c.p - 1, c_ops[c.p - 1].grid);
        __syncwarp();
    }
    if (waits < 2) ring_load_x(c_ops[c.p].a, c, lane, xs, ds);
}

/* Tile k of the item from its stage (weights w, scale pairs sc): the narrow kernel's step at T = 1, lanes
 * 0..3 holding token 0's B fragment. */
__device__ __forceinline__ void ring_tile(float (&acc)[4], const unsigned char *w, const unsigned char *sc,
                                          const uint32_t *xs, const float *ds, int k, int lane) {
    const int g = lane >> 2, c = lane & 3;
    const int4 A = *(const int4 *)(w + lane * 16);
    const uint32_t S = ((const uint32_t *)sc)[g];
    const uint32_t b0 = g == 0 ? xs[k * 8 + 2 * c] : 0u, b1 = g == 0 ? xs[k * 8 + 2 * c + 1] : 0u;
    int d[4];
    mma_s8(d, A, b0, b1);
    q8_scale_add<4>(acc, d, half_lo(S), half_hi(S), make_float2(ds[k], 0.f));
}

/* After a warp's tiles of item c: the merge of the partial sums, the product's output and the block's count
 * (the stream-only mode: none of it); then the warp's next item. */
__device__ __forceinline__ void ring_end(ring_item &c, int n, int waits, float (&acc)[1][4], float *red,
                                         float *gb, unsigned *done, int warp, int lane) {
    const q8_args &a = c_ops[c.p].a;
    const int g = lane >> 2, q = lane & 3;
    if (waits == 2) {
        if (acc[0][0] == 1e30f) red[lane] = acc[0][2]; /* keeps the products live */
    } else {
        const int fin = gemm_merge<1>(acc, a.sp, c.group, c.kci, red);
        if (fin >= 0 && c_ops[c.p].mode == Q8_GLU) {
            const int r = warp / a.sp.w;
            if (fin)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    gb[(2 * q + (j & 1)) * 64 + r * 16 + g + (j >> 1) * 8] = acc[0][j];
            __syncthreads();
            if (warp == 0) q8_glu_out(a, 0, c.group, a.N / 64, gb[lane], gb[32 + lane]);
        } else if (fin > 0 && c.active && q == 0)
#pragma unroll
            for (int j = 0; j < 4; j += 2) { /* token 0: rows g, g + 8 */
                const int row = c.tile * 16 + g + (j >> 1) * 8;
                if (row >= a.N) continue;
                if (c_ops[c.p].mode == Q8_ADD)
                    q8_out<Q8_ADD>(a, row, 0, acc[0][j]);
                else
                    q8_out<Q8_STORE>(a, row, 0, acc[0][j]);
            }
        count_done(done + c.p);
    }
    c.vb += gridDim.x;
    ring_find(c, n, warp);
}

__global__ void __launch_bounds__(PERSIST_WARPS * 32) k_persist_ring(int n, unsigned *done, int waits) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned char *wb = smem + warp * RING_WARP;
    uint32_t *xs = (uint32_t *)(wb + RING * RING_SB); /* [RING_XB][8] */
    float *ds = (float *)(xs + RING_XB * 8);          /* [RING_XB] */
    float *red = (float *)(smem + PERSIST_WARPS * RING_WARP), *gb = red + 4 * 4 * 32;
    ring_item is{0, blockIdx.x}, cs{0, blockIdx.x}; /* issue and consume cursors over the same items */
    ring_find(is, n, warp);
    ring_find(cs, n, warp);
    int iit = 0, islot = 0, cslot = 0;
    /* One stage per call (a commit group each, empty past the end): the weights never wait. */
    auto issue = [&]() {
        if (is.p < n) {
            if (is.active) {
                cp_async16(wb + islot * RING_SB + lane * 16, is.ap + iit * 32 + lane);
                if (lane < 8) cp_async4(wb + islot * RING_SB + 512 + lane * 4, is.sp8 + iit * 8 + lane);
            }
            if (++iit == is.nbw) iit = 0, is.vb += gridDim.x, ring_find(is, n, warp);
        }
        if (++islot == RING) islot = 0;
        cp_async_commit();
    };
#pragma unroll 1
    for (int st = 0; st < RING; st++) issue();
    while (cs.p < n) {
        ring_begin(cs, waits, done, lane, xs, ds);
        float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll 1
        for (int it = 0; it < cs.nbw; it++) {
            cp_async_wait<RING - 1>();
            __syncwarp();
            if (cs.active)
                ring_tile(acc[0], wb + cslot * RING_SB, wb + cslot * RING_SB + 512, xs, ds, it, lane);
            __syncwarp();
            if (++cslot == RING) cslot = 0;
            issue();
        }
        ring_end(cs, n, waits, acc, red, gb, done, warp, lane);
    }
    cp_async_wait<0>();
}

/* ---- bulk ring: the ring with stages of C tiles moved by the copy engine (cp.async.bulk + mbarrier) ---- */

template <int C, int RB> struct bulk_shape {
    static constexpr size_t warp =
        ((size_t)RB * C * 544 + RING_XB * 36 + RB * 8 + 15) / 16 * 16; /* bulk copies: 16-byte aligned */
    static constexpr size_t smem = PERSIST_WARPS * warp + (4 * 4 * 32 + 8 * 64) * 4;
};

template <int C, int RB>
__global__ void __launch_bounds__(PERSIST_WARPS * 32) k_persist_bulk(int n, unsigned *done, int waits) {
    extern __shared__ __align__(16) unsigned char smem[];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned char *wb = smem + warp * bulk_shape<C, RB>::warp; /* [RB][C][512] weights, then [RB][C][32] */
    unsigned char *sb = wb + RB * C * 512;
    uint32_t *xs = (uint32_t *)(sb + RB * C * 32);
    float *ds = (float *)(xs + RING_XB * 8);
    uint64_t *full = (uint64_t *)(ds + RING_XB);
    float *red = (float *)(smem + PERSIST_WARPS * bulk_shape<C, RB>::warp), *gb = red + 4 * 4 * 32;
    if (lane == 0)
        for (int s = 0; s < RB; s++) mb_init(full + s, 1);
    __syncwarp();
    ring_item is{0, blockIdx.x}, cs{0, blockIdx.x};
    ring_find(is, n, warp);
    ring_find(cs, n, warp);
    int iit = 0, islot = 0, cslot = 0;
    unsigned cphase = 0;
    /* One stage per call: up to C tiles of the item at the issue cursor, by lane 0. */
    auto issue = [&]() {
        if (lane == 0) {
            if (is.p < n && is.active) {
                const int cnt = min(C, is.nbw - iit);
                mb_expect(full + islot, cnt * 544);
                bulk_copy(wb + islot * C * 512, is.ap + iit * 32, cnt * 512, full + islot);
                bulk_copy(sb + islot * C * 32, is.sp8 + iit * 8, cnt * 32, full + islot);
            } else
                mb_arrive(full + islot);
        }
        if (is.p < n && (iit += min(C, is.nbw - iit)) == is.nbw)
            iit = 0, is.vb += gridDim.x, ring_find(is, n, warp);
        if (++islot == RB) islot = 0;
    };
#pragma unroll 1
    for (int st = 0; st < RB; st++) issue();
    while (cs.p < n) {
        ring_begin(cs, waits, done, lane, xs, ds);
        float acc[1][4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll 1
        for (int it = 0; it < cs.nbw; it += C) {
            const int cnt = min(C, cs.nbw - it);
            mb_wait(full + cslot, cphase);
            if (cs.active)
#pragma unroll
                for (int u = 0; u < C; u++) {
                    if (u >= cnt) break;
                    ring_tile(acc[0], wb + (cslot * C + u) * 512, sb + (cslot * C + u) * 32, xs, ds, it + u,
                              lane);
                }
            __syncwarp(); /* every lane is past the stage before its refill */
            if (++cslot == RB) cslot = 0, cphase ^= 1;
            issue();
        }
        ring_end(cs, n, waits, acc, red, gb, done, warp, lane);
    }
    /* the stages issued past the last item complete before the block exits */
    for (int s = 0; s < RB; s++) {
        mb_wait(full + cslot, cphase);
        if (++cslot == RB) cslot = 0, cphase ^= 1;
    }
}

typedef void (*persist_kernel)(int, unsigned *, int);
static persist_kernel persist_pick(int form, size_t *smem) {
    switch (form) {
    case 0:
        *smem = 0;
        return k_persist_blocks;
    case 1:
        *smem = RING_SMEM;
        return k_persist_ring;
    case 2:
        *smem = bulk_shape<2, 8>::smem;
        return k_persist_bulk<2, 8>;
    case 3:
        *smem = bulk_shape<4, 4>::smem;
        return k_persist_bulk<4, 4>;
    default:
        *smem = bulk_shape<8, 3>::smem;
        return k_persist_bulk<8, 3>;
    }
}

int fmc_q8_persist_prepare(const fmc_persist_product *pr, int n, int8_t *oq, float *od, int form, int *grid,
                           int *smem) {
    if (n < 1 || n > PERSIST_MAX) return -1;
    static persist_op ops[PERSIST_MAX];
    size_t sm = 0;
    for (int i = 0; i < n; i++) {
        const fmc_q8 *w = pr[i].w;
        q8_args a = {};
        a.qs = w->qs, a.sc = w->sc, a.N = w->N, a.K = w->K, a.T = 1, a.sp = w->sp;
        a.xq = pr[i].xq, a.xd = pr[i].xd, a.y = pr[i].y, a.ldy = pr[i].ldy, a.oq = oq, a.od = od;
        ops[i] = persist_op{a, pr[i].mode, (unsigned)((w->N + 15) / 16 / w->sp.rt) * w->sp.kc};
        if (w->sp.rt * w->sp.w != PERSIST_WARPS || (w->K / 32) / (w->sp.w * w->sp.kc) > RING_XB) return -2;
        sm = std::max(sm, q8_smem(&w->sp, 1, pr[i].mode));
    }
    size_t fsm = 0;
    const persist_kernel k = persist_pick(form, &fsm);
    if (form) sm = fsm;
    int per = 0;
    if (cudaMemcpyToSymbol(c_ops, ops, sizeof(persist_op) * n) != cudaSuccess ||
        cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm) != cudaSuccess ||
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per, k, PERSIST_WARPS * 32, sm) != cudaSuccess || !per)
        return -3;
    *grid = per * fmc_sm_count();
    *smem = (int)sm;
    return 0;
}

void fmc_q8_persist_launch(int form, unsigned *done, int n, int waits, int grid, int smem, cudaStream_t s) {
    cudaMemsetAsync(done, 0, sizeof(unsigned) * n, s);
    size_t fsm = 0;
    persist_pick(form, &fsm)<<<grid, PERSIST_WARPS * 32, smem, s>>>(n, done, waits);
}
