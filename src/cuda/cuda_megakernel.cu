/* cuda_megakernel.cu: the layers of a one-token forward (a plain decode step) in one persistent launch.
 *
 * Why: a step of Qwen3-4B runs 9 kernels a layer. Each product pays a fixed ~4-6 us beyond its bytes (the
 * wait for its predecessor, the activations' L2 round trip, the ramp and drain of one wave), and the weight
 * stream stops during every norm, RoPE and attention kernel: the step ran at ~46 % of the copy rate (bench/
 * RESULTS.md). Here one block per SM runs every layer. A producer warp streams the block's share of every
 * product's weight tiles into shared-memory rings with the copy engine (cp.async.bulk, one mbarrier pair a
 * stage), in program order and never waiting on activations; 8 consumer warps run the phases between grid
 * barriers and read the weights from the rings. So while the consumers wait at a barrier or compute the
 * attention, the rings fill with the next products' weights.
 *
 * Bits: a (row, token) is computed with the operations of the kernels a verify block runs, in the same
 * order, so steps here equal verify rows bit for bit (test_cuda_parity): a product's unit is one warp's
 * (tile, K share) of the matrix's split (fmc_split: acc = fma(isum, dw * dx, acc) along the share, the w
 * shares added in order, kc = 1), the GLU and store epilogues are q8_glu_out / q8_out, the norms are
 * q8_quant_row, qk_norm_rope_head and attn_combine_head, and attention runs attn_split_tile per 64-key split.
 *
 * Per layer: [RMSNorm + quantise x, every block for itself] [qkv] | [q/k norm, RoPE, KV write] | [attention
 * splits] | [merge + quantise] | [wo, += x] | [RMSNorm + quantise] [gate/up + SiLU * up + quantise] | [down,
 * += x (and the captured copy)] |, where | is a grid barrier. The embedding lookup before and the final norm,
 * lm_head and argmax after stay kernels of their own. */
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda/cuda_attn.cuh"
#include "cuda/cuda_q8_narrow.cuh"

namespace {

enum {
    MK_CWARPS = 8,                      /* consumer warps; warp 8 is the producer */
    MK_CTHREADS = MK_CWARPS * 32,       /* == Q8_THREADS: the quantiser's thread count */
    MK_THREADS = MK_CTHREADS + 32,      /* consumers + producer */
    MK_STAGE_TILES = 4,                 /* weight tiles of a ring stage */
    MK_STAGE_W = MK_STAGE_TILES * 512,  /* their quants */
    MK_STAGE_S = MK_STAGE_TILES * 32,   /* their scale pairs */
    MK_RED_FLOATS = 2 * 2 * 4 * 4 * 32, /* [round parity][group slot][warp][4][32] */
    MK_CH = 16,                         /* splits the merge folds a chunk (two buffers of a unit: 16.6 KB) */
    MK_QR = 16,                         /* query rows of an attention unit: one tile (attn_split_tile) */
    MK_TRACE = 18,                      /* phase boundaries a layer (fmc_mk_trace) */
};
/* Named barriers (0 is __syncthreads, which the consumers never use: the producer does not take part). */
enum { MK_BAR_ALL = 1, MK_BAR_SLOT = 2 /* + slot */, MK_BAR_GRP = 4 /* + group of 64 */, MK_BAR_MERGE = 8 };
static_assert((int)MK_CTHREADS == (int)Q8_THREADS,
              "the quantiser's reduction order assumes Q8_THREADS threads");

struct mk_mat {
    const int4 *qs;
    const uint32_t *sc;
    int N, K, w, glu;
};
struct mk_layer {
    mk_mat m[4]; /* qkv, wo, gate/up, down */
    const float *attn_norm, *q_norm, *k_norm, *ffn_norm;
    __half *kc, *vc;
    float *cap;
};
struct mk_params {
    const mk_layer *L;
    const unsigned short *gstart, *gcount; /* [4 products][blocks]: each block's run of groups (of units) */
    unsigned *bar;                         /* the grid barrier's arrivals (zeroed before each launch) */
    float *x, *qkv, *q, *part;
    int8_t *xq; /* the attention's and the GLU's quantised output, fragment order */
    float *xd;
    const float *rope;
    const int *pos;
    int n_layers, dim, n_heads, n_kv, ffn, max_splits, ns, max_nb;
    int pf;      /* ring stages a producer lane may ask L2 for ahead of its ring while the ring is full */
    int red;     /* the grid barrier counts in with a reduction (no return) instead of an atomic add */
    int poll;    /* the producer's lanes in step, testing their rings without blocking */
    int self;    /* no producer: each consumer warp refills the stage it has just used */
    int fold;    /* q/k norm, RoPE and the KV write inside the attention units (one grid barrier fewer) */
    float *qblk; /* with fold: each block's queries of its unit, [blocks][n_heads * HD] */
    /* units: a product's (tile, K share) units spread over the blocks by bytes, each consumer warp taking
     * its own; the last unit of a group to finish (ucnt: arrivals, never reset) adds the group's partial
     * sums (upart, [units][16]) in share order and stores */
    int units;
    float *upart;
    unsigned *ucnt; /* [4 products][max_groups] */
    int max_groups;
    unsigned long long *trace; /* block 0's clock at each phase boundary, [n_layers][MK_TRACE], or NULL */
    float eps;
};

/* The device code below uses sm_90's copy engine and mbarriers; the portable PTX pass (compute_80) compiles
 * the kernel as a trap (fmc_mk_create refuses such devices). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* A waiting loop that outlives this has lost a count: trap (the launch fails) rather than hang the device. */
constexpr unsigned long long MK_TIMEOUT_NS = 5000000000ull;

__device__ __forceinline__ void named_sync(int id, int n) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned *p) {
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
/* Whether the mbarrier's phase of this parity has completed: try_wait may first suspend the thread a while
 * (a limit the hardware sets), test_wait answers at once. */
#define MK_MB_WAIT(op)                                                                                       \
    "{\n.reg .pred p;\nmbarrier." op ".parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}"
__device__ __forceinline__ bool mb_try(uint64_t *b, unsigned parity) {
    unsigned ok;
    asm volatile(MK_MB_WAIT("try_wait") : "=r"(ok) : "r"(smem_addr(b)), "r"(parity) : "memory");
    return ok != 0;
}
__device__ __forceinline__ bool mb_test(uint64_t *b, unsigned parity) {
    unsigned ok;
    asm volatile(MK_MB_WAIT("test_wait") : "=r"(ok) : "r"(smem_addr(b)), "r"(parity) : "memory");
    return ok != 0;
}
#undef MK_MB_WAIT
__device__ __forceinline__ void mk_wait(uint64_t *b, unsigned parity) {
    if (mb_try(b, parity)) return;
    const unsigned long long t0 = global_ns();
    while (!mb_try(b, parity))
        if (global_ns() - t0 > MK_TIMEOUT_NS) __trap();
}
/* bulk_copy with an L2 policy: the weights are read once a step. */
__device__ __forceinline__ void bulk_copy_hint(void *dst, const void *src, unsigned bytes, uint64_t *b,
                                               uint64_t pol) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], "
        "%2, [%3], %4;" ::"r"(smem_addr(dst)),
        "l"(src), "r"(bytes), "r"(smem_addr(b)), "l"(pol)
        : "memory");
}

/* Every consumer thread of every block arrives; returns once all have. Thread 0 of a block counts it in
 * (release: after the block's writes) and waits (acquire), as cooperative groups' grid sync does; data
 * written by other blocks is then read through L2 (ld.cg, cp.async.cg). */
__device__ __forceinline__ void mk_grid_sync(unsigned *bar, unsigned &target, int red) {
    named_sync(MK_BAR_ALL, MK_CTHREADS);
    if (threadIdx.x == 0) {
        target += gridDim.x;
        if (red)
            asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(bar) : "memory");
        else
            __threadfence(), atomicAdd(bar, 1u);
        if (ld_acquire(bar) < target) {
            const unsigned long long t0 = global_ns();
            while (ld_acquire(bar) < target)
                if (global_ns() - t0 > MK_TIMEOUT_NS) __trap();
        }
        __threadfence();
    }
    named_sync(MK_BAR_ALL, MK_CTHREADS);
}

/* A product's unit r of group gr: its tile and the first of its nbw 32-blocks. The GLU's group is 4 tiles
 * (gate rows 32 gr .. and the up rows at the same offset) over all of K; the others' is one tile whose K is
 * split into w shares (q8_gemm_block's). */
__device__ __forceinline__ int mk_unit(const mk_mat &M, int gr, int r, int *kb0, int *nbw) {
    const int NB = M.K >> 5, NT16 = (M.N + 15) >> 4;
    if (M.glu) {
        *kb0 = 0, *nbw = NB;
        return r < 2 ? 2 * gr + r : NT16 / 2 + 2 * gr + r - 2;
    }
    *nbw = NB / M.w, *kb0 = r * *nbw;
    return gr;
}
__device__ __forceinline__ int mk_units(const mk_mat &M) {
    return M.glu ? 4 : M.w;
}

/* The shared memory of a block. */
struct mk_smem {
    unsigned char *ring_w, *ring_s; /* [consumer warp][stage] */
    uint64_t *full, *empty;         /* [consumer warp][stage] */
    unsigned char *xs;              /* the product's activations, token 0's 32 quants a 32-block */
    float *ds;                      /* and their scales */
    float *red;                     /* MK_RED_FLOATS: the warps' sums (or the GLU's gate / up rows) */
    unsigned char *scratch;         /* attention split / merge */
};
__device__ __forceinline__ mk_smem mk_carve(unsigned char *base, const mk_params &P) {
    mk_smem m;
    const size_t stages = (size_t)MK_CWARPS * P.ns;
    m.ring_w = base;
    m.ring_s = m.ring_w + stages * MK_STAGE_W;
    m.full = (uint64_t *)(m.ring_s + stages * MK_STAGE_S);
    m.empty = m.full + stages;
    m.xs = (unsigned char *)(m.empty + stages);
    m.ds = (float *)(m.xs + (size_t)P.max_nb * 32);
    m.red = m.ds + P.max_nb;
    m.scratch = (unsigned char *)(m.red + MK_RED_FLOATS);
    return m;
}

/* Where producer lane (slot, r) is in its sequence of stages: unit r of the slot's groups (every other group
 * of the block's run) of each product of each layer, 4 tiles a stage. */
struct mk_cursor {
    int l, k, j, kb, nbw, first, step, r;
    const int4 *qs;
    const uint32_t *sc;
    bool live;
    /* groups: unit r of groups first, first + 2, .. of the block's run (group slot `first`); with P.units,
     * the block's units first, first + MK_CWARPS, .. (consumer warp `first`) */
    __device__ void start(const mk_params &P, int first_, int r_) {
        first = first_, step = P.units ? MK_CWARPS : 2, r = r_, l = 0, k = 0, j = first - step, live = true;
        next_unit(P);
    }
    /* the next unit of the lane's in this product, else in the next product */
    __device__ void next_unit(const mk_params &P) {
        for (;;) {
            if (l >= P.n_layers) {
                live = false;
                return;
            }
            const mk_mat M = P.L[l].m[k];
            const int i = k * gridDim.x + blockIdx.x;
            j += step;
            if (j < P.gcount[i] && (P.units || r < mk_units(M))) {
                int kb0, tile;
                if (P.units) {
                    const int u = P.gstart[i] + j, upg = mk_units(M);
                    tile = mk_unit(M, u / upg, u % upg, &kb0, &nbw);
                } else {
                    tile = mk_unit(M, P.gstart[i] + j, r, &kb0, &nbw);
                }
                const size_t t0 = (size_t)tile * (M.K >> 5) + kb0;
                qs = M.qs + t0 * 32, sc = M.sc + t0 * 8, kb = 0;
                return;
            }
            j = first - step;
            if (++k == 4) k = 0, l++;
        }
    }
    __device__ unsigned tiles() const { return (unsigned)min((int)MK_STAGE_TILES, nbw - kb); }
    __device__ void advance(const mk_params &P) {
        kb += MK_STAGE_TILES;
        if (kb >= nbw) next_unit(P);
    }
};

/* The cursor's stage into ring slot s (rw / rs: the warp's ring, full: its mbarriers). */
__device__ __forceinline__ void mk_issue(const mk_cursor &c, unsigned char *rw, unsigned char *rs,
                                         uint64_t *full, int s, uint64_t pol) {
    const unsigned n = c.tiles();
    mb_expect(full + s, n * 544);
    bulk_copy_hint(rw + (size_t)s * MK_STAGE_W, c.qs + (size_t)c.kb * 32, n * 512, full + s, pol);
    bulk_copy_hint(rs + (size_t)s * MK_STAGE_S, c.sc + (size_t)c.kb * 8, n * 32, full + s, pol);
}

__device__ __forceinline__ void prefetch_l2(const void *src, unsigned bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src), "r"(bytes) : "memory");
}
/* The cursor's stage asked of L2 (no copy into shared memory), and the cursor past it. */
__device__ __forceinline__ void mk_prefetch(mk_cursor &c, const mk_params &P) {
    prefetch_l2(c.qs + (size_t)c.kb * 32, c.tiles() * 512);
    prefetch_l2(c.sc + (size_t)c.kb * 8, c.tiles() * 32);
    c.advance(P);
}

/* The producer: lane j < 8 streams, stage by stage, the tiles consumer warp j will take, in the order it
 * takes them (every product of every layer), each stage once that warp has freed it. While the ring is full
 * (the consumers wait at a barrier or compute the attention), it asks L2 for up to P.pf stages past it, so
 * that the memory keeps streaming through the waits and the ring refills from L2 afterwards. */
__device__ void mk_produce(const mk_params &P, const mk_smem &m) {
    const int lane = threadIdx.x & 31;
    if (lane >= MK_CWARPS) return;
    const uint64_t pol = l2_evict_first();
    int s = 0, ahead = 0; /* ahead: stages asked of L2 past the one the ring waits for */
    unsigned ph = 0;
    uint64_t *full = m.full + lane * P.ns, *empty = m.empty + lane * P.ns;
    unsigned char *rw = m.ring_w + (size_t)lane * P.ns * MK_STAGE_W;
    unsigned char *rs = m.ring_s + (size_t)lane * P.ns * MK_STAGE_S;
    mk_cursor cp, pf;
    if (P.units)
        cp.start(P, lane, 0);
    else
        cp.start(P, lane >> 2, lane & 3);
    pf = cp;
    auto issue = [&]() {
        mk_issue(cp, rw, rs, full, s, pol);
        if (++s == P.ns) s = 0, ph ^= 1;
        cp.advance(P);
        if (ahead > 0)
            ahead--;
        else
            pf = cp;
    };
    auto prefetch = [&]() {
        mk_prefetch(pf, P);
        ahead++;
    };
    if (P.poll) {
        /* the 8 lanes in step: each round every lane whose next stage is free issues it (a non-blocking
         * test), so that no lane's wait holds up the others */
        unsigned long long t0 = global_ns();
        for (;;) {
            const bool live = cp.live;
            if (!__any_sync(0xffu, live)) break;
            bool moved = false;
            if (live && mb_test(empty + s, ph ^ 1))
                issue(), moved = true;
            else if (live && ahead < P.pf && pf.live)
                prefetch(), moved = true;
            if (__any_sync(0xffu, moved))
                t0 = global_ns();
            else if (global_ns() - t0 > MK_TIMEOUT_NS)
                __trap();
            else
                __nanosleep(64); /* every ring full: leave the issue slots to the consumers a while */
        }
        return;
    }
    while (cp.live) {
        if (!mb_try(empty + s, ph ^ 1)) {
            const unsigned long long t0 = global_ns();
            while (!mb_try(empty + s, ph ^ 1)) {
                if (ahead < P.pf && pf.live)
                    prefetch();
                else if (global_ns() - t0 > MK_TIMEOUT_NS)
                    __trap();
            }
        }
        issue();
    }
}

/* A consumer warp's place in its ring; with P.self, lane 0's cursor of the stages it issues next, and
 * with P.pf, the cursor of the stage P.pf past the ring that it asks L2 for along with each. */
struct mk_ring {
    int s;
    unsigned ph;
    bool self;
    mk_cursor cur, pfc;
    uint64_t pol;
    const mk_params *P;
};

/* The quantiser's output into the block's activations: token 0's 32 quants of each 32-block in the order of
 * the first 32 bytes of its fragment-order block, and its scale. */
struct mk_smem_sink {
    unsigned char *xs;
    float *ds;
    __device__ __forceinline__ void put(int b, float d, const uint32_t (&q)[8]) const {
        ds[b] = d;
#pragma unroll
        for (int m = 0; m < 8; m++) *(uint32_t *)(xs + b * 32 + (m & 3) * 8 + (m >> 2) * 4) = q[m];
    }
};
struct mk_all_bar {
    __device__ __forceinline__ void sync() const { named_sync(MK_BAR_ALL, MK_CTHREADS); }
};
/* A group of 64 consumer threads (qk_norm_rope_head, the attention's units). */
struct mk_group {
    int t, id;
    double *sh;
    __device__ __forceinline__ int tid() const { return t; }
    __device__ __forceinline__ int size() const { return 64; }
    __device__ __forceinline__ void sync() const { named_sync(id, 64); }
};
/* A merge unit of HD threads: partials loaded through L2 (other blocks wrote them in this launch). */
struct mk_combine {
    int id, n;
    __device__ __forceinline__ void sync() const { named_sync(id, n); }
    __device__ __forceinline__ void fetch(float *dst, const float *src, int n2, int i, int nt) const {
        for (int k = i; k < n2; k += nt) *(float2 *)(dst + 2 * k) = __ldcg((const float2 *)(src + 2 * k));
    }
    template <int N> __device__ __forceinline__ void wait() const {}
};

/* The activations of a product from fragment-order xq / xd (token 0) into the block's shared memory. */
__device__ void mk_load_act(const int8_t *xq, const float *xd, int K, const mk_smem &m) {
    const int NB = K >> 5, tid = threadIdx.x;
    for (int j = tid; j < 2 * NB; j += MK_CTHREADS)
        cp_async16(m.xs + (size_t)j * 16, xq + (size_t)(j >> 1) * 256 + (j & 1) * 16);
    for (int j = tid; j < NB; j += MK_CTHREADS) m.ds[j] = __ldcg(xd + (size_t)j * 8);
    cp_async_commit();
    cp_async_wait<0>();
    named_sync(MK_BAR_ALL, MK_CTHREADS);
}

/* The calling warp's unit of nbw 32-blocks from kb0 of the product's activations (the block's m.xs / m.ds),
 * its stages taken from the warp's ring, into acc (fmc_split's order: acc = fma(isum, dw * dx, acc)). */
__device__ __forceinline__ void mk_stream_unit(float (&acc)[4], int kb0, int nbw, mk_ring &rg,
                                               const mk_smem &m, int ns) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    uint64_t *full = m.full + warp * ns, *empty = m.empty + warp * ns;
    unsigned char *rw = m.ring_w + (size_t)warp * ns * MK_STAGE_W,
                  *rs = m.ring_s + (size_t)warp * ns * MK_STAGE_S;
    const uint2 *xw = (const uint2 *)m.xs + (size_t)kb0 * 4 + c;
    const float *dw = m.ds + kb0;
    auto tile = [&](const int4 &A, uint32_t sc, uint2 xv, float dx) {
        int d[4];
        mma_s8(d, A, xv.x, xv.y);
        q8_scale_add<4>(acc, d, half_lo(sc), half_hi(sc), make_float2(dx, 0.0f));
    };
    /* the stage back to the producer */
    auto release = [&]() {
        __syncwarp();
        if (lane == 0) mb_arrive(empty + rg.s);
    };
    for (int kb = 0; kb < nbw; kb += MK_STAGE_TILES) {
        mk_wait(full + rg.s, rg.ph);
        const int4 *W = (const int4 *)(rw + (size_t)rg.s * MK_STAGE_W) + lane;
        const uint32_t *S = (const uint32_t *)(rs + (size_t)rg.s * MK_STAGE_S) + g;
        if (nbw - kb >= MK_STAGE_TILES) {
            /* a full stage: its tiles into registers at once, the stage handed back, then the products in
             * order */
            int4 A[MK_STAGE_TILES];
            uint32_t sc[MK_STAGE_TILES];
            uint2 xv[MK_STAGE_TILES];
            float dx[MK_STAGE_TILES];
#pragma unroll
            for (int k = 0; k < MK_STAGE_TILES; k++)
                A[k] = W[k * 32], sc[k] = S[k * 8], xv[k] = xw[(size_t)(kb + k) * 4], dx[k] = dw[kb + k];
            if (!rg.self) release();
#pragma unroll
            for (int k = 0; k < MK_STAGE_TILES; k++) tile(A[k], sc[k], xv[k], dx[k]);
        } else {
            for (int k = 0; k < nbw - kb; k++)
                tile(W[k * 32], S[k * 8], xw[(size_t)(kb + k) * 4], dw[kb + k]);
            if (!rg.self) release();
        }
        if (rg.self) { /* the products have used the loads: the slot is free for the copy engine */
            __syncwarp();
            if (lane == 0 && rg.cur.live) {
                mk_issue(rg.cur, rw, rs, full, rg.s, rg.pol);
                rg.cur.advance(*rg.P);
                if (rg.P->pf && rg.pfc.live) mk_prefetch(rg.pfc, *rg.P);
            }
        }
        if (++rg.s == ns) rg.s = 0, rg.ph ^= 1;
    }
}

/* One product of token 0: the block's groups two at a time (consumer warps 0..3 and 4..7), warp r of a group
 * slot taking unit r from its ring; then warp 0 of the slot adds the units' sums in order (the merge of
 * gemm_merge) and stores (q8_out), or writes the GLU's output (q8_glu_out). */
template <int MODE>
__device__ __forceinline__ void mk_product(const mk_mat &M, const q8_args &a, int start, int cnt, mk_ring &rg,
                                           const mk_smem &m, int ns) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, slot = warp >> 2, r = warp & 3;
    const int g = lane >> 2, c = lane & 3, units = mk_units(M);
    for (int jr = 0; 2 * jr + slot < cnt; jr++) {
        const int gr = start + 2 * jr + slot;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (r < units) {
            int kb0, nbw;
            mk_unit(M, gr, r, &kb0, &nbw);
            mk_stream_unit(acc, kb0, nbw, rg, m, ns);
        }
        /* two buffers by round parity: warp 0 reads round jr's while the others fill round jr + 1's */
        float *rb = m.red + ((jr & 1) * 2 + slot) * 4 * 4 * 32;
        if (M.glu) {
#pragma unroll
            for (int j = 0; j < 4; j++) rb[(2 * c + (j & 1)) * 64 + r * 16 + g + (j >> 1) * 8] = acc[j];
        } else if (r < units) {
#pragma unroll
            for (int j = 0; j < 4; j++) rb[(r * 4 + j) * 32 + lane] = acc[j];
        }
        named_sync(MK_BAR_SLOT + slot, 128);
        if (r != 0) continue;
        if (M.glu) {
            q8_glu_out(a, 0, gr, M.N / 64, rb[lane], rb[32 + lane]);
            continue;
        }
#pragma unroll
        for (int j = 0; j < 4; j += 2) { /* token 0: rows g (j = 0) and g + 8 (j = 2) in the lanes c == 0 */
            float v = acc[j];
            for (int q = 1; q < units; q++) v = __fadd_rn(v, rb[(q * 4 + j) * 32 + lane]);
            const int row = gr * 16 + g + (j >> 1) * 8;
            if (c == 0 && row < M.N) q8_out<MODE>(a, row, 0, v);
        }
    }
}

/* One product of token 0 by units (P.units): consumer warp w takes the block's units w, w + 8, ..; a unit's
 * 16 sums (token 0) go to upart, and the warp that finishes its group's last unit adds the group's sums in
 * share order (as mk_product) and stores, or writes the GLU's output. */
template <int MODE>
__device__ __forceinline__ void mk_product_units(const mk_mat &M, const q8_args &a, int start, int cnt,
                                                 mk_ring &rg, const mk_smem &m, int ns, float *part,
                                                 unsigned *arrivals) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int upg = mk_units(M);
    for (int j = warp; j < cnt; j += MK_CWARPS) {
        const int u = start + j, gr = u / upg;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int kb0, nbw;
        mk_unit(M, gr, u - gr * upg, &kb0, &nbw);
        mk_stream_unit(acc, kb0, nbw, rg, m, ns);
        if (c == 0) part[(size_t)u * 16 + g] = acc[0], part[(size_t)u * 16 + g + 8] = acc[2];
        __threadfence(); /* the sums before the count (threadFenceReduction's order) */
        __syncwarp();
        unsigned before = 0;
        if (lane == 0) before = atomicAdd(arrivals + gr, 1u);
        before = __shfl_sync(0xffffffffu, before, 0);
        if (before % upg != (unsigned)upg - 1) continue;
        __threadfence();
        const float *pg = part + (size_t)gr * upg * 16;
        if (M.glu) { /* gate rows 0..31 in units 0, 1; up rows in units 2, 3 */
            q8_glu_out(a, 0, gr, M.N / 64, ld_cg(pg + lane), ld_cg(pg + 32 + lane));
        } else if (lane < 16) {
            float v = ld_cg(pg + lane);
            for (int q = 1; q < upg; q++) v = __fadd_rn(v, ld_cg(pg + q * 16 + lane));
            const int row = gr * 16 + lane;
            if (row < M.N) q8_out<MODE>(a, row, 0, v);
        }
    }
}

__device__ __forceinline__ q8_args mk_args(float *y, float *y2, int8_t *oq, float *od) {
    q8_args a = {};
    a.T = 1;
    a.y = y, a.ldy = 0, a.y2 = y2, a.ldy2 = 0, a.oq = oq, a.od = od;
    return a;
}

#endif

template <int HD>
__global__ void __launch_bounds__(MK_THREADS, 1) k_megakernel(const __grid_constant__ mk_params P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ double group_sh[4][32];
    const mk_smem m = mk_carve(smem, P);
    const int tid = threadIdx.x, warp = tid >> 5;
    if (tid == 0) {
        for (int i = 0; i < MK_CWARPS * P.ns; i++) mb_init(m.full + i, 1), mb_init(m.empty + i, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads(); /* the only whole-block barrier: the producer goes its own way from here */
    if (warp == MK_CWARPS) {
        if (!P.self) mk_produce(P, m);
        return;
    }
    const int n_heads = P.n_heads, n_kv = P.n_kv, q_dim = n_heads * HD, nblk = gridDim.x;
    const int nh = n_heads + 2 * n_kv, grp = warp >> 1, gtid = tid & 63;
    unsigned target = 0;
    mk_ring rg = {0, 0, P.self != 0, {}, {}, l2_evict_first(), &P};
    if (rg.self && (tid & 31) == 0) { /* the ring's first stages */
        unsigned char *rw = m.ring_w + (size_t)warp * P.ns * MK_STAGE_W;
        unsigned char *rs = m.ring_s + (size_t)warp * P.ns * MK_STAGE_S;
        if (P.units)
            rg.cur.start(P, warp, 0);
        else
            rg.cur.start(P, warp >> 2, warp & 3);
        for (int i = 0; i < P.ns && rg.cur.live; i++)
            mk_issue(rg.cur, rw, rs, m.full + warp * P.ns, i, rg.pol), rg.cur.advance(P);
        rg.pfc = rg.cur;
        for (int i = 0; i < P.pf && rg.pfc.live; i++) mk_prefetch(rg.pfc, P);
    }
    const attn_tiles<HD> at(m.scratch);
    uint32_t *Ks = at.Ks;
    __half *Vs = at.Vs, *Qs = at.Qs;
    const uint64_t pol = l2_evict_first();
    const mk_smem_sink sink = {m.xs, m.ds};
    for (int l = 0; l < P.n_layers; l++) {
        const mk_layer &L = P.L[l];
        auto mark = [&](int i) {
            if (P.trace && blockIdx.x == 0 && tid == 0) P.trace[l * MK_TRACE + i] = global_ns();
        };
        auto sync = [&](int i) {
            mark(i);
            mk_grid_sync(P.bar, target, P.red);
            mark(i + 1);
        };
        mark(0);
        auto product = [&](int k, auto mode, const q8_args &a) {
            const int i = k * nblk + blockIdx.x;
            if (P.units)
                mk_product_units<decltype(mode)::value>(L.m[k], a, P.gstart[i], P.gcount[i], rg, m, P.ns,
                                                        P.upart, P.ucnt + (size_t)k * P.max_groups);
            else
                mk_product<decltype(mode)::value>(L.m[k], a, P.gstart[i], P.gcount[i], rg, m, P.ns);
        };
        /* qkv */
        q8_quant_row(P.x, L.attn_norm, P.eps, P.dim, sink, mk_all_bar{});
        mark(1);
        product(0, std::integral_constant<int, Q8_STORE>(), mk_args(P.qkv, NULL, NULL, NULL));
        sync(2);
        /* q/k norm + RoPE + KV write: a head per group of 64 threads, spread over the blocks (with P.fold,
         * in the attention units instead) */
        if (!P.fold) {
            for (int u = grp * nblk + blockIdx.x; u < nh; u += 4 * nblk)
                qk_norm_rope_head(P.qkv, 0, u, n_heads, n_kv, HD, L.q_norm, L.k_norm, P.eps, P.rope, P.pos,
                                  P.q, L.kc, L.vc, mk_group{gtid, MK_BAR_GRP + grp, group_sh[grp]});
            sync(4);
        } else {
            mark(4), mark(5);
        }
        /* attention: a (KV head, 64-key split) unit per block at a time, on warps 0 and 1 */
        if (warp < 2) {
            const int ns = (*P.pos + 1 + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
            for (int u = blockIdx.x; u < n_kv * ns; u += nblk) {
                const int g = u % n_kv, s = u / n_kv;
                const float *q = P.q;
                if (P.fold) { /* the unit's query heads for itself; the split that holds *pos writes its KV
                                 row */
                    const mk_group gq = {gtid, MK_BAR_GRP, group_sh[0]};
                    float *qb = P.qblk + (size_t)blockIdx.x * q_dim;
                    const int G = n_heads / n_kv, h0 = s == ns - 1 ? -2 : 0;
                    for (int h = h0; h < G; h++)
                        qk_norm_rope_head(P.qkv, 0, h >= 0 ? g * G + h : n_heads + (h + 2) * n_kv + g,
                                          n_heads, n_kv, HD, L.q_norm, L.k_norm, P.eps, P.rope, P.pos, qb,
                                          L.kc, L.vc, gq);
                    named_sync(MK_BAR_GRP, 64); /* the queries and the KV row, read back below through L2 */
                    q = qb;
                }
                const attn_block a = attn_block_setup<HD, MK_QR>(1, n_heads, n_kv, P.pos, 1, g, 0);
                attn_copy_split<HD>(Ks, Vs, L.kc, L.vc, a, s, 2, tid, 64, pol);
                attn_load_q<HD, MK_QR>(q, Qs, a.tb, a.g, a.G, n_heads, MK_QR, a.nq, tid, 64);
                cp_async_commit();
                cp_async_wait<0>();
                named_sync(MK_BAR_GRP, 64);
                if (a.warp * 16 < a.nq)
                    attn_split_tile<HD, MK_QR>(a, Qs, Ks, Vs, s, n_heads, P.max_splits, P.part);
                named_sync(MK_BAR_GRP, 64); /* Ks / Vs / Qs are rewritten next */
            }
        }
        sync(6);
        /* merge + quantise: a head per HD threads */
        {
            constexpr int UPB = MK_CTHREADS / HD;
            const int us = tid / HD;
            float *buf = (float *)m.scratch + (size_t)us * 2 * MK_CH * (HD + 2);
            for (int h = us * nblk + blockIdx.x; h < n_heads; h += UPB * nblk)
                attn_combine_head<HD, MK_CH>(n_heads, h, 0, *P.pos + 1, P.max_splits, P.part, buf, P.xq, P.xd,
                                             NULL, tid % HD, mk_combine{MK_BAR_MERGE + us, HD});
        }
        sync(8);
        /* wo, += x */
        mk_load_act(P.xq, P.xd, q_dim, m);
        mark(10);
        product(1, std::integral_constant<int, Q8_ADD>(), mk_args(P.x, NULL, NULL, NULL));
        sync(11);
        /* gate/up, SiLU * up quantised into xq / xd */
        q8_quant_row(P.x, L.ffn_norm, P.eps, P.dim, sink, mk_all_bar{});
        mark(13);
        product(2, std::integral_constant<int, Q8_GLU>(), mk_args(NULL, NULL, P.xq, P.xd));
        sync(14);
        /* down, += x (and the drafter's captured copy) */
        mk_load_act(P.xq, P.xd, P.ffn, m);
        mark(16);
        product(3, std::integral_constant<int, Q8_ADD>(), mk_args(P.x, L.cap, NULL, NULL));
        mark(17);
        if (l + 1 < P.n_layers) /* the kernel's end orders the last layer's */
            mk_grid_sync(P.bar, target, P.red);
    }
#else
    __trap(); /* fmc_mk_create refuses devices below sm_90 */
#endif
}

/* Bytes of shared memory past the rings (activations, sums, scratch) and of one ring stage of every
 * consumer warp (with its two mbarriers). */
size_t mk_fixed_bytes(int hd, int max_nb) {
    const size_t attn = attn_smem(hd, MK_QR);
    const size_t merge = (size_t)(MK_CTHREADS / hd) * 2 * MK_CH * (hd + 2) * 4;
    return (size_t)max_nb * 36 + MK_RED_FLOATS * 4 + std::max(attn, merge);
}
constexpr size_t MK_STAGE_BYTES = (size_t)MK_CWARPS * (MK_STAGE_W + MK_STAGE_S + 16);

typedef void (*mk_kernel)(const mk_params);
mk_kernel mk_pick(int hd) {
    return hd == 32 ? k_megakernel<32> : hd == 64 ? k_megakernel<64> : hd == 128 ? k_megakernel<128> : NULL;
}

} // namespace

struct fmc_mk {
    mk_params p;
    mk_kernel kernel;
    int coop;
    unsigned grid;
    size_t smem;
    std::vector<void *> allocs;
};

void fmc_mk_free(fmc_mk *mk) {
    if (!mk) return;
    for (void *q : mk->allocs) cudaFree(q);
    delete mk;
}

/* Each block's groups of the 4 products, contiguous runs: the extra groups of a product (its groups modulo
 * the blocks) go to the blocks with the fewest bytes so far, the products with the largest groups first, so
 * that every block streams about the same bytes a layer. */
static void mk_balance(const int groups[4], const size_t bytes[4], int nblk,
                       std::vector<unsigned short> &start, std::vector<unsigned short> &count) {
    std::vector<size_t> load(nblk, 0);
    int order[4] = {0, 1, 2, 3};
    std::sort(order, order + 4, [&](int a, int b) { return bytes[a] > bytes[b]; });
    start.assign(4 * nblk, 0), count.assign(4 * nblk, 0);
    for (int k : order) {
        const int base = groups[k] / nblk, extra = groups[k] % nblk;
        std::vector<int> idx(nblk);
        for (int b = 0; b < nblk; b++) idx[b] = b;
        std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return load[a] < load[b]; });
        for (int i = 0; i < nblk; i++) count[k * nblk + idx[i]] = (unsigned short)(base + (i < extra));
        int s = 0;
        for (int b = 0; b < nblk; b++) {
            start[k * nblk + b] = (unsigned short)s;
            s += count[k * nblk + b];
            load[b] += count[k * nblk + b] * bytes[k];
        }
    }
}

int fmc_mk_create(const fmc_mk_desc *d, fmc_mk **out, char *why, size_t whylen) {
    *out = NULL;
    auto no = [&](const char *msg) {
        snprintf(why, whylen, "%s", msg);
        return 1;
    };
    int dev = 0, major = 0, coop = 0, smem_optin = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess)
        return no("device attributes unavailable");
    if (major < 9 || !coop) return no("needs sm_90 (bulk copies) and cooperative launches");
    const mk_kernel kernel = mk_pick(d->hd);
    if (!kernel) return no("head_dim must be 32, 64 or 128");
    if (d->n_heads / d->n_kv > MK_QR) return no("more than 16 query heads per KV head");
    const fmc_mk_layer &L0 = d->layers[0];
    const fmc_q8 *mats0[4] = {L0.qkv, L0.wo, L0.gu, L0.down};
    for (int l = 0; l < d->n_layers; l++) {
        const fmc_mk_layer &L = d->layers[l];
        const fmc_q8 *mats[4] = {L.qkv, L.wo, L.gu, L.down};
        for (int k = 0; k < 4; k++) {
            const fmc_q8 *w = mats[k], *w0 = mats0[k];
            if (w->sp.kc != 1 || w->sp.rt != (k == 2 ? 4 : 1) || (k == 2 && w->sp.w != 1))
                return no("a matrix's split merges across blocks");
            if (w->N != w0->N || w->K != w0->K || w->sp.w != w0->sp.w)
                return no("layers of different shapes");
        }
    }
    /* 32-blocks of the widest activations, rounded so that what follows them stays 16-byte aligned */
    const int max_nb = (std::max(std::max(d->dim, d->n_heads * d->hd), d->ffn) / 32 + 3) & ~3;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) return no("kernel attributes unavailable");
    const size_t fixed = mk_fixed_bytes(d->hd, max_nb), room = (size_t)smem_optin - fa.sharedSizeBytes;
    if (room < fixed + 2 * MK_STAGE_BYTES) return no("too little shared memory");
    int ns = (int)std::min<size_t>(16, (room - fixed) / MK_STAGE_BYTES);
    const char *e = getenv("FMC_MEGA_NS"); /* fewer stages (experiments: how deep the rings must be) */
    if (e && atoi(e) >= 2) ns = std::min(ns, atoi(e));
    const char *pf = getenv("FMC_MEGA_PF"); /* stages asked of L2 ahead of a full ring (experiments) */
    const size_t smem = fixed + (size_t)ns * MK_STAGE_BYTES;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return no("shared-memory limit refused");
    int per_sm = 0, sms = fmc_sm_count();
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, MK_THREADS, smem) != cudaSuccess ||
        per_sm < 1)
        return no("the persistent block does not fit an SM");

    fmc_mk *mk = new fmc_mk();
    mk->kernel = kernel, mk->coop = 1, mk->grid = (unsigned)sms, mk->smem = smem;
    mk_params &p = mk->p;
    p.n_layers = d->n_layers, p.dim = d->dim, p.n_heads = d->n_heads, p.n_kv = d->n_kv, p.ffn = d->ffn;
    p.max_splits = d->max_splits, p.ns = ns, p.max_nb = max_nb, p.eps = d->eps, p.pf = pf ? atoi(pf) : 0;
    p.red = getenv("FMC_MEGA_RED") != NULL, p.poll = getenv("FMC_MEGA_POLL") != NULL; /* experiments */
    p.self = getenv("FMC_MEGA_SELF") != NULL, p.fold = getenv("FMC_MEGA_FOLD") != NULL;
    p.x = d->x, p.qkv = d->qkv, p.q = d->q, p.part = d->part, p.xq = d->xq, p.xd = d->xd;
    p.rope = d->rope, p.pos = d->pos;
    std::vector<mk_layer> layers(d->n_layers);
    for (int l = 0; l < d->n_layers; l++) {
        const fmc_mk_layer &S = d->layers[l];
        const fmc_q8 *mats[4] = {S.qkv, S.wo, S.gu, S.down};
        for (int k = 0; k < 4; k++)
            layers[l].m[k] = {mats[k]->qs, mats[k]->sc, mats[k]->N, mats[k]->K, mats[k]->sp.w, k == 2};
        layers[l].attn_norm = S.attn_norm, layers[l].q_norm = S.q_norm, layers[l].k_norm = S.k_norm;
        layers[l].ffn_norm = S.ffn_norm, layers[l].kc = S.kc, layers[l].vc = S.vc, layers[l].cap = S.cap;
    }
    p.units = getenv("FMC_MEGA_UNITS") != NULL; /* experiment */
    int groups[4], runs[4], max_groups = 0, max_units = 0;
    size_t bytes[4];
    for (int k = 0; k < 4; k++) {
        const fmc_q8 *w = mats0[k];
        const int upg = k == 2 ? 4 : w->sp.w; /* units a group (mk_units) */
        const size_t tiles = k == 2 ? 4 : 1;
        groups[k] = k == 2 ? w->N / 64 : (w->N + 15) / 16;
        bytes[k] = tiles * (size_t)(w->K / 32) * 544; /* a group's */
        runs[k] = p.units ? groups[k] * upg : groups[k];
        if (p.units) bytes[k] /= upg;
        max_groups = std::max(max_groups, groups[k]), max_units = std::max(max_units, groups[k] * upg);
    }
    p.max_groups = max_groups;
    if (runs[0] > 65535 || runs[2] > 65535) {
        fmc_mk_free(mk);
        return no("too many row groups");
    }
    std::vector<unsigned short> start, count;
    mk_balance(runs, bytes, sms, start, count);
    auto up = [&](void **dst, const void *src, size_t n) {
        if (cudaMalloc(dst, n) != cudaSuccess) return -1;
        mk->allocs.push_back(*dst);
        return src && cudaMemcpy(*dst, src, n, cudaMemcpyHostToDevice) != cudaSuccess ? -1 : 0;
    };
    void *dl = NULL, *ds = NULL, *dc = NULL, *db = NULL, *dq = NULL, *dp = NULL, *dn = NULL;
    if (up(&dl, layers.data(), layers.size() * sizeof(mk_layer)) || up(&ds, start.data(), start.size() * 2) ||
        up(&dc, count.data(), count.size() * 2) || up(&db, NULL, 4) ||
        up(&dq, NULL, (size_t)sms * d->n_heads * d->hd * 4) || up(&dp, NULL, (size_t)max_units * 16 * 4) ||
        up(&dn, NULL, (size_t)4 * max_groups * 4) ||
        cudaMemset(dn, 0, (size_t)4 * max_groups * 4) != cudaSuccess) {
        fmc_mk_free(mk);
        snprintf(why, whylen, "cuda: out of device memory for the persistent kernel's tables");
        return -1;
    }
    p.L = (const mk_layer *)dl, p.gstart = (const unsigned short *)ds, p.gcount = (const unsigned short *)dc;
    p.bar = (unsigned *)db, p.qblk = (float *)dq, p.upart = (float *)dp, p.ucnt = (unsigned *)dn;
    *out = mk;
    return 0;
}

void fmc_mk_launch(const fmc_mk *mk, cudaStream_t s) {
    cudaMemsetAsync(mk->p.bar, 0, 4, s);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(mk->grid);
    cfg.blockDim = dim3(MK_THREADS);
    cfg.dynamicSmemBytes = mk->smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cfg.attrs = at;
    cfg.numAttrs = mk->coop ? 1 : 0;
    cudaLaunchKernelEx(&cfg, mk->kernel, mk->p);
}

void fmc_mk_set_cooperative(fmc_mk *mk, int on) {
    mk->coop = on;
}

int fmc_mk_cooperative(const fmc_mk *mk) {
    return mk->coop;
}

int fmc_mk_trace(fmc_mk *mk, int on) {
    if (!on || mk->p.trace) {
        if (!on) mk->p.trace = NULL;
        return 0;
    }
    void *t = NULL;
    if (cudaMalloc(&t, (size_t)mk->p.n_layers * MK_TRACE * 8) != cudaSuccess) return -1;
    mk->allocs.push_back(t);
    mk->p.trace = (unsigned long long *)t;
    return 0;
}

int fmc_mk_trace_read(const fmc_mk *mk, double *us) {
    const int L = mk->p.n_layers;
    std::vector<unsigned long long> t((size_t)L * MK_TRACE);
    if (!mk->p.trace || L < 3 ||
        cudaMemcpy(t.data(), mk->p.trace, t.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess)
        return -1;
    for (int i = 0; i < MK_TRACE; i++) { /* layers 1 .. L-2: each has a next layer's start */
        double sum = 0;
        for (int l = 1; l < L - 1; l++) {
            const unsigned long long a = t[(size_t)l * MK_TRACE + i];
            const unsigned long long b =
                i + 1 < MK_TRACE ? t[(size_t)l * MK_TRACE + i + 1] : t[(size_t)(l + 1) * MK_TRACE];
            sum += (double)(b - a) * 1e-3;
        }
        us[i] = sum / (L - 2);
    }
    return MK_TRACE;
}

int fmc_mk_stages(const fmc_mk *mk) {
    return mk->p.ns;
}
