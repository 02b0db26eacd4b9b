/* cuda_attn_prefill.cu: causal attention for prefill chunks (more than FMC_ATT_SPLIT_MAX_T rows) in one pass.
 *
 * The split kernel (cuda_attn.cu) computes every (row, head, 64-key split) on its own and folds the splits
 * in a second kernel. For a 256-row chunk that meant ~50 MB of partial results written and read back per
 * layer. Here a block keeps its 32 queries (2 warps of 16; 8 rows x 4 query heads of one KV head for
 * Qwen3-4B) and walks the keys one split (64 keys) at a time, the next split loading by cp.async while the
 * current one is used: each split's partial from zero with the split kernel's code, folded in registers in
 * split order as its merge folds them (cuda_attn.cuh). So a prompt row gets the bits a step would give it,
 * at the cost of a second set of output registers (heads of up to 128 dimensions; larger ones take the
 * split kernel). */
#include "cuda/cuda_attn.cuh"

/* 2 warps: 32 queries a block (8 rows of 4 heads), so that a 256-row chunk makes 256 blocks (with 4 warps:
 * attention at 256 rows 67 against 61 us a layer on the H200) */
enum { PF_WARPS = 2, PF_QROWS = 16 * PF_WARPS };

/* Bytes of one key tile in shared memory (K and V, as the split kernel lays them out). */
static __host__ __device__ constexpr int prefill_tile_bytes(int hd) {
    return FMC_ATT_SPLIT * attn_kp(hd) * 4 + FMC_ATT_SPLIT * attn_vp(hd) * 2;
}
/* The queries (two f16 parts), then nbuf key tiles: with two, the next one loads while the current one is
 * used; with one, a block takes 52 instead of 87 KB (heads of 128), so 4 blocks share an SM instead of 2.
 * attn_prefill takes one buffer when the grid would not fit the SMs at 2 blocks each (H200, 128-dim heads,
 * context ~770: 512 rows 131 -> 99 us a layer; 128 rows, 128 blocks, 53 against 59 us with one). */
static size_t prefill_smem(int hd, int nbuf) {
    return (size_t)2 * PF_QROWS * attn_vp(hd) * 2 + nbuf * (size_t)prefill_tile_bytes(hd);
}

/* grid (n_kv, ceil(T / rows)), rows = PF_QROWS / G rows of T (G = n_heads / n_kv query heads each); row t
 * sees keys [0, pos + t]. out [T][n_heads][HD]. */
template <int HD, int NBUF>
__global__ void __launch_bounds__(PF_WARPS * 32)
    k_attn_prefill(const float *q, int T, int n_heads, int n_kv, const __half *kc, const __half *vc,
                   const int *pos, float *out) {
    constexpr int KP = attn_kp(HD), VP = attn_vp(HD), C8N = HD / 8, TB = prefill_tile_bytes(HD);
    extern __shared__ __align__(16) unsigned char smem[];
    __half *Qs = (__half *)smem;
    unsigned char *tiles = smem + 2 * PF_QROWS * VP * 2;
    pdl_trigger();
    pdl_wait();
    const int g = blockIdx.x, G = n_heads / n_kv, rows = PF_QROWS / G, tb = blockIdx.y * rows;
    const int p0 = *pos, te = min(T, tb + rows), nq = (te - tb) * G, kv_dim = n_kv * HD;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, gr = lane >> 2, c = lane & 3;
    const int maxlen = p0 + te, ntiles = (maxlen + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
    const float scale = 1.0f / sqrtf((float)HD);
    int qt[2], qh[2], qlen[2]; /* this lane's two query rows (tile rows gr, gr + 8): row, head, length */
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int i = warp * 16 + gr + 8 * u;
        qt[u] = tb + i / G, qh[u] = g * G + i % G;
        qlen[u] = i >= nq ? 0 : p0 + qt[u] + 1;
    }
    const bool busy = warp * 16 < nq;
    /* Key tile jt into buffer b by cp.async; keys past maxlen zero-filled (their probability is 0, and 0 *
     * garbage could be NaN). */
    auto load_tile = [&](int jt, int b) {
        uint32_t *Kb = (uint32_t *)(tiles + b * TB);
        __half *Vb = (__half *)(Kb + FMC_ATT_SPLIT * KP);
        const int j0 = jt * FMC_ATT_SPLIT;
        for (int idx = threadIdx.x; idx < FMC_ATT_SPLIT * C8N; idx += PF_WARPS * 32) {
            const int j = idx / C8N, c8 = idx - j * C8N, ok = j0 + j < maxlen;
            const size_t off = ok ? (size_t)(j0 + j) * kv_dim + (size_t)g * HD + c8 * 8 : 0;
            cp_async16(Kb + j * KP + c8 * 4, kc + off, ok ? 16 : 0);
            cp_async16(Vb + j * VP + c8 * 8, vc + off, ok ? 16 : 0);
        }
    };
    if (NBUF == 2) load_tile(0, 0);
    cp_async_commit();
    attn_load_q<HD, PF_QROWS>(q, Qs, tb, g, G, n_heads, PF_QROWS, nq);

    /* the running fold of the lane's two rows: max, sum, output (cuda_attn.cuh) */
    float M[2] = {-INFINITY, -INFINITY}, L[2] = {0.0f, 0.0f}, o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    for (int jt = 0; jt < ntiles; jt++) {
        const int j0 = jt * FMC_ATT_SPLIT;
        if (NBUF == 2) {
            if (jt + 1 < ntiles)
                load_tile(jt + 1, (jt + 1) & 1); /* its buffer was freed at the end of jt - 1 */
            cp_async_commit();
            cp_async_wait<1>();
        } else {
            load_tile(jt, 0);
            cp_async_commit();
            cp_async_wait<0>();
        }
        __syncthreads(); /* tile jt (and the queries) visible to all */
        const uint32_t *Ks = (const uint32_t *)(tiles + (NBUF == 2 ? jt & 1 : 0) * TB);
        const __half *Vs = (const __half *)(Ks + FMC_ATT_SPLIT * KP);
        if (busy) {
            float sc[8][4], ms[2], ls[2], os[HD / 8][4];
            attn_scores<HD, PF_QROWS>(Qs, Ks, warp, lane, sc);
#pragma unroll
            for (int u = 0; u < 2; u++) ls[u] = attn_softmax_row(sc, u, qlen[u] - j0, scale, c, &ms[u]);
#pragma unroll
            for (int n = 0; n < HD / 8; n++) os[n][0] = os[n][1] = os[n][2] = os[n][3] = 0.0f;
            attn_pv<HD>(sc, Vs, lane, os);
#pragma unroll
            for (int u = 0; u < 2; u++) {
                if (qlen[u] <= j0) continue; /* no key of this split (or no row): the merge skips it too */
                const float2 w = attn_fold_weights(&M[u], &L[u], ms[u], ls[u]);
#pragma unroll
                for (int n = 0; n < HD / 8; n++) {
                    o[n][2 * u] = attn_fold(o[n][2 * u], os[n][2 * u], w);
                    o[n][2 * u + 1] = attn_fold(o[n][2 * u + 1], os[n][2 * u + 1], w);
                }
            }
        }
        __syncthreads(); /* the buffer is reloaded in iteration jt + 1 (one buffer) or jt + 2 */
    }
    if (!busy) return;
#pragma unroll
    for (int u = 0; u < 2; u++) {
        if (qlen[u] == 0) continue; /* no query in this tile row */
        float *dst = out + ((size_t)qt[u] * n_heads + qh[u]) * HD;
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2 *)(dst + n * 8 + 2 * c) =
                make_float2(__fdiv_rn(o[n][2 * u], L[u]), __fdiv_rn(o[n][2 * u + 1], L[u]));
    }
}

typedef void (*prefill_kernel)(const float *, int, int, int, const __half *, const __half *, const int *,
                               float *);

/* Heads of up to 128 dimensions: larger ones would spill the two sets of output registers. */
enum { PF_MAX_HD = 128 };

static prefill_kernel prefill_pick(int hd, int nbuf) {
    return attn_by_hd<prefill_kernel>(hd, [nbuf](auto c) -> prefill_kernel {
        if constexpr (decltype(c)::value <= PF_MAX_HD)
            return nbuf == 1 ? k_attn_prefill<decltype(c)::value, 1> : k_attn_prefill<decltype(c)::value, 2>;
        else
            return NULL;
    });
}

int attn_prefill_init(void) {
    for (int hd = 16; hd <= PF_MAX_HD; hd *= 2)
        for (int nbuf = 1; nbuf <= 2; nbuf++)
            if (cudaFuncSetAttribute(prefill_pick(hd, nbuf), cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)prefill_smem(hd, nbuf)) != cudaSuccess)
                return -1;
    return 0;
}

int fmc_attn_prefill_fits(int n_heads, int n_kv, int hd) {
    return n_heads / n_kv <= PF_QROWS && prefill_pick(hd, 2) != NULL;
}

void attn_prefill(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                  const __half *v_cache, const int *pos, float *out, int pdl, cudaStream_t s) {
    const int rows = PF_QROWS / (n_heads / n_kv);
    const dim3 grid(n_kv, (T + rows - 1) / rows);
    const int nbuf = (long)grid.x * grid.y > 2L * fmc_sm_count() ? 1 : 2;
    fmc_launch(prefill_pick(hd, nbuf), grid, dim3(PF_WARPS * 32), prefill_smem(hd, nbuf), s, pdl, q, T,
               n_heads, n_kv, k_cache, v_cache, pos, out);
}
