/* cuda_q8.cu: Q8_0 weights on the GPU: the tiled layout (see cuda_kernels.cuh), its repack from GGUF blocks,
 * token lookup, the activation quantiser, and the matrix product for 1..32 tokens per launch on the int8
 * tensor cores (more tokens: the wide kernel of cuda_q8_wide.cu, same results; see cuda_q8.cuh).
 *
 * The product streams each weight byte once for all tokens of a launch. The work split (fmc_split) is fixed
 * per matrix: a warp owns one 16-row tile and a fixed run of its K/32 blocks, keeps up to 8 tiles of 512
 * bytes with their activation fragments in flight through cp.async (cuda_gemm.cuh; the weights of the first
 * stages before the preceding kernel is done), and per block gets the exact int32 dots of 16 rows x 8
 * tokens from one mma.m16n8k32. Each (row, token) then takes acc += isum * (dw * dx) in f32, block by block
 * in the warp's order; the warps' and blocks' partial sums are added in a fixed order: the same operations
 * whatever T is (explicit __fmaf_rn / __fadd_rn keep the compiler from contracting differently in the
 * per-T instantiations). Activations come quantised in "fragment order" (a lane's 8 bytes of a block for 8
 * tokens contiguous), so a warp's activation load is one coalesced 256-byte read. The quantiser (RMSNorm +
 * Q8_0) runs one token per 256-thread block with a fixed reduction order, so a token's values never depend
 * on T either. */
#include <algorithm>

#include "cuda/cuda_q8.cuh"

/* ---- layout ---- */

void fmc_q8_bytes(int N, int K, size_t *qs_bytes, size_t *sc_bytes) {
    const size_t tiles = (size_t)((N + 15) / 16) * (K / 32);
    *qs_bytes = tiles * 512;
    *sc_bytes = tiles * 32;
}

/* One thread per (tile, lane): its A fragment a0..a3 = rows g, g+8 x quants 4c..4c+3, then 16+4c..16+4c+3. */
__global__ void k_repack_q8(const uint8_t *blocks, int N, int NB, int64_t total, int4 *qs, uint32_t *sc) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int lane = (int)(i & 31), g = lane >> 2, c = lane & 3;
    const int64_t tile = i >> 5;
    const int rt = (int)(tile / NB), b = (int)(tile % NB);
    const int r0 = rt * 16 + g, r1 = r0 + 8;
    uint32_t w[4];
    for (int reg = 0; reg < 4; reg++) {
        const int r = (reg & 1) ? r1 : r0, k0 = ((reg & 2) ? 16 : 0) + 4 * c;
        uint32_t v = 0;
        if (r < N) {
            const uint8_t *q = blocks + ((int64_t)r * NB + b) * 34 + 2 + k0;
            v = (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
        }
        w[reg] = v;
    }
    qs[i] = make_int4((int)w[0], (int)w[1], (int)w[2], (int)w[3]);
    if (c == 0) {
        uint32_t d0 = 0, d1 = 0;
        if (r0 < N)
            d0 = blocks[((int64_t)r0 * NB + b) * 34] | (uint32_t)blocks[((int64_t)r0 * NB + b) * 34 + 1] << 8;
        if (r1 < N)
            d1 = blocks[((int64_t)r1 * NB + b) * 34] | (uint32_t)blocks[((int64_t)r1 * NB + b) * 34 + 1] << 8;
        sc[tile * 8 + g] = d0 | d1 << 16;
    }
}

void fmc_q8_repack(const void *blocks, int N, int K, int glu, int4 *qs, uint32_t *sc, fmc_q8 *w,
                   cudaStream_t s) {
    const int NB = K / 32, NT16 = (N + 15) / 16;
    const int64_t total = (int64_t)NT16 * NB * 32;
    k_repack_q8<<<(unsigned)((total + 255) / 256), 256, 0, s>>>((const uint8_t *)blocks, N, NB, total, qs,
                                                                sc);
    w->qs = qs;
    w->sc = sc;
    w->N = N;
    w->K = K;
    gemm_plan(&w->sp, NB, NT16, glu, 5); /* 4-warp blocks of ~40 KB at 1..8 tokens: 5 per SM (smem) */
}

void fmc_split_scratch(const fmc_split *sp, int N, size_t *part_floats, int *counters) {
    const int groups = (N + 15) / 16 / sp->rt;
    *part_floats = sp->kc > 1 ? (size_t)groups * sp->kc * sp->rt * GEMM_SLOT : 0;
    *counters = sp->kc > 1 ? groups : 0;
}

/* Element (r, k) of a tiled matrix, dequantised as the CPU does: f32(d) * q. */
__device__ __forceinline__ float q8_get(const int4 *qs, const uint32_t *sc, int NB, int64_t r, int k) {
    const int64_t rt = r >> 4;
    const int rr = (int)(r & 15), g = rr & 7, hi = rr >> 3, b = k >> 5, kk = k & 31;
    const int c = (kk & 15) >> 2, reg = hi + 2 * (kk >> 4);
    const int8_t *t = (const int8_t *)(qs + (rt * NB + b) * 32 + g * 4 + c);
    const uint32_t s2 = sc[(rt * NB + b) * 8 + g];
    const float d = __half2float(__ushort_as_half((unsigned short)(hi ? s2 >> 16 : s2 & 0xffff)));
    return d * (float)t[reg * 4 + (kk & 3)];
}

__global__ void k_embed_q8(const int4 *qs, const uint32_t *sc, int K, const int32_t *ids, float *x) {
    pdl_trigger();
    const int t = blockIdx.x;
    const int64_t row = ids[t];
    for (int i = threadIdx.x; i < K; i += blockDim.x) x[(size_t)t * K + i] = q8_get(qs, sc, K / 32, row, i);
}

void fmc_embed_q8(const fmc_q8 *tab, const int32_t *ids, int T, float *x, cudaStream_t s) {
    k_embed_q8<<<T, 256, 0, s>>>(tab->qs, tab->sc, tab->K, ids, x);
}

/* ---- activations in fragment order ---- */

/* Token t of x (f32 [K]): RMSNorm with weight nw (when not NULL; double sum of squares, per-thread partials
 * over a fixed float4 stride, the warp butterfly, then the 8 warps in order), then ggml's Q8_0 quantisation
 * of each 32-block by one thread, into xq / xd (fragment order, token t). Called by all Q8_THREADS threads of
 * a block; ends with the block synchronised. */
__device__ void q8_quant_token(const float *x, const float *nw, float eps, int K, int t, int8_t *xq,
                               float *xd) {
    __shared__ double part[Q8_WARPS];
    const int tid = threadIdx.x, NB = K >> 5;
    float r = 1.0f;
    if (nw) {
        double ss = 0;
#pragma unroll 4
        for (int j = tid; j < K / 4; j += Q8_THREADS) {
            const float4 v = ld_cg4(x + 4 * j);
            ss += (double)v.x * v.x;
            ss += (double)v.y * v.y;
            ss += (double)v.z * v.z;
            ss += (double)v.w * v.w;
        }
        ss = warp_sum_d(ss);
        if ((tid & 31) == 0) part[tid >> 5] = ss;
        __syncthreads();
        double tot = 0;
        for (int w = 0; w < Q8_WARPS; w++) tot += part[w];
        r = (float)(1.0 / sqrt(tot / (double)K + (double)eps));
    }
    for (int b = tid; b < NB; b += Q8_THREADS) {
        float v[32];
#pragma unroll
        for (int j = 0; j < 32; j += 4) {
            const float4 xv = ld_cg4(x + b * 32 + j);
            v[j] = __fmul_rn(xv.x, r), v[j + 1] = __fmul_rn(xv.y, r);
            v[j + 2] = __fmul_rn(xv.z, r), v[j + 3] = __fmul_rn(xv.w, r);
            if (nw) {
                const float4 wv = __ldg((const float4 *)(nw + b * 32 + j));
                v[j] = __fmul_rn(v[j], wv.x), v[j + 1] = __fmul_rn(v[j + 1], wv.y);
                v[j + 2] = __fmul_rn(v[j + 2], wv.z), v[j + 3] = __fmul_rn(v[j + 3], wv.w);
            }
        }
        uint32_t q[8];
        xd[frag_d(t, b, NB)] = quant_block32(v, q);
#pragma unroll
        for (int m = 0; m < 8; m++) *(uint32_t *)(xq + frag_off(t, b * 32 + 4 * m, NB)) = q[m];
    }
    __syncthreads();
}

/* grid (T): token t of x [T][ldx]. */
__global__ void __launch_bounds__(Q8_THREADS)
    k_quant(const float *x, int ldx, const float *nw, float eps, int K, int8_t *xq, float *xd) {
    pdl_trigger();
    pdl_wait();
    q8_quant_token(x + (size_t)blockIdx.x * ldx, nw, eps, K, blockIdx.x, xq, xd);
}

/* Sum over the block's Q8_THREADS threads in a fixed order (warp butterfly, then the warps in order). */
__device__ double q8_block_sum(double v, double *part) {
    v = warp_sum_d(v);
    __syncthreads(); /* part free from a previous call */
    if ((threadIdx.x & 31) == 0) part[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    for (int w = 0; w < Q8_WARPS; w++) t += part[w];
    return t;
}

/* grid (T): the drafter's AdaLN y = LN(x) * (1 + scale) + shift (fmc_ln_mod_rows' formulas) of token t,
 * then that row quantised (q8_quant_token) for the next Q8_0 product: one kernel instead of two. */
__global__ void __launch_bounds__(Q8_THREADS)
    k_ln_mod_quant(const float *x, const float *scale, const float *shift, int n, float eps, float *y,
                   int8_t *xq, float *xd) {
    __shared__ double part[Q8_WARPS];
    pdl_trigger();
    pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double su = 0;
    for (int i = threadIdx.x; i < n; i += Q8_THREADS) su += xr[i];
    const double mu = q8_block_sum(su, part) / n;
    double q = 0;
    for (int i = threadIdx.x; i < n; i += Q8_THREADS) q += (xr[i] - mu) * (xr[i] - mu);
    q = q8_block_sum(q, part);
    const float r = (float)(1.0 / sqrt(q / n + eps)), muf = (float)mu;
    for (int i = threadIdx.x; i < n; i += Q8_THREADS)
        yr[i] = (xr[i] - muf) * r * (1.0f + scale[i]) + shift[i];
    __syncthreads(); /* the block's writes of yr are visible to its threads */
    q8_quant_token(yr, NULL, 0.0f, n, blockIdx.x, xq, xd);
}

void fmc_ln_mod_quant(const float *x, const float *scale, const float *shift, int T, int n, float eps,
                      float *y, int8_t *xq, float *xd, int pdl, cudaStream_t s) {
    fmc_launch(k_ln_mod_quant, dim3(T), dim3(Q8_THREADS), 0, s, pdl, x, scale, shift, n, eps, y, xq, xd);
}

/* ---- the product ---- */

/* Bytes of one pipeline stage of a warp: the tile (512), its scale pairs and, per 8-token n-tile, the
 * activation fragments (32 lanes x 8; tokens past T zero-filled, not read) and the tokens' scales. Up to 8
 * tokens every lane keeps its own copy of the scales it needs (32 x 4 and 32 x 8 bytes); from 9 tokens the
 * scales are stored once (8 pairs, 8 floats per n-tile, "shared") and the lanes read them after a
 * __syncwarp, so a stage takes 832 instead of 2176 bytes at 17..24 tokens and 6 stages fit where 4 did
 * (measured on the H200: verify(17) 6.41 -> 5.72 ms), and 1120 instead of 1664 at 9..16 (the drafter's 16
 * slots: fc1 20.2 -> 15.4 us, fc2 28.0 -> 22.8 us, a draft 1.213 -> 1.152 ms); at 1..8 tokens the shared
 * layout was no faster. The same values and operations either way: the bits do not change. */
__host__ __device__ constexpr bool q8_shared_scales(int NT) {
    return NT >= 2;
}
__host__ __device__ constexpr int q8_stage_bytes(int NT) {
    return q8_shared_scales(NT) ? 544 + 288 * NT : 640 + 512 * NT;
}
/* Stages in flight per warp: 8, or 6 from 17 tokens (about 9-10 KB per warp, 5 blocks of 4 warps per SM). */
__host__ __device__ constexpr int q8_stages(int NT) {
    return NT <= 2 ? 8 : 6;
}

/* Where the GLU epilogue keeps its [8 NT tokens][64 rows]: after the merge's buffer, or from 17 tokens in the
 * stages once every warp is past them. A buffer of its own took a block to 46 KB at 17..24 tokens, so only 4
 * blocks fitted on an SM and a gate/up launch ran in 1.15 waves (ncu on the H200: 47 us, 2x a step's; 36 us
 * in the stages); in a step the extra barrier cost more than it saved (plain step +0.5 %). */
__host__ __device__ constexpr bool q8_glu_in_stages(int NT) {
    return NT >= 3;
}

/* The warps' stages, the merge's buffer (red), the GLU epilogue's buffer. */
static size_t q8_smem(const fmc_split *sp, int NT, int mode) {
    const size_t warps = (size_t)sp->rt * sp->w, glu = (size_t)8 * NT * 64 * 4;
    size_t stages = warps * q8_stages(NT) * q8_stage_bytes(NT), s = warps * NT * 4 * 32 * 4;
    if (mode == Q8_GLU) {
        if (q8_glu_in_stages(NT))
            stages = std::max(stages, glu);
        else
            s += glu;
    }
    return stages + s;
}

/* grid: groups x kc blocks of rt * w warps (fmc_split). */
template <int NT, int MODE> __global__ void __launch_bounds__(Q8_THREADS) k_q8_gemm(const q8_args a) {
    constexpr int STG = q8_stages(NT), SB = q8_stage_bytes(NT);
    constexpr bool SH = q8_shared_scales(NT);
    constexpr int XO = SH ? 544 : 640; /* offset of the activation fragments in a stage */
    extern __shared__ __align__(16) unsigned char smem[];
    const fmc_split sp = a.sp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = sp.rt * sp.w;
    const int g = lane >> 2, c = lane & 3, T = a.T;
    const int NB = a.K >> 5, NT16 = (a.N + 15) >> 4;
    const int group = blockIdx.x / sp.kc, kci = blockIdx.x - group * sp.kc;
    const int r = warp / sp.w, i = warp - r * sp.w;
    const int tile = MODE == Q8_GLU ? (r < 2 ? 2 * group + r : NT16 / 2 + 2 * group + r - 2) : group;
    /* (Every tile exists with the grids of q8_run; a warp past the last would compute tile 0 unstored.) */
    const bool active = tile < NT16;
    const int lt = active ? tile : 0;
    const int nbw = NB / (sp.w * sp.kc), b0 = (kci * sp.w + i) * nbw;
    const int4 *ap = a.qs + ((int64_t)lt * NB + b0) * 32 + lane;
    /* shared scales: lanes 0..7 copy the scale pairs, lanes 0..3 the tokens' scales */
    const uint32_t *sp8 = a.sc + ((int64_t)lt * NB + b0) * 8 + (SH ? lane & 7 : g);
    const uint2 *xg = (const uint2 *)a.xq + (size_t)b0 * 32 + lane;    /* + (n NB + j) 32 for block b0 + j */
    const float *dg = a.xd + (size_t)b0 * 8 + 2 * (SH ? lane & 3 : c); /* + (n NB + j) 8 */
    unsigned char *wb = smem + (size_t)warp * STG * SB;                /* this warp's stages */
    float *red = (float *)(smem + (size_t)nwarps * STG * SB);
#define Q8_W(st) ((int4 *)(wb + (st)*SB) + lane)
    const int sl = SH ? lane : 0, cl = SH ? c : 0;         /* copy slot / read index of the scales */
    const bool sw = !SH || lane < 8, dw = !SH || lane < 4; /* lanes that copy them */
#define Q8_S(st) ((uint32_t *)(wb + (st)*SB + 512) + (SH ? 0 : lane))
#define Q8_X(st, n) ((uint2 *)(wb + (st)*SB + XO) + (n)*32 + lane)
#define Q8_D(st, n) ((float2 *)(wb + (st)*SB + XO + NT * 256) + (n) * (SH ? 4 : 32) + (SH ? 0 : lane))

    pdl_trigger();
    /* Weights never change: the first stages' weights (one group) are in flight before the predecessor is
     * done; their activations (one group per stage) after. Tile j's data is then complete once the groups
     * up to 1 + j (j < STG) or the refill group of iteration j - STG are: always the oldest but STG - 1. */
#pragma unroll
    for (int st = 0; st < STG; st++)
        if (active && st < nbw) {
            cp_async16(Q8_W(st), ap + st * 32);
            if (sw) cp_async4(Q8_S(st) + sl, sp8 + st * 8);
        }
    cp_async_commit();
    pdl_wait();
#pragma unroll
    for (int st = 0; st < STG; st++) {
        if (active && st < nbw)
#pragma unroll
            for (int n = 0; n < NT; n++) {
                cp_async8(Q8_X(st, n), xg + ((size_t)n * NB + st) * 32, 8 * n + g < T ? 8 : 0);
                if (dw) cp_async8(Q8_D(st, n) + sl, dg + ((size_t)n * NB + st) * 8);
            }
        cp_async_commit();
    }

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    if constexpr (NT == 1) {
        /* Steps: the loop as first written. The form below measured slower here (H200, same run: plain step
         * 2.784 against 2.738 ms; with running pointers alone 2.84): a step's kernels wait on memory, and
         * the schedule the compiler makes of this form suits them. */
        for (int it = 0; it < nbw; it++) {
            const int slot = it % STG;
            cp_async_wait<STG - 1>();
            if (active) {
                const int4 A = *Q8_W(slot);
                const uint32_t S = *Q8_S(slot);
                const float dw0 = half_lo(S), dw1 = half_hi(S);
                const uint2 xv = *Q8_X(slot, 0);
                const float2 dx = *Q8_D(slot, 0);
                int d[4];
                mma_s8(d, A, xv.x, xv.y);
                q8_scale_add<4>(acc[0], d, dw0, dw1, dx);
                const int nx = it + STG;
                if (nx < nbw) {
                    cp_async16(Q8_W(slot), ap + nx * 32);
                    if (sw) cp_async4(Q8_S(slot) + sl, sp8 + nx * 8);
                    cp_async8(Q8_X(slot, 0), xg + (size_t)nx * 32, g < T ? 8 : 0);
                    if (dw) cp_async8(Q8_D(slot, 0) + sl, dg + (size_t)nx * 8);
                }
            }
            cp_async_commit();
        }
    } else {
        static_assert(SH, "shared scales from 9 tokens");
        /* 9..32 tokens: STG iterations at a time, so that every slot's shared-memory address is a constant,
         * and refills from running pointers. The per-tile address arithmetic was most of the instructions
         * (ncu: 189 a tile at 17..24 tokens); verify(17) 4.98 -> 4.66 ms, the draft's fc1 / fc2 15.4 / 22.6
         * -> 14.2 / 21.9 us. */
        const size_t xn = (size_t)NB * 32, dn = (size_t)NB * 8; /* from one n-tile's activations to the next */
        const int4 *ar = ap + STG * 32;
        const uint32_t *sr = sp8 + STG * 8;
        const uint2 *xr = xg + STG * 32;
        const float *dr = dg + STG * 8;
        int xbytes[NT];
#pragma unroll
        for (int n = 0; n < NT; n++) xbytes[n] = 8 * n + g < T ? 8 : 0;
        for (int it0 = 0; it0 < nbw; it0 += STG) {
#pragma unroll
            for (int slot = 0; slot < STG; slot++) {
                if (it0 + slot >= nbw) break;
                cp_async_wait<STG - 1>();
                __syncwarp(); /* the scales other lanes copied are visible */
                const int4 A = *Q8_W(slot);
                const uint32_t S = Q8_S(slot)[g];
                const float dw0 = half_lo(S), dw1 = half_hi(S);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    const uint2 xv = *Q8_X(slot, n);
                    const float2 dx = Q8_D(slot, n)[cl];
                    int d[4];
                    mma_s8(d, A, xv.x, xv.y);
                    q8_scale_add<4>(acc[n], d, dw0, dw1, dx);
                }
                __syncwarp(); /* the slot is free once every lane has read it: other lanes refill the scales */
                if (it0 + slot + STG < nbw) { /* tile it + STG */
                    cp_async16(Q8_W(slot), ar);
                    if (sw) cp_async4(Q8_S(slot) + sl, sr);
#pragma unroll
                    for (int n = 0; n < NT; n++) {
                        cp_async8(Q8_X(slot, n), xr + n * xn, xbytes[n]);
                        if (dw) cp_async8(Q8_D(slot, n) + sl, dr + n * dn);
                    }
                }
                ar += 32, sr += 8, xr += 32, dr += 8;
                cp_async_commit();
            }
        }
    }
    cp_async_wait<0>();
#undef Q8_W
#undef Q8_S
#undef Q8_X
#undef Q8_D

    const int fin = gemm_merge<NT>(acc, sp, group, kci, red);
    if (fin < 0) return;
    if (MODE == Q8_GLU) {
        /* local rows 0..31: gate, 32..63: up (q8_glu_in_stages: every warp past the stages after the
         * barrier); then one warp per token: silu(g) * u, quantised. */
        float *gb = q8_glu_in_stages(NT) ? (float *)smem : red + (size_t)nwarps * NT * 4 * 32;
        if (q8_glu_in_stages(NT)) __syncthreads();
        if (fin)
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    gb[(8 * n + 2 * c + (j & 1)) * 64 + r * 16 + g + (j >> 1) * 8] = acc[n][j];
        __syncthreads();
        const int FB = a.N / 64; /* output blocks */
        for (int t = warp; t < T; t += nwarps)
            q8_glu_out(a, t, group, FB, gb[t * 64 + lane], gb[t * 64 + 32 + lane]);
        return;
    }
    if (!fin || !active) return;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = tile * 16 + g + (j >> 1) * 8, t = 8 * n + 2 * c + (j & 1);
            if (t < T && row < a.N) q8_out<MODE>(a, row, t, acc[n][j]);
        }
}

#define Q8_KERNELS(X)                                                                                        \
    X(1, Q8_STORE)                                                                                           \
    X(2, Q8_STORE)                                                                                           \
    X(3, Q8_STORE)                                                                                           \
    X(4, Q8_STORE)                                                                                           \
    X(1, Q8_ADD)                                                                                             \
    X(2, Q8_ADD)                                                                                             \
    X(3, Q8_ADD)                                                                                             \
    X(4, Q8_ADD)                                                                                             \
    X(1, Q8_GLU) X(2, Q8_GLU) X(3, Q8_GLU) X(4, Q8_GLU) X(1, Q8_DSTORE) X(2, Q8_DSTORE) X(3, Q8_DSTORE)      \
        X(4, Q8_DSTORE) X(1, Q8_DGELU) X(2, Q8_DGELU) X(3, Q8_DGELU) X(4, Q8_DGELU) X(1, Q8_DGATE)           \
            X(2, Q8_DGATE) X(3, Q8_DGATE) X(4, Q8_DGATE)

typedef void (*q8_kernel)(const q8_args);

static q8_kernel q8_pick(int NT, int mode) {
#define X(nt, m)                                                                                             \
    if (NT == nt && mode == m) return k_q8_gemm<nt, m>;
    Q8_KERNELS(X)
#undef X
    return NULL;
}

int fmc_q8_init(void) {
    int bad = 0;
#define X(nt, m)                                                                                             \
    bad |= cudaFuncSetAttribute(k_q8_gemm<nt, m>, cudaFuncAttributeMaxDynamicSharedMemorySize,               \
                                Q8_SMEM_LIMIT) != cudaSuccess;
    Q8_KERNELS(X)
#undef X
    return bad || q8_wide_init() ? -1 : 0;
}

void fmc_q8_quant(const float *x, int ldx, const float *nw, float eps, int K, int T, int8_t *xq, float *xd,
                  int pdl, cudaStream_t s) {
    fmc_launch(k_quant, dim3(T), dim3(Q8_THREADS), 0, s, pdl, x, ldx, nw, eps, K, xq, xd);
}

/* f32 input: the quantiser kernel first. Then one launch: of the narrow kernel up to 32 tokens, of the wide
 * one (cuda_q8_wide.cu) beyond. */
static void q8_run(const fmc_q8 *w, const fmc_q8_in *in, int T, int mode, float *y, int ldy, float *y2,
                   int ldy2, int8_t *oq, float *od, const float *bias, const float *gate, int pdl,
                   cudaStream_t s) {
    if (in->x) fmc_q8_quant(in->x, in->ldx, in->nw, in->eps, w->K, T, in->xq, in->xd, pdl, s);
    q8_args a;
    a.qs = w->qs, a.sc = w->sc, a.N = w->N, a.K = w->K, a.T = T, a.sp = w->sp;
    a.xq = in->xq, a.xd = in->xd;
    a.y = y, a.ldy = ldy, a.y2 = y2, a.ldy2 = ldy2, a.oq = oq, a.od = od;
    a.bias = bias, a.gate = gate;
    if (T > GEMM_MAX_TOK) {
        q8_wide_run(w, a, mode, pdl, s);
        return;
    }
    const unsigned groups = (unsigned)((w->N + 15) / 16 / w->sp.rt);
    const int NT = (T + 7) / 8;
    fmc_launch(q8_pick(NT, mode), dim3(groups * w->sp.kc), dim3(w->sp.rt * w->sp.w * 32),
               q8_smem(&w->sp, NT, mode), s, pdl, a);
}

void fmc_q8_matmul(const fmc_q8 *w, const fmc_q8_in *in, int T, float *y, int ldy, int add, float *y2,
                   int ldy2, int pdl, cudaStream_t s) {
    q8_run(w, in, T, add ? Q8_ADD : Q8_STORE, y, ldy, y2, ldy2, NULL, NULL, NULL, NULL, pdl, s);
}

void fmc_q8_glu(const fmc_q8 *w, const fmc_q8_in *in, int T, int8_t *oq, float *od, int pdl, cudaStream_t s) {
    q8_run(w, in, T, Q8_GLU, NULL, 0, NULL, 0, oq, od, NULL, NULL, pdl, s);
}

void fmc_q8_dmatmul(const fmc_q8 *w, const fmc_q8_in *in, int T, float *y, int ldy, const float *bias,
                    int mode, const float *gate, int pdl, cudaStream_t s) {
    q8_run(w, in, T, Q8_DSTORE + mode, y, ldy, NULL, 0, NULL, NULL, bias, gate, pdl, s);
}
