/* cuda_attn.cu: the target's attention on the GPU: q/k RMSNorm + NEOX RoPE + the KV-cache write, then
 * split-K attention ("flash decoding") and the merge of the splits with the Q8_0 quantisation of the output.
 *
 * Splits have fixed boundaries (multiples of FMC_ATT_SPLIT keys), and each (row, head, split) is computed
 * with the same operations whatever T is and wherever it lands: a block loads one split of one KV head into
 * shared memory once and serves all query heads of the group for up to 128 / G rows (a whole verify block),
 * one 16-query tile per warp on the f16 tensor cores, so a verify block reads the cache once instead of once
 * per group of rows and costs about what a single step's attention does. */
#include <algorithm>

#include "cuda/cuda_attn.cuh"

enum { ATT_WARPS = 8, ATT_QROWS = 16 * ATT_WARPS /* queries of a block: one 16-row tile a warp */ };
static_assert(ATT_QROWS == FMC_ATT_MAX_GROUP, "a split block holds one row of every query head of a group");

/* grid (T, n_heads + 2 n_kv), 64 threads: head blockIdx.y of row blockIdx.x (qk_norm_rope_head). */
__global__ void k_qk_norm_rope_kv(const float *qkv, int n_heads, int n_kv, int hd, const float *q_norm,
                                  const float *k_norm, float eps, const float *rope, const int *pos,
                                  float *q_out, __half *k_cache, __half *v_cache) {
    __shared__ double sh[32];
    pdl_trigger();
    pdl_wait();
    qk_norm_rope_head(qkv, blockIdx.x, blockIdx.y, n_heads, n_kv, hd, q_norm, k_norm, eps, rope, pos, q_out,
                      k_cache, v_cache, block_group{sh});
}

void fmc_qk_norm_rope_kv(const float *qkv, int T, int n_heads, int n_kv, int hd, const float *q_norm,
                         const float *k_norm, float eps, const float *rope, const int *pos, float *q_out,
                         __half *k_cache, __half *v_cache, int pdl, cudaStream_t s) {
    fmc_launch(k_qk_norm_rope_kv, dim3(T, n_heads + 2 * n_kv), dim3(64), 0, s, pdl, qkv, n_heads, n_kv, hd,
               q_norm, k_norm, eps, rope, pos, q_out, k_cache, v_cache);
}

/* The launch shapes. FMC_ATT_SHORT: blocks of 8 warps holding 128 queries (a whole verify block), 16 per KV
 * head. FMC_ATT_LONG (past 960 positions: cuda_backend_state.h's ATT_LONG_FROM and its sweep), for
 * launches of up to 64 queries a KV head (steps, the drafter's 16 slots, verify blocks of up to 64 / G
 * rows): the smallest block whose 16-query tiles hold them, at least 2 warps (both load; one computes when
 * the queries fit one tile), 128 warps per KV head in all. Measured on the H200, plain steps alternated
 * with the binary before each change in one device call:
 * - the 8-warp block holds 246 registers a thread (one an SM) and a step leaves 7 of its 8 warps idle: at
 *   16k positions the step's attention ran at 0.5 TB/s; 2-warp blocks: 16k step 7.60 -> 5.97 ms, 512
 *   positions 2.72 -> 2.84 ms (so the short form stays at short contexts);
 * - the one-tile blocks copy their splits with cp.async (k_attn_split_async: 160 registers, 5 blocks an SM
 *   as their shared memory allows): 16k step 5.04 -> 4.30 ms (4.60 through registers held to 204);
 * - the 32- and 64-query blocks keep the register loads: verify(8) at 16k took 88 us a layer against 92
 *   with cp.async (one or two stages), 6.33 ms against 5.94 held to 5 blocks an SM;
 * - cp.async with two stages (the next split copied while this one computes) made the 8-warp blocks' verify
 *   (17) at 16k 155 -> 130 us a layer in two builds and not in a third (152), and the 512-position step
 *   1.2 % slower: not used.
 * Same bits whatever the shape: every shape runs the same per-query code (attn_split_tile). */
struct attn_shape {
    int qr, nw, blocks; /* queries and warps of a block, blocks per KV head */
};
static const attn_shape k_attn_long[] = {{16, 2, 64}, {32, 2, 64}, {64, 4, 32}, {ATT_QROWS, ATT_WARPS, 16}};
static const attn_shape &k_attn_short = k_attn_long[3];

static attn_shape attn_shape_for(int T, int G, int form) {
    if (form == FMC_ATT_LONG)
        for (const attn_shape &sh : k_attn_long)
            if (T * G <= sh.qr) return sh;
    return k_attn_short;
}

int fmc_attn_long_form(int T, int n_heads, int n_kv) {
    return attn_shape_for(T, n_heads / n_kv, FMC_ATT_LONG).qr < k_attn_short.qr;
}

/* grid (min(max_splits, the shape's blocks per KV head), n_kv, ceil(T / rows)), NW warps, rows = QR / G
 * query rows of T (G = n_heads / n_kv query heads each). Block x takes splits x, x + gridDim.x, ... (a graph
 * sized for the whole context launches few idle blocks). Split s: keys [j0, j0 + 64), j0 = 64 s, of KV head
 * g, loaded into shared memory once for all the block's (row, head) queries; query i = (t - tb) G + head sits
 * in row i % 16 of warp i / 16's tile. The length of row t is pos + t + 1 (causal) or pos + 1.
 *
 * On the f16 tensor cores (mma m16n8k16, f32 accumulation): scores S = Q K^T for 16 queries x 64 keys, the
 * softmax in registers (a query's 64 scores sit in one lane quad: max and sum in a fixed order), then O = P V
 * with P's registers as the A operand. q and P enter as two f16 parts each (split_half2), so the result stays
 * within f32 rounding of the exact attention over the f16 cache. A query's result depends only on its own
 * row of Q, the keys and its length, never on which tile or lane it landed in: the same bits whatever T is.
 * The two kernels below differ only in how a split reaches shared memory (the per-query code,
 * attn_split_tile, is in cuda_attn.cuh). */

/* Whether a split block spreads its tiles over its warps (attn_tile_spread): the short form's blocks (8 warps
 * for up to 128 queries, of which a verify block of 8 rows fills 2 tiles), up to 128 dims (a head of 256
 * would leave no shared memory for the exchange). */
__host__ __device__ constexpr bool attn_spreads(int hd, int qr) {
    return qr == ATT_QROWS && hd <= 128;
}

/* Tiles [0, tiles) of a split block on KW warps each (warp w: tile w / KW, its part w % KW), by
 * attn_split_tile_kw through xs (ATTN_XS_FLOATS a tile), with named barrier 1 + tile for each tile's warps.
 */
template <int HD, int QR, int KW>
__device__ __forceinline__ void attn_tile_spread(int T, int n_heads, int n_kv, const int *pos, int causal,
                                                 const __half *Qs, const uint32_t *Ks, const __half *Vs,
                                                 int s, int max_splits, float *part, float *xs, int tiles) {
    const int warp = threadIdx.x >> 5, rw = warp / KW;
    if (rw >= tiles) return;
    const attn_block a = attn_block_setup<HD, QR>(T, n_heads, n_kv, pos, causal, blockIdx.y, blockIdx.z, rw);
    attn_split_tile_kw<HD, QR, KW>(a, Qs, Ks, Vs, s, n_heads, max_splits, part, xs + rw * ATTN_XS_FLOATS,
                                   warp % KW, named_bar{1 + rw, KW * 32});
}

/* Loads through registers: all of a round's 16-byte loads in flight at once, then stored. */
template <int HD, int QR, int NW>
__global__ void __launch_bounds__(NW * 32, 1)
    k_attn_split(const float *q, int T, int n_heads, int n_kv, const __half *kc, const __half *vc,
                 const int *pos, int causal, int max_splits, float *part) {
    constexpr int KP = attn_kp(HD), VP = attn_vp(HD), C8N = HD / 8;
    constexpr int ROUNDS = (FMC_ATT_SPLIT * C8N + NW * 32 * 8 - 1) / (NW * 32 * 8); /* of the loads below */
    static_assert(QR <= NW * 16, "a 16-row query tile per warp");
    extern __shared__ __align__(16) unsigned char smem[];
    const attn_tiles<HD> sm(smem);
    uint32_t *Ks = sm.Ks;
    __half *Vs = sm.Vs, *Qs = sm.Qs;
    pdl_trigger();
    /* *pos comes from the host before the graph; cache rows below it were written by earlier forwards, so
     * the first split's rows below it load before the predecessor (which writes rows pos ..) is done. */
    const attn_block a = attn_block_setup<HD, QR>(T, n_heads, n_kv, pos, causal, blockIdx.y, blockIdx.z);
    const bool busy = a.warp * 16 < a.nq;
    /* the short form's blocks spread a few tiles over their warps, exchanging through xs */
    const int tiles = attn_spreads(HD, QR) ? (a.nq + 15) / 16 : NW;
    float *xs = (float *)(smem + attn_smem(HD, QR));
    bool waited = false;
    for (int s = blockIdx.x; s < max_splits; s += gridDim.x) {
        const int j0 = s * FMC_ATT_SPLIT;
        if (a.tb >= T || a.maxlen <= j0) break;
        const int nload = min(FMC_ATT_SPLIT, a.maxlen - j0);
        /* A thread's 16-byte loads in rounds of 8 for K and V, all of a round in flight at once (8 warps: one
         * round up to 64 keys x 256 dims); V rows past nload are zeroed (P is 0 there, and 0 * garbage could
         * be NaN). */
#pragma unroll 1
        for (int r = 0; r < ROUNDS; r++) {
            int4 kr[8], vr[8];
            for (int pass = 0; pass < 2; pass++) {
                if (pass == 1 && !waited) {
                    pdl_wait(), waited = true;
                    /* the busy warps' tiles only (a step has 1) */
                    attn_load_q<HD, QR>(q, Qs, a.tb, a.g, a.G, n_heads, (a.nq + 15) / 16 * 16, a.nq);
                }
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int idx = threadIdx.x + (r * 8 + u) * NW * 32, j = idx / C8N, c8 = idx - j * C8N;
                    if (idx < nload * C8N && (j0 + j < a.p0) == (pass == 0)) {
                        const size_t off = (size_t)(j0 + j) * a.kv_dim + (size_t)a.g * HD + c8 * 8;
                        kr[u] = __ldcg((const int4 *)(kc + off));
                        vr[u] = __ldcg((const int4 *)(vc + off));
                    }
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int idx = threadIdx.x + (r * 8 + u) * NW * 32, j = idx / C8N, c8 = idx - j * C8N;
                if (idx < FMC_ATT_SPLIT * C8N) {
                    const bool in = idx < nload * C8N;
                    *(int4 *)(Ks + j * KP + c8 * 4) = in ? kr[u] : make_int4(0, 0, 0, 0);
                    *(int4 *)(Vs + j * VP + c8 * 8) = in ? vr[u] : make_int4(0, 0, 0, 0);
                }
            }
        }
        __syncthreads();
        if (tiles * 4 <= NW) /* a verify block of up to 32 / G rows: 4 warps a tile */
            attn_tile_spread<HD, QR, 4>(T, n_heads, n_kv, pos, causal, Qs, Ks, Vs, s, max_splits, part, xs,
                                        tiles);
        else if (tiles * 2 <= NW)
            attn_tile_spread<HD, QR, 2>(T, n_heads, n_kv, pos, causal, Qs, Ks, Vs, s, max_splits, part, xs,
                                        tiles);
        else if (busy)
            attn_split_tile<HD, QR>(a, Qs, Ks, Vs, s, n_heads, max_splits, part);
        __syncthreads(); /* Ks / Vs are rewritten by the next split */
    }
    if (!waited) pdl_wait();
}

/* Copies by cp.async (L2 only, no registers: 160 a thread instead of 229, so the one-tile blocks fit as many
 * to an SM as their shared memory allows). */
template <int HD, int QR, int NW>
__global__ void __launch_bounds__(NW * 32, 1)
    k_attn_split_async(const float *q, int T, int n_heads, int n_kv, const __half *kc, const __half *vc,
                       const int *pos, int causal, int max_splits, float *part) {
    static_assert(QR <= NW * 16, "a 16-row query tile per warp");
    extern __shared__ __align__(16) unsigned char smem[];
    const attn_tiles<HD> sm(smem);
    uint32_t *Ks = sm.Ks;
    __half *Vs = sm.Vs, *Qs = sm.Qs;
    pdl_trigger();
    const attn_block a = attn_block_setup<HD, QR>(T, n_heads, n_kv, pos, causal, blockIdx.y, blockIdx.z);
    const bool busy = a.warp * 16 < a.nq;
    /* The cache is read once, the partials by the merge next: loaded as the first lines L2 evicts (16k
     * positions, two rounds against the same kernel without: attention 48.7 / 48.3 -> 47.1 / 46.8 us a
     * layer, the step 4.298 / 4.321 -> 4.265 / 4.253 ms; the register-loading kernel's verify blocks
     * gained nothing from it). */
    const uint64_t pol = l2_evict_first();
    auto valid = [&](int s) { return s < max_splits && a.tb < T && s * FMC_ATT_SPLIT < a.maxlen; };
    /* Split s's keys and values; rows past the block's longest row zero-filled (P is 0 there, and 0 *
     * garbage could be NaN). which: rows below p0 (0), the others (1), all (2). */
    auto copy_split = [&](int s, int which) {
        attn_copy_split<HD>(Ks, Vs, kc, vc, a, s, which, threadIdx.x, NW * 32, pol);
    };
    /* as in k_attn_split: the first split's rows below *pos before the predecessor is done */
    int s = blockIdx.x;
    if (valid(s)) copy_split(s, 0);
    pdl_wait();
    if (valid(s)) {
        attn_load_q<HD, QR>(q, Qs, a.tb, a.g, a.G, n_heads, (a.nq + 15) / 16 * 16, a.nq);
        copy_split(s, 1);
    }
    cp_async_commit();
    while (valid(s)) {
        const int next = s + gridDim.x;
        cp_async_commit();  /* the copies issued after the previous split */
        cp_async_wait<0>(); /* this split's copies have landed */
        __syncthreads();
        if (busy) attn_split_tile<HD, QR>(a, Qs, Ks, Vs, s, n_heads, max_splits, part);
        __syncthreads(); /* Ks / Vs are rewritten next */
        if (valid(next)) copy_split(next, 2);
        s = next;
    }
}

/* grid (n_heads, T), HD threads: head blockIdx.x of row blockIdx.y merged (attn_combine_head). */
template <int HD>
__global__ void __launch_bounds__(HD) k_attn_combine(int n_heads, const int *pos, int causal, int max_splits,
                                                     const float *part, int8_t *xq, float *xd, float *out) {
    constexpr int CH = attn_combine_chunk(HD);
    __shared__ __align__(16) float buf[2 * CH * (HD + 2)];
    pdl_trigger();
    pdl_wait();
    const int len = causal ? *pos + blockIdx.y + 1 : *pos + 1;
    attn_combine_head<HD, CH>(n_heads, blockIdx.x, blockIdx.y, len, max_splits, part, buf, xq, xd, out,
                              threadIdx.x, attn_combine_block{});
}

typedef void (*combine_kernel)(int, const int *, int, int, const float *, int8_t *, float *, float *);

typedef void (*attn_kernel)(const float *, int, int, int, const __half *, const __half *, const int *, int,
                            int, float *);

static attn_kernel attn_pick(int hd, attn_shape sh) {
    return attn_by_hd<attn_kernel>(hd, [sh](auto c) -> attn_kernel {
        constexpr int HD = decltype(c)::value;
        return sh.qr == 16   ? k_attn_split_async<HD, 16, 2>
               : sh.qr == 32 ? k_attn_split<HD, 32, 2>
               : sh.qr == 64 ? k_attn_split<HD, 64, 4>
                             : k_attn_split<HD, ATT_QROWS, ATT_WARPS>;
    });
}

int fmc_attn_head_dim_ok(int hd) {
    return attn_pick(hd, k_attn_short) != NULL;
}

/* attn_smem and, where the blocks spread their tiles, the tiles' exchange room (attn_tile_spread: up to
 * ATT_WARPS / 2 tiles of 2 warps) */
static size_t attn_split_smem(int hd, attn_shape sh) {
    return attn_smem(hd, sh.qr) +
           (attn_spreads(hd, sh.qr) ? (size_t)(ATT_WARPS / 2) * ATTN_XS_FLOATS * 4 : 0);
}

int fmc_attn_init(void) {
    for (int hd = 16; hd <= 256; hd *= 2)
        for (const attn_shape &sh : k_attn_long)
            if (cudaFuncSetAttribute(attn_pick(hd, sh), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)attn_split_smem(hd, sh)) != cudaSuccess)
                return -1;
    return attn_prefill_init();
}

/* Verify blocks and steps on the split kernel; longer causal chunks (prefill) in one pass (the same bits),
 * the output then quantised by the activation quantiser (part holds T x n_heads x hd floats for it; it rounds
 * as the merge's quant_lane does). */
static void attention(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                      const __half *v_cache, const int *pos, int causal, int max_splits, float *part,
                      int8_t *xq, float *xd, float *out, int form, int pdl, cudaStream_t s) {
    if (causal && T > FMC_ATT_SPLIT_MAX_T && fmc_attn_prefill_fits(n_heads, n_kv, hd)) {
        attn_prefill(q, T, n_heads, n_kv, hd, k_cache, v_cache, pos, xq ? part : out, pdl, s);
        if (xq) fmc_q8_quant(part, n_heads * hd, NULL, 0.0f, n_heads * hd, T, xq, xd, pdl, s);
        return;
    }
    const int G = n_heads / n_kv;
    const attn_shape sh = attn_shape_for(T, G, form);
    const int rows = sh.qr / G;
    fmc_launch(attn_pick(hd, sh), dim3(std::min(max_splits, sh.blocks), n_kv, (T + rows - 1) / rows),
               dim3(sh.nw * 32), attn_split_smem(hd, sh), s, pdl, q, T, n_heads, n_kv, k_cache, v_cache, pos,
               causal, max_splits, part);
    const combine_kernel combine = attn_by_hd<combine_kernel>(
        hd, [](auto c) -> combine_kernel { return k_attn_combine<decltype(c)::value>; });
    fmc_launch(combine, dim3(n_heads, T), dim3(hd), 0, s, pdl, n_heads, pos, causal, max_splits,
               (const float *)part, xq, xd, out);
}

void fmc_attention_q8(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                      const __half *v_cache, const int *pos, int causal, int max_splits, float *part,
                      int8_t *xq, float *xd, int form, int pdl, cudaStream_t s) {
    attention(q, T, n_heads, n_kv, hd, k_cache, v_cache, pos, causal, max_splits, part, xq, xd, NULL, form,
              pdl, s);
}

void fmc_attention_f32(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                       const __half *v_cache, const int *pos, int causal, int max_splits, float *part,
                       float *out, int form, int pdl, cudaStream_t s) {
    attention(q, T, n_heads, n_kv, hd, k_cache, v_cache, pos, causal, max_splits, part, NULL, NULL, out, form,
              pdl, s);
}
