/* cuda_megakernel.cu: the layers of a one-token forward (a plain decode step), or of a verify block of up to
 * 8 rows, in one persistent launch.
 *
 * Why: a step of Qwen3-4B runs 9 kernels a layer. Each product pays a fixed ~4-6 us beyond its bytes (the
 * wait for its predecessor, the activations' L2 round trip, the ramp and drain of one wave), and the weight
 * stream stops during every norm, RoPE and attention kernel: the step ran at ~46 % of the copy rate (bench/
 * RESULTS.md). Here one block per SM runs every layer. Each of its 12 or 16 warps streams its share of every
 * product's weight tiles, in program order, into its own shared-memory ring with the copy engine
 * (cp.async.bulk, an mbarrier a 4-tile stage): it refills a stage as soon as it has used it, so the ring
 * always holds the next stages of its sequence, also across the phases between grid barriers (norms,
 * attention) where no weights are read. What those phases read from L2 under the weight stream costs a round
 * trip of about a microsecond each, so the layer tables, the norm weights (copied in a phase ahead), x, the
 * residual rows of an epilogue and an attention unit's cached keys and values are staged before they are
 * needed.
 *
 * Bits: a (row, token) is computed with the operations of the kernels a verify block runs, in the same
 * order, so steps here equal verify rows bit for bit (test_cuda_parity): a product's unit is one warp's
 * (tile, K share) of the matrix's split (fmc_split: acc = fma(isum, dw * dx, acc) along the share, the w
 * shares added in order, kc = 1), the GLU and store epilogues are q8_glu_out / q8_out / q8_put (+= x), the
 * norms are q8_quant_row_src, qk_norm_rope_head and attn_combine_head, and attention runs attn_split_tile's
 * arithmetic per 64-key split (attn_split_tile_kw: the same tile on 4 warps).
 *
 * Per layer of a step: [RMSNorm + quantise x, every block for itself] [qkv] | [attention splits, each after
 * its heads' q/k norms, RoPE and KV write] | [merge + quantise] | [wo, += x] | [RMSNorm + quantise] [gate/up
 * + SiLU * up + quantise] | [down, += x (and the captured copy)] |, where | is a grid barrier. A verify block
 * (k_megakernel<HD, 8>) differs where T rows would cost T times a step's chains: block t norms row t | then
 * every block loads the T rows, quantised (each block norming all T took 9-12 us a phase against 4.4, however
 * its warps shared the work: 132 blocks reading the f32 rows move 4x the bytes through L2; bench/RESULTS.md,
 * thirtieth and forty-first sessions), and the q/k norms of every (row, head) are a phase of their own before
 * the attention's barrier. The embedding lookup before and the final norm, lm_head and argmax after stay
 * kernels of their own. */
#include <stdio.h>
#include <stdlib.h>

#include <algorithm>
#include <vector>

#include "cuda/cuda_attn.cuh"
#include "cuda/cuda_q8_narrow.cuh"

/* -DFM_MK_PROFILE=1 (diagnostics): with the phase clock on, every warp also counts the cycles its lane 0
 * spends waiting for ring stages, issuing their copies and in mk_stream_unit in all, and its stages, per
 * product (fmc_mk_trace_read's us[54 ..)). */
#ifndef FM_MK_PROFILE
#define FM_MK_PROFILE 0
#endif
/* -DFM_MK_NOCOPY=1 (diagnostics; timing only, the results are wrong): every ring stage completes at once,
 * without its copies, so the step runs without the weight stream: its floor of compute, phases and barriers
 * (bench/RESULTS.md, thirty-fourth session). */
#ifndef FM_MK_NOCOPY
#define FM_MK_NOCOPY 0
#endif

namespace {

/* Warps of a block, W: 12 or 16 (the kernel's template argument, fmc_mk_create's choice). They make slots of
 * 4 warps (8 for a matrix split in 8 K shares by fmc_q8_widen: mk_slot_shift), each taking a product's groups
 * in turn; the phases between the products run on the first 8 (Q8_THREADS threads: the quantiser's reduction
 * order). 12 give the 304 gate/up and 384 qkv groups of Qwen3-4B a slot each on 132 SMs (8 left 40 and 120 of
 * them a second round). 16 give each of wo's and down's 160 groups of 8 shares a slot (two a block), for 4
 * ring stages a warp instead of 6 (bench/RESULTS.md, thirty-eighth and thirty-ninth sessions). */
enum {
    MK_STAGE_TILES = 4,                /* weight tiles of a ring stage */
    MK_STAGE_W = MK_STAGE_TILES * 512, /* their quants */
    MK_STAGE_S = MK_STAGE_TILES * 32,  /* their scale pairs */
    MK_CH = 16,                        /* splits the merge folds a chunk (two buffers: 16.6 KB) */
    MK_QR = 16,                        /* query rows of an attention unit (attn_split_tile_kw) */
    MK_TRACE = 18,                     /* phase boundaries a layer (fmc_mk_trace) */
    MK_PROF = 16, /* FM_MK_PROFILE's counts a layer: 4 products x [wait, issue, stream, stages] */
};
/* The products' reduction buffer of W warps: [round parity][group slot][warp of the slot][4][32]. */
__host__ __device__ constexpr int mk_red_floats(int W) {
    return 2 * W * 4 * 32;
}
/* Named barriers (0 is __syncthreads). A phase's sub-block barriers (a product's slots, the q/k norms' and
 * the attention's groups of 64, the merge's units) reuse ids from 2: block-wide barriers part the phases. */
enum { MK_BAR_ALL = 1, MK_BAR_Q8 = 15, MK_BAR_SLOT = 2 /* + slot */, MK_BAR_GRP = 2, MK_BAR_MERGE = 2 };

/* Bytes of the activations of TT tokens a 32-block: quants (token 0's 32; TT = 8: the fragment-order block
 * of 8 tokens) and scales. */
constexpr size_t mk_act_bytes(int TT) {
    return TT == 1 ? 36 : 8 * 36;
}
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
    const mk_layer *L;                     /* [n_layers], copied into each block's shared memory */
    const unsigned short *gstart, *gcount; /* [4 products][blocks]: each block's run of groups */
    unsigned *bar;                         /* the grid barrier's arrivals (zeroed before each launch) */
    float *x, *qkv, *part;
    float *q;   /* a verify launch's normed and rotated queries [T][n_heads * hd] */
    int8_t *xq; /* the attention's and the GLU's quantised output, fragment order */
    float *xd;
    int8_t *xqn; /* a verify launch's norms' quantised output (xq is the GLU's, written while other blocks
                    may still read the norm's) */
    float *xdn;
    const float *rope;
    const int *pos;
    int n_layers, dim, n_heads, n_kv, ffn, max_splits, ns, max_nb;
    int T, ldcap;              /* the launch's tokens (1 .. the instance's TT); the captured rows' stride */
    unsigned long long *trace; /* each block's clock at each phase boundary, [blocks][n_layers][MK_TRACE],
                                  then each block's SM */
    unsigned long long *prof;  /* FM_MK_PROFILE: [blocks][n_layers][4 products][wait, issue, stream, stage] */
    float eps;
};

/* The device code below uses sm_90's copy engine and mbarriers; the portable PTX pass (compute_80) compiles
 * the kernel as a trap (fmc_mk_create refuses such devices). */
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
/* A waiting loop that outlives this has lost a count: trap (the launch fails) rather than hang the device. */
constexpr unsigned long long MK_TIMEOUT_NS = 5000000000ull;

__device__ __forceinline__ unsigned long long global_ns() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
/* Whether the mbarrier's phase of this parity has completed (try_wait may first suspend the thread a while,
 * a limit the hardware sets). */
__device__ __forceinline__ bool mb_try(uint64_t *b, unsigned parity) {
    unsigned ok;
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, "
        "p;\n}"
        : "=r"(ok)
        : "r"(smem_addr(b)), "r"(parity)
        : "memory");
    return ok != 0;
}
__device__ __forceinline__ void mk_wait(uint64_t *b, unsigned parity) {
    if (mb_try(b, parity)) return;
    const unsigned long long t0 = global_ns();
    while (!mb_try(b, parity))
        if (global_ns() - t0 > MK_TIMEOUT_NS) __trap();
}
/* Every thread of every block arrives; returns once all have. Thread 0 of a block counts it in with a release
 * reduction (after the block's writes, which the named barrier orders before it) and waits with acquire
 * loads, as CUTLASS's grid barrier does; data written by other blocks is then read through L2 (ld.cg,
 * cp.async.cg). No __threadfence around it: the one after the wait alone took 3 % of a step. */
template <int W> __device__ __forceinline__ void mk_grid_sync(unsigned *bar, unsigned &target) {
    named_sync(MK_BAR_ALL, W * 32);
    if (threadIdx.x == 0) {
        target += gridDim.x;
        red_release(bar, 1u);
        if (ld_acquire(bar) < target) {
            const unsigned long long t0 = global_ns();
            while (ld_acquire(bar) < target)
                if (global_ns() - t0 > MK_TIMEOUT_NS) __trap();
        }
    }
    named_sync(MK_BAR_ALL, W * 32);
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
/* log2 of a product's slot width: 4 warps, 8 where its groups have 8 units (16 warps only: fmc_mk_create
 * checks). 12 warps take slots of 4 as constants: computing the width cost their step 0.3-0.7 % and verify(8)
 * 1-2 % on an H100 (bench/RESULTS.md, thirty-ninth session). */
template <int W> __device__ __forceinline__ int mk_slot_shift(const mk_mat &M) {
    return W == 16 && mk_units(M) > 4 ? 3 : 2;
}

/* What the block streams, in its shared memory (read there, not through L2, on every unit's way): the
 * layers' tables and the block's runs of groups. */
struct mk_plan {
    const mk_layer *L;
    const unsigned short *gs, *gc; /* [4 products] */
    int n_layers;
};

/* The shared memory of a block. */
struct mk_smem {
    unsigned char *ring_w, *ring_s; /* [warp][stage] */
    uint64_t *full;                 /* [warp][stage] */
    uint64_t *nwb;                  /* the norm weights' copy */
    unsigned char *xs;              /* the product's activations (mk_carve says how they sit) */
    float *ds;                      /* and their scales */
    float *red;                     /* mk_red_floats: warps' and head norms' sums, GLU rows, attention's P */
    mk_layer *L;                    /* [n_layers] */
    unsigned short *gs, *gc;        /* [4] */
    unsigned char *scratch;         /* attention split / merge */
    float *nws, *xcp;               /* the next norm's weights (dim), the norm's copy of its row of x */
};
/* One token (TT = 1): token 0's quants and scales, then the scratch, which holds the attention's and the
 * merge's tiles, and between them the next norm's weights and the copy of x. Up to 8 (TT = 8): the norm's
 * weights have a place of their own, and the activations ([max_nb][8] scales, [max_nb][256] quants), the
 * norm's copy of its row of x (past the first dim / 32 blocks of quants: a norm's output) and the
 * attention's and the merge's tiles share one region, as no phase uses two of them (8 tokens' activations
 * of down take 88 KB: apart, they would leave no room for the rings; shared, 4 stages fit). */
template <int TT, int W>
__device__ __forceinline__ mk_smem mk_carve(unsigned char *base, const mk_params &P) {
    mk_smem m;
    const size_t stages = (size_t)W * P.ns;
    m.ring_w = base;
    m.ring_s = m.ring_w + stages * MK_STAGE_W;
    m.full = (uint64_t *)(m.ring_s + stages * MK_STAGE_S);
    m.nwb = m.full + stages;
    unsigned char *p = (unsigned char *)(m.nwb + 2);
    if (TT == 1) {
        m.xs = p;
        m.ds = (float *)(m.xs + (size_t)P.max_nb * 32);
        p = (unsigned char *)(m.ds + P.max_nb);
    }
    m.red = (float *)p;
    m.L = (mk_layer *)(m.red + mk_red_floats(W));
    m.gs = (unsigned short *)(m.L + P.n_layers);
    m.gc = m.gs + 4;
    p = base + (((size_t)((unsigned char *)(m.gs + 16) - base) + 127) & ~(size_t)127); /* copies in */
    if (TT == 1) {
        m.scratch = p;
        m.nws = (float *)p, m.xcp = m.nws + P.dim;
    } else {
        m.nws = (float *)p;
        m.scratch = p + (((size_t)P.dim * 4 + 127) & ~(size_t)127);
        m.ds = (float *)m.scratch;
        m.xs = m.scratch + (size_t)P.max_nb * 32;
        m.xcp = (float *)(m.xs + (size_t)(P.dim / 32) * 256);
    }
    return m;
}

/* Where a warp is in its sequence of stages: in each product of each layer, unit r of its slot's groups
 * (every slots-th group of the block's run; warp = slot * width + r), 4 tiles a stage. */
template <int W> struct mk_cursor {
    int l, k, j, kb, nbw, warp;
    const int4 *qs;
    const uint32_t *sc;
    bool live;
    __device__ void start(const mk_plan &pl, int warp_) {
        warp = warp_, l = 0, k = 0, j = -1, live = true;
        next_unit(pl);
    }
    /* the next unit of the warp's: the slot's next group in this product, else the next product */
    __device__ void next_unit(const mk_plan &pl) {
        for (;;) {
            if (l >= pl.n_layers) {
                live = false;
                return;
            }
            const mk_mat &M = pl.L[l].m[k];
            const int sh = mk_slot_shift<W>(M), slot = warp >> sh, r = warp & ((1 << sh) - 1);
            j = j < 0 ? slot : j + (W >> sh);
            if (r < mk_units(M) && j < pl.gc[k]) {
                int kb0;
                const int tile = mk_unit(M, pl.gs[k] + j, r, &kb0, &nbw);
                const size_t t0 = (size_t)tile * (M.K >> 5) + kb0;
                qs = M.qs + t0 * 32, sc = M.sc + t0 * 8, kb = 0;
                return;
            }
            j = -1;
            if (++k == 4) k = 0, l++;
        }
    }
    __device__ unsigned tiles() const { return (unsigned)min((int)MK_STAGE_TILES, nbw - kb); }
    __device__ void advance(const mk_plan &pl) {
        kb += MK_STAGE_TILES;
        if (kb >= nbw) next_unit(pl);
    }
};

/* A warp's ring: the stage it takes next (s, ph), and lane 0's cursor of the stage it copies in next. Each
 * warp refills the stage it has just used (a producer warp that refilled every ring was slower: the
 * persistent-kernel section of bench/RESULTS.md). */
template <int W> struct mk_ring {
    int s;
    unsigned ph;
    mk_cursor<W> cur;
    uint64_t pol;
    mk_plan pl;
    long long wait_cy, issue_cy; /* FM_MK_PROFILE: lane 0's cycles in mk_wait and in issue */
    long long stream_cy, nst;    /* FM_MK_PROFILE: lane 0's cycles in mk_stream_unit, and its stages */
    /* the cursor's stage into ring slot `at` of the warp's ring */
    __device__ __forceinline__ void issue(const mk_smem &m, int ns, int at) {
        const int warp = threadIdx.x >> 5;
        const unsigned n = cur.tiles();
        uint64_t *b = m.full + warp * ns + at;
        if (FM_MK_NOCOPY) {
            mb_arrive(b);
            cur.advance(pl);
            return;
        }
        mb_expect(b, n * 544);
        bulk_copy_hint(m.ring_w + ((size_t)warp * ns + at) * MK_STAGE_W, cur.qs + (size_t)cur.kb * 32,
                       n * 512, b, pol);
        bulk_copy_hint(m.ring_s + ((size_t)warp * ns + at) * MK_STAGE_S, cur.sc + (size_t)cur.kb * 8, n * 32,
                       b, pol);
        cur.advance(pl);
    }
};

/* The quantiser's output into the block's activations: token 0's 32 quants of each 32-block in the order of
 * the first 32 bytes of its fragment-order block, and its scale. */
struct mk_smem_sink {
    unsigned char *xs;
    float *ds;
    __device__ __forceinline__ void word(int b, int m, uint32_t q) const {
        *(uint32_t *)(xs + b * 32 + (m & 3) * 8 + (m >> 2) * 4) = q;
    }
    __device__ __forceinline__ void scale(int b, float d) const { ds[b] = d; }
};
/* The quantiser's x and norm weights: x read through L2 once (the sum's pass) and kept in shared memory for
 * the quantising pass; the weights copied in ahead (mk_norm_fetch). */
struct mk_norm_src {
    const float *x;
    float *xs;
    const float *nw;
    __device__ __forceinline__ bool norm() const { return true; }
    __device__ __forceinline__ float4 first(int j) const {
        const float4 v = ld_cg4(x + 4 * j);
        *(float4 *)(xs + 4 * j) = v;
        return v;
    }
    __device__ __forceinline__ float4 x4(int i) const { return *(const float4 *)(xs + i); }
    __device__ __forceinline__ float4 w4(int i) const { return *(const float4 *)(nw + i); }
};
/* A group of 64 threads (qk_norm_rope_head, the attention's units). */
struct mk_group {
    int t, id;
    double *sh;
    __device__ __forceinline__ int tid() const { return t; }
    __device__ __forceinline__ int size() const { return 64; }
    __device__ __forceinline__ void sync() const { named_sync(id, 64); }
};
/* qk_norm_rope_head's queries straight into an attention unit's Qs, split as attn_load_q splits them:
 * query row hh - h0. */
template <int HD> struct mk_q_smem {
    __half *Qs;
    int h0;
    __half *Kr, *Vr; /* the new key's and value's rows in the unit's tiles, or NULL */
};
template <int HD>
__device__ __forceinline__ void qk_store_q(const mk_q_smem<HD> &q, int, int hh, int d, float v, int, int) {
    constexpr int QP = attn_vp(HD);
    const __half2 s = split_half(v);
    q.Qs[(hh - q.h0) * QP + d] = __low2half(s);
    q.Qs[(MK_QR + hh - q.h0) * QP + d] = __high2half(s);
}
template <int HD>
__device__ __forceinline__ void qk_store_kv(const mk_q_smem<HD> &q, int v, int d, __half h) {
    __half *r = v ? q.Vr : q.Kr;
    if (r) r[d] = h;
}
/* (the attention tile's exchange: the products' reduction buffer is free meanwhile) */
static_assert(ATTN_XS_FLOATS <= mk_red_floats(12), "attn_split_tile_kw exchanges through m.red");
/* A merge unit of HD threads: partials loaded through L2 (other blocks wrote them in this launch). */
struct mk_combine : named_bar {
    __device__ __forceinline__ void fetch(float *dst, const float *src, int n2, int i, int nt) const {
        for (int k = i; k < n2; k += nt) *(float2 *)(dst + 2 * k) = __ldcg((const float2 *)(src + 2 * k));
    }
    template <int N> __device__ __forceinline__ void wait() const {}
};

/* The next norm's weights (dim floats) into shared memory by the copy engine, on m.nwb. Every thread orders
 * its earlier writes of the buffer (the attention's, the merge's) before the copy engine's (another proxy).
 */
template <int W>
__device__ __forceinline__ void mk_norm_fetch(const mk_smem &m, float *nws, const float *nw, int dim) {
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    named_sync(MK_BAR_ALL, W * 32);
    if (threadIdx.x == 0) {
        mb_expect(m.nwb, dim * 4);
        bulk_copy(nws, nw, dim * 4, m.nwb);
    }
}

/* The activations of a product from fragment-order xq / xd into the block's shared memory: token 0's
 * (TT = 1), or the first n-tile's 8 tokens as they are. */
template <int TT, int W>
__device__ void mk_load_act(const int8_t *xq, const float *xd, int K, const mk_smem &m) {
    const int NB = K >> 5, tid = threadIdx.x;
    if (TT == 1) {
        for (int j = tid; j < 2 * NB; j += W * 32)
            cp_async16(m.xs + (size_t)j * 16, xq + (size_t)(j >> 1) * 256 + (j & 1) * 16);
        for (int j = tid; j < NB; j += W * 32) m.ds[j] = __ldcg(xd + (size_t)j * 8);
    } else {
        for (int j = tid; j < 16 * NB; j += W * 32) cp_async16(m.xs + (size_t)j * 16, xq + (size_t)j * 16);
        for (int j = tid; j < 2 * NB; j += W * 32) cp_async16(m.ds + (size_t)j * 4, xd + (size_t)j * 4);
    }
    cp_async_commit();
    cp_async_wait<0>();
    named_sync(MK_BAR_ALL, W * 32);
}

/* The calling warp's unit of nbw 32-blocks from kb0 of the product's activations (the block's m.xs / m.ds),
 * its stages taken from the warp's ring, into acc (fmc_split's order: acc = fma(isum, dw * dx, acc)). TT =
 * 1: every lane takes token 0's fragment (the sums of the columns past 0 are neither made nor stored); 8:
 * token g's, with the scales of tokens 2c, 2c + 1 (those past the launch's T are not stored). */
template <int TT, int W>
__device__ __forceinline__ void mk_stream_unit(float (&acc)[4], int kb0, int nbw, mk_ring<W> &rg,
                                               const mk_smem &m, int ns) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    constexpr int XB = TT == 1 ? 4 : 32; /* uint2 a 32-block */
    const uint2 *xw = (const uint2 *)m.xs + (size_t)kb0 * XB + (TT == 1 ? c : lane);
    const float *dw = m.ds + (size_t)kb0 * TT + (TT == 1 ? 0 : 2 * c);
    auto xd = [&](int kb) { return TT == 1 ? make_float2(dw[kb], 0.0f) : *(const float2 *)(dw + kb * 8); };
    const long long cs = FM_MK_PROFILE ? clock64() : 0;
    auto tile = [&](const int4 &A, uint32_t sc, uint2 xv, float2 dx) {
        int d[4];
        mma_s8(d, A, xv.x, xv.y);
        if (TT == 1)
            q8_scale_add_t0(acc, d, sc, dx.x);
        else
            q8_scale_add<4>(acc, d, half_lo(sc), half_hi(sc), dx);
    };
    for (int kb = 0; kb < nbw; kb += MK_STAGE_TILES) {
        const size_t st = (size_t)warp * ns + rg.s;
        const long long c0 = FM_MK_PROFILE ? clock64() : 0;
        mk_wait(m.full + st, rg.ph);
        if (FM_MK_PROFILE) rg.wait_cy += clock64() - c0;
        const int4 *Q = (const int4 *)(m.ring_w + st * MK_STAGE_W) + lane;
        const uint32_t *S = (const uint32_t *)(m.ring_s + st * MK_STAGE_S) + g;
        if (nbw - kb >= MK_STAGE_TILES) { /* a full stage: its tiles into registers at once */
            int4 A[MK_STAGE_TILES];
            uint32_t sc[MK_STAGE_TILES];
            uint2 xv[MK_STAGE_TILES];
            float2 dx[MK_STAGE_TILES];
#pragma unroll
            for (int k = 0; k < MK_STAGE_TILES; k++)
                A[k] = Q[k * 32], sc[k] = S[k * 8], xv[k] = xw[(size_t)(kb + k) * XB], dx[k] = xd(kb + k);
#pragma unroll
            for (int k = 0; k < MK_STAGE_TILES; k++) tile(A[k], sc[k], xv[k], dx[k]);
        } else {
            for (int k = 0; k < nbw - kb; k++)
                tile(Q[k * 32], S[k * 8], xw[(size_t)(kb + k) * XB], xd(kb + k));
        }
        /* the products have used the stage's loads: the slot is free for the copy engine */
        __syncwarp();
        if (lane == 0 && rg.cur.live) {
            const long long c1 = FM_MK_PROFILE ? clock64() : 0;
            rg.issue(m, ns, rg.s);
            if (FM_MK_PROFILE) rg.issue_cy += clock64() - c1;
        }
        if (++rg.s == ns) rg.s = 0, rg.ph ^= 1;
        if (FM_MK_PROFILE) rg.nst++;
    }
    if (FM_MK_PROFILE) rg.stream_cy += clock64() - cs;
}

/* One product of a.T tokens: the block's groups a slot at a time (warps 0..3, 4..7, ...), warp r of a slot
 * taking unit r from its ring; then warp 0 of the slot adds the units' sums in order (the merge of
 * gemm_merge) and stores (q8_out; += x with x's old rows loaded before the stream), or the slot's warps write
 * the GLU's output of their tokens (q8_glu_out). */
template <int MODE, int TT, int W>
__device__ __forceinline__ void mk_product(const mk_mat &M, const q8_args &a, int start, int cnt,
                                           mk_ring<W> &rg, const mk_smem &m, int ns) {
    const int sh = mk_slot_shift<W>(M), nsl = W >> sh, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int slot = warp >> sh, r = warp & ((1 << sh) - 1);
    const int g = lane >> 2, c = lane & 3, units = mk_units(M);
    for (int jr = 0; nsl * jr + slot < cnt; jr++) {
        const int gr = start + nsl * jr + slot;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, x0[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        /* the old x of the lane's (row, token) pairs: acc[j]'s, row g + 8 (j >> 1), token 2c + (j & 1) (TT =
         * 1: token 0's in the lanes c == 0) */
        if (MODE == Q8_ADD && r == 0)
#pragma unroll
            for (int j = 0; j < 4; j += TT == 1 ? 2 : 1) {
                const int row = gr * 16 + g + (j >> 1) * 8, t = TT == 1 ? 0 : 2 * c + (j & 1);
                if ((TT > 1 || c == 0) && t < a.T && row < M.N) x0[j] = ld_cg(a.y + (size_t)t * a.ldy + row);
            }
        if (r < units) {
            int kb0, nbw;
            mk_unit(M, gr, r, &kb0, &nbw);
            mk_stream_unit<TT, W>(acc, kb0, nbw, rg, m, ns);
        }
        /* two buffers by round parity: warp 0 reads round jr's while the others fill round jr + 1's */
        float *rb = m.red + (((jr & 1) * nsl + slot) << sh) * 4 * 32;
        if (M.glu) {
#pragma unroll
            for (int j = 0; j < 4; j++) rb[(2 * c + (j & 1)) * 64 + r * 16 + g + (j >> 1) * 8] = acc[j];
        } else if (r < units) {
#pragma unroll
            for (int j = 0; j < 4; j++) rb[(r * 4 + j) * 32 + lane] = acc[j];
        }
        named_sync(MK_BAR_SLOT + slot, 32 << sh);
        if (M.glu) { /* warp r: tokens r, r + 4 (each warp reads round jr's buffer before its next barrier) */
            for (int t = r; t < a.T; t += 4)
                q8_glu_out(a, t, gr, M.N / 64, rb[t * 64 + lane], rb[t * 64 + 32 + lane]);
            continue;
        }
        if (r != 0) continue;
#pragma unroll
        for (int j = 0; j < 4; j += TT == 1 ? 2 : 1) {
            float v = acc[j];
            for (int q = 1; q < units; q++) v = __fadd_rn(v, rb[(q * 4 + j) * 32 + lane]);
            const int row = gr * 16 + g + (j >> 1) * 8, t = TT == 1 ? 0 : 2 * c + (j & 1);
            if ((TT == 1 && c != 0) || t >= a.T || row >= M.N) continue;
            if (MODE == Q8_ADD)
                q8_put(a, row, t, __fadd_rn(x0[j], v));
            else
                q8_out<MODE>(a, row, t, v);
        }
    }
}

__device__ __forceinline__ q8_args mk_args(int T, float *y, int ldy, float *y2, int ldy2, int8_t *oq,
                                           float *od) {
    q8_args a = {};
    a.T = T;
    a.y = y, a.ldy = ldy, a.y2 = y2, a.ldy2 = ldy2, a.oq = oq, a.od = od;
    return a;
}

#endif

/* TT: the most tokens a launch takes (P.T <= TT): 1 for steps, 8 for verify blocks. With more than one, the
 * products use all 8 mma columns (mk_stream_unit), the norms are block t's for row t (into xqn / xdn, then
 * a grid barrier and every block's load), the q/k norms run as a phase of their own before a grid barrier
 * (the (token, head) pairs spread over all blocks, the queries through L2 as the kernels' attention reads
 * them), an attention unit's two 16-row tiles (4 tokens x G heads each) run on warps 0..3 and 4..7, and
 * the merge takes (head, token) pairs. */
template <int HD, int TT, int W>
__global__ void __launch_bounds__(W * 32, 1) k_megakernel(const __grid_constant__ mk_params P) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(TT == 1 || TT == 8, "steps or verify blocks of up to 8 tokens");
    static_assert(W == 12 || W == 16, "12 or 16 warps a block");
    constexpr int THREADS = W * 32;                 /* >= Q8_THREADS: the quantiser's thread count */
    constexpr int QR = TT == 1 ? MK_QR : 2 * MK_QR; /* an attention unit's query rows */
    extern __shared__ __align__(128) unsigned char smem[];
    const mk_smem m = mk_carve<TT, W>(smem, P);
    const int tid = threadIdx.x, warp = tid >> 5, nblk = gridDim.x, T = TT == 1 ? 1 : P.T;
    /* the tables into shared memory */
    for (int i = tid; i < P.n_layers * (int)sizeof(mk_layer) / 4; i += THREADS)
        ((unsigned *)m.L)[i] = ((const unsigned *)P.L)[i];
    if (tid < 4) m.gs[tid] = P.gstart[tid * nblk + blockIdx.x], m.gc[tid] = P.gcount[tid * nblk + blockIdx.x];
    if (P.trace && tid == 0) { /* the SM: SMs differ in speed, and a block lands on another between runs */
        unsigned sm;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
        P.trace[(size_t)nblk * P.n_layers * MK_TRACE + blockIdx.x] = sm;
    }
    if (tid == 0) {
        for (int i = 0; i < W * P.ns; i++) mb_init(m.full + i, 1);
        mb_init(m.nwb, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int n_heads = P.n_heads, n_kv = P.n_kv, q_dim = n_heads * HD;
    const int grp = warp >> 1, gtid = tid & 63, G = n_heads / n_kv;
    /* (KV head, split) units: the splits of the longest row */
    const int att_units = n_kv * ((*P.pos + T - 1 + FMC_ATT_SPLIT) / FMC_ATT_SPLIT);
    constexpr int QP = attn_vp(HD);
    float *nws = m.nws;
    unsigned target = 0, nph = 0;
    mk_ring<W> rg = {0, 0, {}, l2_evict_first(), {m.L, m.gs, m.gc, P.n_layers}, 0, 0};
    if ((tid & 31) == 0) { /* the ring's first stages */
        rg.cur.start(rg.pl, warp);
        for (int i = 0; i < P.ns && rg.cur.live; i++) rg.issue(m, P.ns, i);
    }
    mk_norm_fetch<W>(m, nws, m.L[0].attn_norm, P.dim);
    const attn_tiles<HD> at(m.scratch);
    uint32_t *Ks = at.Ks;
    __half *Vs = at.Vs, *Qs = at.Qs;
    /* TT = 8: the two tiles' exchange buffers, after the tiles */
    float *txs = (float *)(m.scratch + attn_smem(HD, QR));
    const mk_smem_sink sink = {m.xs, m.ds};
    for (int l = 0; l < P.n_layers; l++) {
        const mk_layer &L = m.L[l];
        auto mark = [&](int i) {
            if (P.trace && tid == 0)
                P.trace[((size_t)blockIdx.x * P.n_layers + l) * MK_TRACE + i] = global_ns();
        };
        auto sync = [&](int i) {
            mark(i);
            mk_grid_sync<W>(P.bar, target);
            mark(i + 1);
        };
        auto product = [&](int k, auto mode, const q8_args &a) {
            mk_product<decltype(mode)::value, TT, W>(L.m[k], a, m.gs[k], m.gc[k], rg, m, P.ns);
            if (FM_MK_PROFILE && P.prof && (tid & 31) == 0) {
                unsigned long long *d = P.prof + ((size_t)blockIdx.x * P.n_layers + l) * MK_PROF + k * 4;
                const long long v[4] = {rg.wait_cy, rg.issue_cy, rg.stream_cy, rg.nst};
                for (int i = 0; i < 4; i++) atomicAdd(d + i, (unsigned long long)v[i]);
            }
            rg.wait_cy = rg.issue_cy = rg.stream_cy = rg.nst = 0;
        };
        /* RMSNorm + quantise x with the fetched weights */
        auto norm = [&]() {
            mk_wait(m.nwb, nph);
            nph ^= 1;
            if (TT > 1) { /* block t quantises token t into xqn / xdn, as a step does; then every block loads
                             them */
                if ((int)blockIdx.x < T && tid < Q8_THREADS)
                    q8_quant_row_src(mk_norm_src{P.x + (size_t)blockIdx.x * P.dim, m.xcp, nws}, P.eps, P.dim,
                                     q8_frag_sink{P.xqn, P.xdn, (int)blockIdx.x, P.dim / 32},
                                     named_bar{MK_BAR_Q8, Q8_THREADS});
                mk_grid_sync<W>(P.bar, target);
                mk_load_act<TT, W>(P.xqn, P.xdn, P.dim, m);
                return;
            }
            if (tid < Q8_THREADS)
                q8_quant_row_src(mk_norm_src{P.x, m.xcp, nws}, P.eps, P.dim, sink,
                                 named_bar{MK_BAR_Q8, Q8_THREADS});
            if ((int)THREADS > (int)Q8_THREADS) named_sync(MK_BAR_ALL, THREADS); /* the products read it */
        };
        mark(0);
        /* qkv */
        norm();
        /* A step's attention unit (one a block in the short form): the keys and values of its split but the
         * new row, read while qkv streams rather than after the barrier (an L2 round trip off the attention;
         * the scratch is free from the norm to the merge). The q/k norms write the new row into the tiles. */
        const bool kv_pre = TT == 1 && (int)blockIdx.x < att_units;
        if (kv_pre && warp < 4) {
            const attn_block a =
                attn_block_setup<HD, QR>(T, n_heads, n_kv, P.pos, 1, (int)blockIdx.x % n_kv, 0, 0);
            attn_copy_split<HD>(Ks, Vs, L.kc, L.vc, a, (int)blockIdx.x / n_kv, 3, tid, 128, rg.pol);
            cp_async_commit();
        }
        mark(1);
        product(0, std::integral_constant<int, Q8_STORE>(),
                mk_args(T, P.qkv, q_dim + 2 * n_kv * HD, NULL, 0, NULL, NULL));
        sync(2);
        if (TT > 1) { /* the q/k norms and RoPE of every (token, head), a pair per group of 64 threads */
            const int NH = n_heads + 2 * n_kv, NG = W / 2;
            for (int it = blockIdx.x * NG + grp; it < T * NH; it += nblk * NG)
                qk_norm_rope_head(P.qkv, it / NH, it % NH, n_heads, n_kv, HD, L.q_norm, L.k_norm, P.eps,
                                  P.rope, P.pos, P.q, L.kc, L.vc,
                                  mk_group{gtid, MK_BAR_GRP + grp, (double *)m.red + grp * 32});
            sync(4);
        } else { /* (the q/k norms' phase and barrier of the trace: a step's are in the attention's) */
            mark(4), mark(5);
        }
        /* attention: a (KV head, 64-key split) unit per block at a time. A step's unit first norms and
         * rotates its heads, a head per group of 64 threads: its G query heads straight into the unit's
         * queries, and in the split that holds the new position its key and value heads into the caches (the
         * other splits read neither), so no grid barrier parts them from qkv's. Then the split on warps 0..3
         * (a verify block's second tile on 4..7). */
        for (int u = blockIdx.x; u < att_units; u += nblk) {
            const int g = u % n_kv, s = u / n_kv;
            const bool early = kv_pre && u == (int)blockIdx.x; /* its keys and values copied in during qkv */
            if (TT == 1) {
                const int heads = s == att_units / n_kv - 1 ? G + 2 : G;
                /* the early copy left the new key's and value's row to the norms */
                const int nr = early && heads > G ? *P.pos - s * FMC_ATT_SPLIT : -1;
                const mk_q_smem<HD> qo = {Qs, g * G, nr < 0 ? NULL : (__half *)Ks + nr * 2 * attn_kp(HD),
                                          nr < 0 ? NULL : Vs + nr * attn_vp(HD)};
                for (int j = tid; j < (MK_QR - G) * QP; j += THREADS) /* the unused query rows */
                    Qs[G * QP + j] = Qs[(MK_QR + G) * QP + j] = __float2half_rn(0.0f);
                for (int j = grp; j < heads; j += W / 2)
                    qk_norm_rope_head(P.qkv, 0, j < G ? g * G + j : n_heads + (j - G) * n_kv + g, n_heads,
                                      n_kv, HD, L.q_norm, L.k_norm, P.eps, P.rope, P.pos, qo, L.kc, L.vc,
                                      mk_group{gtid, MK_BAR_GRP + grp, (double *)m.red + grp * 32});
                named_sync(MK_BAR_ALL, THREADS); /* the queries, and this block's new key row */
            }
            constexpr int TW = TT == 1 ? 4 : 8; /* the warps of the unit's tiles */
            if (warp < TW) {
                const int tile = warp >> 2;
                const attn_block a = attn_block_setup<HD, QR>(T, n_heads, n_kv, P.pos, 1, g, 0, tile);
                if (!early)
                    attn_copy_split<HD>(Ks, Vs, L.kc, L.vc, a, s, 2, tid, TW * 32,
                                        rg.pol); /* read once a step, as the weights */
                if (TT > 1) attn_load_q<HD, QR>(P.q, Qs, 0, g, G, n_heads, QR, a.nq, tid, TW * 32);
                cp_async_commit();
                cp_async_wait<0>();
                named_sync(MK_BAR_GRP, TW * 32);
                /* the tile on 4 warps: one on each of the SM's tensor cores */
                if (tile * 16 < a.nq)
                    attn_split_tile_kw<HD, QR, 4>(a, Qs, Ks, Vs, s, n_heads, P.max_splits, P.part,
                                                  TT == 1 ? m.red : txs + tile * ATTN_XS_FLOATS, warp & 3,
                                                  named_bar{MK_BAR_GRP + 1 + tile, 128});
            }
            named_sync(MK_BAR_ALL, THREADS); /* Ks / Vs / Qs are rewritten next */
        }
        sync(6);
        /* merge + quantise: a (head, token) per HD threads of the first Q8_THREADS */
        if (tid < Q8_THREADS) {
            constexpr int UPB = Q8_THREADS / HD;
            const int us = tid / HD;
            float *buf = (float *)m.scratch + (size_t)us * 2 * MK_CH * (HD + 2);
            for (int h = us * nblk + blockIdx.x; h < n_heads * T; h += UPB * nblk)
                attn_combine_head<HD, MK_CH>(n_heads, h % n_heads, h / n_heads, *P.pos + h / n_heads + 1,
                                             P.max_splits, P.part, buf, P.xq, P.xd, NULL, tid % HD,
                                             mk_combine{{MK_BAR_MERGE + us, HD}});
        }
        sync(8);
        /* wo, += x */
        /* its barrier: the merge's buffers are free for the weights */
        mk_load_act<TT, W>(P.xq, P.xd, q_dim, m);
        mk_norm_fetch<W>(m, nws, L.ffn_norm, P.dim);
        mark(10);
        product(1, std::integral_constant<int, Q8_ADD>(), mk_args(T, P.x, P.dim, NULL, 0, NULL, NULL));
        sync(11);
        /* gate/up, SiLU * up quantised into xq / xd */
        norm();
        if (l + 1 < P.n_layers) mk_norm_fetch<W>(m, nws, m.L[l + 1].attn_norm, P.dim);
        mark(13);
        product(2, std::integral_constant<int, Q8_GLU>(), mk_args(T, NULL, 0, NULL, 0, P.xq, P.xd));
        sync(14);
        /* down, += x (and the drafter's captured copy) */
        mk_load_act<TT, W>(P.xq, P.xd, P.ffn, m);
        mark(16);
        product(3, std::integral_constant<int, Q8_ADD>(), mk_args(T, P.x, P.dim, L.cap, P.ldcap, NULL, NULL));
        mark(17);
        if (l + 1 < P.n_layers) /* the kernel's end orders the last layer's */
            mk_grid_sync<W>(P.bar, target);
    }
#else
    __trap(); /* fmc_mk_create refuses devices below sm_90 */
#endif
}

/* Bytes of shared memory past the rings (mk_carve: the norm weights' mbarrier, activations, sums, tables,
 * scratch) and of one ring stage of every warp (with its mbarrier), for TT tokens. */
size_t mk_fixed_bytes(int hd, int max_nb, int n_layers, int dim, int TT, int W) {
    const size_t merge = (size_t)(Q8_THREADS / hd) * 2 * MK_CH * (hd + 2) * 4;
    const size_t head = 16 + mk_red_floats(W) * 4 + n_layers * sizeof(mk_layer) + 32 + 128;
    if (TT == 1) {
        const size_t norm = (size_t)2 * dim * 4; /* the next norm's weights and x's copy */
        return head + (size_t)max_nb * 36 + std::max(std::max(attn_smem(hd, MK_QR), merge), norm);
    }
    const size_t attn = attn_smem(hd, 2 * MK_QR) + 2 * ATTN_XS_FLOATS * 4;
    const size_t act = (size_t)max_nb * mk_act_bytes(TT),
                 norm = (size_t)max_nb * 32 + (size_t)dim / 32 * 256 + (size_t)dim * 4; /* + x's row */
    return head + ((size_t)dim * 4 + 127) / 128 * 128 + std::max(std::max(attn, merge), std::max(act, norm));
}
size_t mk_stage_bytes(int W) {
    return (size_t)W * (MK_STAGE_W + MK_STAGE_S + 8);
}

typedef void (*mk_kernel)(const mk_params);
template <int TT, int W> mk_kernel mk_pick(int hd) {
    return hd == 32    ? k_megakernel<32, TT, W>
           : hd == 64  ? k_megakernel<64, TT, W>
           : hd == 128 ? k_megakernel<128, TT, W>
                       : NULL;
}

} // namespace

struct fmc_mk {
    mk_params p;
    mk_kernel kernel;
    int coop, max_T, warps;
    unsigned grid;
    size_t smem;
    std::vector<void *> allocs;
    std::vector<unsigned short> gcount; /* each block's groups of each product, [4][blocks] */
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
    const int TT = d->tokens > 1 ? 8 : 1, G = d->n_heads / d->n_kv;
    if (d->hd != 32 && d->hd != 64 && d->hd != 128) return no("head_dim must be 32, 64 or 128");
    if (G > MK_QR) return no("more than 16 query heads per KV head");
    /* a verify unit's two tiles hold 32 (token, head) rows */
    const int max_T = TT == 1 ? 1 : std::min(TT, 2 * MK_QR / G);
    if (TT > 1 && max_T < 2) return no("more than 16 query heads per KV head for a verify block");
    const fmc_mk_layer &L0 = d->layers[0];
    const fmc_q8 *mats0[4] = {L0.qkv, L0.wo, L0.gu, L0.down};
    for (int l = 0; l < d->n_layers; l++) {
        const fmc_mk_layer &L = d->layers[l];
        const fmc_q8 *mats[4] = {L.qkv, L.wo, L.gu, L.down};
        for (int k = 0; k < 4; k++) {
            const fmc_q8 *w = mats[k], *w0 = mats0[k];
            if (w->sp.kc != 1 || w->sp.rt != (k == 2 ? 4 : 1) || (k == 2 && w->sp.w != 1) || w->sp.w > 8)
                return no("a matrix's split merges across blocks");
            if (w->N != w0->N || w->K != w0->K || w->sp.w != w0->sp.w)
                return no("layers of different shapes");
        }
    }
    /* 16 warps where a matrix has 8 K shares (two slots of 8), else 12 (FMC_MEGA_WARPS=16 overrides, for
     * experiments) */
    bool wide = false;
    for (int k = 0; k < 4; k++) wide = wide || mats0[k]->sp.w > 4;
    int W = wide ? 16 : 12;
    const char *ew = getenv("FMC_MEGA_WARPS");
    if (ew && (atoi(ew) == 12 || atoi(ew) == 16)) W = atoi(ew);
    if (W == 12 && wide) return no("12 warps a block take no matrix of 8 K shares");
    const mk_kernel kernel = TT == 1 ? (W == 16 ? mk_pick<1, 16>(d->hd) : mk_pick<1, 12>(d->hd))
                                     : (W == 16 ? mk_pick<8, 16>(d->hd) : mk_pick<8, 12>(d->hd));
    /* 32-blocks of the widest activations, rounded so that what follows them stays 16-byte aligned */
    const int max_nb = (std::max(std::max(d->dim, d->n_heads * d->hd), d->ffn) / 32 + 3) & ~3;
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, kernel) != cudaSuccess) return no("kernel attributes unavailable");
    const size_t fixed = mk_fixed_bytes(d->hd, max_nb, d->n_layers, d->dim, TT, W), stage = mk_stage_bytes(W),
                 room = (size_t)smem_optin - fa.sharedSizeBytes;
    if (room < fixed + 2 * stage) return no("too little shared memory");
    int ns = (int)std::min<size_t>(16, (room - fixed) / stage);
    const char *e = getenv("FMC_MEGA_NS"); /* fewer stages (experiments: how deep the rings must be) */
    if (e && atoi(e) >= 2) ns = std::min(ns, atoi(e));
    const size_t smem = fixed + (size_t)ns * stage;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) != cudaSuccess)
        return no("shared-memory limit refused");
    int per_sm = 0, sms = fmc_sm_count();
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, W * 32, smem) != cudaSuccess ||
        per_sm < 1)
        return no("the persistent block does not fit an SM");

    fmc_mk *mk = new fmc_mk();
    mk->kernel = kernel, mk->coop = 1, mk->grid = (unsigned)sms, mk->smem = smem, mk->warps = W;
    mk->max_T = std::min(max_T, sms); /* block t norms row t */
    mk_params &p = mk->p;
    p.n_layers = d->n_layers, p.dim = d->dim, p.n_heads = d->n_heads, p.n_kv = d->n_kv, p.ffn = d->ffn;
    p.max_splits = d->max_splits, p.ns = ns, p.max_nb = max_nb, p.eps = d->eps;
    p.x = d->x, p.qkv = d->qkv, p.part = d->part, p.q = d->q, p.xq = d->xq, p.xd = d->xd;
    p.xqn = d->xqn, p.xdn = d->xdn;
    p.T = 1, p.ldcap = d->ldcap;
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
    int groups[4];
    size_t bytes[4];
    for (int k = 0; k < 4; k++) {
        const fmc_q8 *w = mats0[k];
        const size_t tiles = k == 2 ? 4 : 1;
        groups[k] = k == 2 ? w->N / 64 : (w->N + 15) / 16;
        bytes[k] = tiles * (size_t)(w->K / 32) * 544;
    }
    if (groups[0] > 65535 || groups[2] > 65535) {
        fmc_mk_free(mk);
        return no("too many row groups");
    }
    std::vector<unsigned short> start, count;
    mk_balance(groups, bytes, sms, start, count);
    mk->gcount = count;
    auto up = [&](void **dst, const void *src, size_t n) {
        if (cudaMalloc(dst, n) != cudaSuccess) return -1;
        mk->allocs.push_back(*dst);
        return src && cudaMemcpy(*dst, src, n, cudaMemcpyHostToDevice) != cudaSuccess ? -1 : 0;
    };
    void *dl = NULL, *ds = NULL, *dc = NULL, *db = NULL;
    if (up(&dl, layers.data(), layers.size() * sizeof(mk_layer)) || up(&ds, start.data(), start.size() * 2) ||
        up(&dc, count.data(), count.size() * 2) || up(&db, NULL, 4)) {
        fmc_mk_free(mk);
        snprintf(why, whylen, "cuda: out of device memory for the persistent kernel's tables");
        return -1;
    }
    p.L = (const mk_layer *)dl, p.gstart = (const unsigned short *)ds, p.gcount = (const unsigned short *)dc;
    p.bar = (unsigned *)db;
    *out = mk;
    return 0;
}

void fmc_mk_launch(const fmc_mk *mk, int T, cudaStream_t s) {
    mk_params p = mk->p;
    p.T = T;
    cudaMemsetAsync(mk->p.bar, 0, 4, s);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(mk->grid);
    cfg.blockDim = dim3((unsigned)mk->warps * 32);
    cfg.dynamicSmemBytes = mk->smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeCooperative;
    at[0].val.cooperative = 1;
    cfg.attrs = at;
    cfg.numAttrs = mk->coop ? 1 : 0;
    cudaLaunchKernelEx(&cfg, mk->kernel, p);
}

int fmc_mk_max_tokens(const fmc_mk *mk) {
    return mk->max_T;
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
    void *t = NULL, *pr = NULL;
    const size_t np = (size_t)mk->grid * mk->p.n_layers * MK_PROF * 8;
    if (cudaMalloc(&t, (size_t)mk->grid * (mk->p.n_layers * MK_TRACE + 1) * 8) != cudaSuccess) return -1;
    mk->allocs.push_back(t);
    if (cudaMalloc(&pr, np) != cudaSuccess || cudaMemset(pr, 0, np) != cudaSuccess) return -1;
    mk->allocs.push_back(pr);
    mk->p.trace = (unsigned long long *)t, mk->p.prof = (unsigned long long *)pr;
    return 0;
}

/* The trace on the host: [blocks][n_layers][MK_TRACE] clocks, then [blocks] SMs. */
static int mk_trace_copy(const fmc_mk *mk, std::vector<unsigned long long> &t) {
    const int L = mk->p.n_layers, nb = (int)mk->grid;
    t.resize((size_t)nb * (L * MK_TRACE + 1));
    if (!mk->p.trace || L < 3) return -1;
    return cudaMemcpy(t.data(), mk->p.trace, t.size() * 8, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}
/* Block b's microseconds in phase i of layer l (the last phase ends at the next layer's start). */
static double mk_phase_us(const std::vector<unsigned long long> &t, int L, int b, int l, int i) {
    const unsigned long long *tb = t.data() + ((size_t)b * L + l) * MK_TRACE;
    return (double)(tb[i + 1] - tb[i]) * 1e-3;
}

int fmc_mk_trace_read(const fmc_mk *mk, double *us) {
    const int L = mk->p.n_layers, nb = (int)mk->grid;
    std::vector<unsigned long long> t;
    if (mk_trace_copy(mk, t)) return -1;
    for (int i = 0; i < MK_TRACE; i++) { /* layers 1 .. L-2: each has a next layer's start */
        double b0 = 0, hi = 0, lo = 0;
        for (int l = 1; l < L - 1; l++) {
            double mx = 0, mn = 1e30;
            for (int b = 0; b < nb; b++) {
                const double d = mk_phase_us(t, L, b, l, i);
                if (b == 0) b0 += d;
                mx = std::max(mx, d), mn = std::min(mn, d);
            }
            hi += mx, lo += mn;
        }
        us[i] = b0 / (L - 2), us[MK_TRACE + i] = hi / (L - 2), us[2 * MK_TRACE + i] = lo / (L - 2);
    }
    /* the stall profile (FM_MK_PROFILE builds; zeros otherwise): a warp's mean cycles a layer, summed over
     * the steps since the last read (the caller divides by their count), then reset */
    std::vector<unsigned long long> pr((size_t)nb * L * MK_PROF, 0);
    if (cudaMemcpy(pr.data(), mk->p.prof, pr.size() * 8, cudaMemcpyDeviceToHost) != cudaSuccess ||
        cudaMemset(mk->p.prof, 0, pr.size() * 8) != cudaSuccess)
        return -1;
    for (int i = 0; i < MK_PROF; i++) {
        double sum = 0;
        for (int b = 0; b < nb; b++)
            for (int l = 1; l < L - 1; l++) sum += (double)pr[((size_t)b * L + l) * MK_PROF + i];
        us[3 * MK_TRACE + i] = sum / ((double)nb * (L - 2) * mk->warps);
    }
    return MK_TRACE;
}

int fmc_mk_trace_blocks(const fmc_mk *mk, double *us, int *info, int max_blocks) {
    const int L = mk->p.n_layers, nb = (int)mk->grid;
    std::vector<unsigned long long> t;
    if (nb > max_blocks || mk_trace_copy(mk, t)) return -1;
    for (int b = 0; b < nb; b++) {
        for (int i = 0; i < MK_TRACE; i++) {
            double sum = 0;
            for (int l = 1; l < L - 1; l++) sum += mk_phase_us(t, L, b, l, i);
            us[(size_t)b * MK_TRACE + i] = sum / (L - 2);
        }
        info[b * 5] = (int)t[(size_t)nb * L * MK_TRACE + b];
        for (int k = 0; k < 4; k++) info[b * 5 + 1 + k] = mk->gcount[(size_t)k * nb + b];
    }
    return nb;
}

int fmc_mk_stages(const fmc_mk *mk) {
    return mk->p.ns;
}

int fmc_mk_warps(const fmc_mk *mk) {
    return mk->warps;
}
