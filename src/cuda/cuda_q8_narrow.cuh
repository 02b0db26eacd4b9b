/* cuda_q8_narrow.cuh: the narrow Q8_0 product (1..32 tokens) of one block, as a device function: the
 * kernel of cuda_q8.cu runs it once per block with PDL (q8_pdl_sync), the bench-only persistent kernels of
 * cuda_q8_persist.cu run it for several products in one launch with their own waits. Its stage layout and
 * shared-memory size are here too, and its form with tiles in registers (q8_reg_loop). The staged
 * code is the kernel's former body (the same SASS when it was moved here, checked with cuobjdump). */
#ifndef FM_CUDA_Q8_NARROW_CUH
#define FM_CUDA_Q8_NARROW_CUH

#include <algorithm>

#include "cuda/cuda_q8.cuh"

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

/* Where block 0 of a cluster takes the other blocks' sums (gemm_merge's cs), in bytes from the start of the
 * shared memory: the stages, unused by then, and where they are too small the merge's buffer after them,
 * read before the first cluster barrier (q8_smem makes the room); past the merge's buffer for the register
 * loop, which has no stages. Only the drafter's modes take clusters, so no GLU buffer follows either. */
__host__ __device__ constexpr size_t q8_cluster_off(int warps, int NT, bool reg) {
    return reg ? (size_t)warps * NT * 4 * 32 * 4 : 0;
}

/* The warps' stages (none for the register loop: reg), the merge's buffer (red), the GLU epilogue's buffer,
 * xs bytes of activations (q8_gemv_xs_bytes), and with cluster, block 0's room for the other
 * blocks' sums. */
static inline size_t q8_smem(const fmc_split *sp, int NT, int mode, bool reg = false, bool cluster = false,
                             size_t xs = 0) {
    const size_t warps = (size_t)sp->rt * sp->w, glu = (size_t)8 * NT * 64 * 4;
    size_t stages = reg ? 0 : warps * q8_stages(NT) * q8_stage_bytes(NT), s = warps * NT * 4 * 32 * 4;
    if (mode == Q8_GLU) {
        if (q8_glu_in_stages(NT))
            stages = std::max(stages, glu);
        else
            s += glu;
    }
    const size_t cs = cluster ? q8_cluster_off((int)warps, NT, reg) +
                                    gemm_cluster_floats(sp->kc, sp->rt, NT) * sizeof(float)
                              : 0;
    return std::max(stages + s + xs, cs);
}

/* 16 bytes of a weight tile: no kernel writes them and each is read once, so not kept in L1. */
__device__ __forceinline__ int4 ld_stream16(const int4 *p) {
    int4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.s32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Up to NT n-tiles of 8 tokens, RD tiles a warp in flight in registers instead of shared-memory stages: each
 * lane loads its own 16 bytes of a tile, its scale pair, its activation fragments (zeros for tokens past T,
 * as the stages' zero fill) and the tokens' scales straight into registers. A staged tile moves 1,152 bytes
 * through the L1 pipe twice (ncu: L1/TEX 57-72 % busy in the step's products, 16 excess sectors a tile);
 * here about its 512. The same mma and scaling of the same tiles in the same order as the staged loop: the
 * same bits. Which products it pays for: cuda_q8.cu (q8_takes_reg_loop). xn / dn: from one n-tile's
 * fragments / scales to the next. */
template <int RD, int NT, class SYNC>
__device__ __forceinline__ void q8_reg_loop(float (&acc)[NT][4], const int4 *ap, const uint32_t *sp8,
                                            const uint2 *xg, const float *dg, size_t xn, size_t dn, int nbw,
                                            const bool (&xl)[NT], const SYNC &sync) {
    int4 W[RD];
    uint32_t S[RD];
    uint2 X[NT][RD];
    float2 D[NT][RD];
#pragma unroll
    for (int k = 0; k < RD; k++)
        if (k < nbw) W[k] = ld_stream16(ap + k * 32), S[k] = __ldg(sp8 + k * 8);
    sync.wait();
#pragma unroll
    for (int k = 0; k < RD; k++)
        if (k < nbw)
#pragma unroll
            for (int n = 0; n < NT; n++) {
                X[n][k] = xl[n] ? __ldcg(xg + n * xn + k * 32) : make_uint2(0, 0);
                D[n][k] = __ldcg((const float2 *)(dg + n * dn + k * 8));
            }
    for (int it0 = 0; it0 < nbw; it0 += RD) {
#pragma unroll
        for (int k = 0; k < RD; k++) {
            const int it = it0 + k;
            if (it >= nbw) break;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                int d[4];
                mma_s8(d, W[k], X[n][k].x, X[n][k].y);
                q8_scale_add<4>(acc[n], d, half_lo(S[k]), half_hi(S[k]), D[n][k]);
            }
            const int nx = it + RD;
            if (nx < nbw) {
                W[k] = ld_stream16(ap + nx * 32), S[k] = __ldg(sp8 + nx * 8);
#pragma unroll
                for (int n = 0; n < NT; n++) {
                    X[n][k] = xl[n] ? __ldcg(xg + n * xn + nx * 32) : make_uint2(0, 0);
                    D[n][k] = __ldcg((const float2 *)(dg + n * dn + nx * 8));
                }
            }
        }
    }
}

/* Bytes of a block's activations in shared memory (q8_gemv_loop), per 32-block of its K share: token 0's 32
 * quants and its scale (one token), or the n-tile's 256 bytes of fragments and 8 scales (2..8 tokens). */
__host__ __device__ constexpr size_t q8_gemv_xs_bytes(int nbk, bool full) {
    return (size_t)nbk * (full ? 288 : 36);
}

/* One n-tile (up to 8 tokens; full: more than one), RD tiles a warp in flight in registers as q8_reg_loop,
 * but the activations come from shared memory: after the wait the block copies those of its K share (kb0,
 * nbk blocks) there once, where each warp of the register loop read its fragments and scales from L2 for
 * every tile (the 4 warps of a gate/up block the same ones), and each warp of the staged loop copied them
 * into its stages beside every tile. At one token only token 0's are copied, and the lanes of tokens past 0
 * take token 0's values: they compute sums nobody stores. The mma and scaling of the tokens' tiles are those
 * of the other loops: the same bits. wo: the warp's first block in the share. */
template <int RD, bool FULL, class SYNC>
__device__ __forceinline__ void q8_gemv_loop(float (&acc)[4], const int4 *ap, const uint32_t *sp8,
                                             const q8_args &a, int kb0, int nbk, int wo, int nbw, bool own,
                                             bool active, unsigned char *xsm, const SYNC &sync) {
    constexpr int XP = FULL ? 16 : 2; /* 16-byte pieces of a 32-block's quants */
    int4 W[RD];
    uint32_t S[RD];
#pragma unroll
    for (int k = 0; k < RD; k++)
        if (active && k < nbw) W[k] = ld_stream16(ap + k * 32), S[k] = __ldg(sp8 + k * 8);
    sync.wait();
    int4 *xs = (int4 *)xsm;
    float *ds = (float *)(xsm + (size_t)nbk * XP * 16);
    /* Copies, so that they are all in flight at once (loads and stores through registers ran as a chain:
     * down, 304 blocks of K, 14.0 against 12.6 us). own: no other warp reads the warp's K range (w warps,
     * w ranges), so it copies it and waits for itself; else (GLU: w == 1) the block copies the one range
     * its warps share. */
    const int lo = own ? wo : 0, hi = own ? wo + nbw : nbk;
    const int t0 = own ? (int)(threadIdx.x & 31) : (int)threadIdx.x, ts = own ? 32 : (int)blockDim.x;
    for (int j = XP * lo + t0; j < XP * hi; j += ts)
        cp_async16(xs + j, (const int4 *)(a.xq + (size_t)(kb0 + j / XP) * 256) + j % XP);
    if (FULL)
        for (int j = 2 * lo + t0; j < 2 * hi; j += ts)
            cp_async16((int4 *)ds + j, (const int4 *)(a.xd + (size_t)(kb0 + j / 2) * 8) + j % 2);
    else
        for (int j = lo + t0; j < hi; j += ts) cp_async4(ds + j, a.xd + (size_t)(kb0 + j) * 8);
    cp_async_commit();
    cp_async_wait<0>();
    if (own)
        __syncwarp();
    else
        __syncthreads();
    if (!active) return;
    const int lane = threadIdx.x & 31, c = lane & 3;
    /* full: the lane's fragment (zeros for tokens past T, as the staged loop's zero fill) and its tokens'
     * scale pair; one token: token 0's */
    const bool xl = !FULL || (lane >> 2) < a.T;
    const uint2 *xw = (const uint2 *)xsm + (FULL ? (size_t)wo * 32 + lane : (size_t)wo * 4 + c);
    const float *dw = ds + (FULL ? (size_t)wo * 8 + 2 * c : (size_t)wo);
    for (int it0 = 0; it0 < nbw; it0 += RD) {
#pragma unroll
        for (int k = 0; k < RD; k++) {
            const int it = it0 + k;
            if (it >= nbw) break;
            const uint2 xv = xl ? xw[(size_t)it * (FULL ? 32 : 4)] : make_uint2(0, 0);
            const float2 dx = FULL ? *(const float2 *)(dw + (size_t)it * 8) : make_float2(dw[it], 0.0f);
            int d[4];
            mma_s8(d, W[k], xv.x, xv.y);
            q8_scale_add<4>(acc, d, half_lo(S[k]), half_hi(S[k]), dx);
            const int nx = it + RD;
            if (nx < nbw) W[k] = ld_stream16(ap + nx * 32), S[k] = __ldg(sp8 + nx * 8);
        }
    }
}

/* grid: groups x kc blocks of rt * w warps (fmc_split). */
struct q8_pdl_sync {
    __device__ __forceinline__ void start() const { pdl_trigger(); }
    __device__ __forceinline__ void wait() const { pdl_wait(); }
};
/* XS: activations in shared memory (q8_gemv_loop): 1 one token, 2 up to 8. */
template <int NT, int MODE, class SYNC, int RD = 0, bool CL = false, int XS = 0>
__device__ __forceinline__ void q8_gemm_block(const q8_args &a, const unsigned bid, const SYNC &sync) {
    static_assert(!XS || (NT == 1 && RD > 0 && !CL), "activations in shared memory: one n-tile, registers");
    constexpr int STG = q8_stages(NT), SB = q8_stage_bytes(NT);
    /* scales stored once a stage (the register loop has no stages: every lane reads its own) */
    constexpr bool SH = q8_shared_scales(NT) && RD == 0;
    constexpr int XO = SH ? 544 : 640; /* offset of the activation fragments in a stage */
    extern __shared__ __align__(16) unsigned char smem[];
    const fmc_split sp = a.sp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = sp.rt * sp.w;
    const int g = lane >> 2, c = lane & 3, T = a.T;
    const int NB = a.K >> 5, NT16 = (a.N + 15) >> 4;
    const int group = bid / sp.kc, kci = bid - group * sp.kc;
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
    /* (the register loop has no stages: its merge buffer starts the block's shared memory) */
    float *red = (float *)(smem + (RD > 0 ? 0 : (size_t)nwarps * STG * SB));
#define Q8_W(st) ((int4 *)(wb + (st)*SB) + lane)
    const int sl = SH ? lane : 0, cl = SH ? c : 0;         /* copy slot / read index of the scales */
    const bool sw = !SH || lane < 8, dw = !SH || lane < 4; /* lanes that copy them */
#define Q8_S(st) ((uint32_t *)(wb + (st)*SB + 512) + (SH ? 0 : lane))
#define Q8_X(st, n) ((uint2 *)(wb + (st)*SB + XO) + (n)*32 + lane)
#define Q8_D(st, n) ((float2 *)(wb + (st)*SB + XO + NT * 256) + (n) * (SH ? 4 : 32) + (SH ? 0 : lane))

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    if constexpr (XS) {
        /* after the merge's buffer and the GLU epilogue's (q8_smem) */
        unsigned char *xsm = (unsigned char *)(red + (size_t)nwarps * 4 * 32 + (MODE == Q8_GLU ? 8 * 64 : 0));
        sync.start();
        q8_gemv_loop<RD, XS == 2>(acc[0], ap, sp8, a, kci * sp.w * nbw, sp.w * nbw, i * nbw, nbw, sp.rt == 1,
                                  active, xsm, sync);
    } else if constexpr (RD > 0) {
        bool xl[NT];
#pragma unroll
        for (int n = 0; n < NT; n++) xl[n] = 8 * n + g < T;
        sync.start();
        if (active)
            q8_reg_loop<RD, NT>(acc, ap, sp8, xg, dg, (size_t)NB * 32, (size_t)NB * 8, nbw, xl, sync);
        else
            sync.wait();
    } else {
        sync.start();
        /* Weights never change: the first stages' weights (one group) are in flight before the predecessor is
         * done; their activations (one group per stage) after. Tile j's data is then complete once the groups
         * up to 1 + j (j < STG) or the refill group of iteration j - STG are: always the oldest but STG - 1.
         */
#pragma unroll
        for (int st = 0; st < STG; st++)
            if (active && st < nbw) {
                cp_async16(Q8_W(st), ap + st * 32);
                if (sw) cp_async4(Q8_S(st) + sl, sp8 + st * 8);
            }
        cp_async_commit();
        sync.wait();
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

        if constexpr (NT == 1) {
            /* Steps: the loop as first written. The form below measured slower here (H200, same run: plain
             * step 2.784 against 2.738 ms; with running pointers alone 2.84): a step's kernels wait on
             * memory, and the schedule the compiler makes of this form suits them. */
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
            /* 9..32 tokens: STG iterations at a time, so that every slot's shared-memory address is a
             * constant, and refills from running pointers. The per-tile address arithmetic was most of the
             * instructions (ncu: 189 a tile at 17..24 tokens); verify(17) 4.98 -> 4.66 ms, the draft's fc1 /
             * fc2 15.4 / 22.6
             * -> 14.2 / 21.9 us. */
            /* from one n-tile's activations to the next */
            const size_t xn = (size_t)NB * 32, dn = (size_t)NB * 8;
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
                    /* the slot is free once every lane has read it: other lanes refill the scales */
                    __syncwarp();
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
    }
#undef Q8_W
#undef Q8_S
#undef Q8_X
#undef Q8_D

    static_assert(!CL || MODE >= Q8_DSTORE, "clusters for the drafter's modes only (q8_cluster_off)");
    float *cs = CL ? (float *)(smem + q8_cluster_off(nwarps, NT, RD > 0)) : nullptr;
    /* The drafter's gated add reads the residual it adds to, the gate and the bias: loaded before the merge
     * by the warps that may store (with clusters block 0's only), so that their L2 round trip overlaps the
     * merge's barriers instead of following them. */
    q8_gate_in pre[MODE == Q8_DGATE ? NT : 1][4];
    if constexpr (MODE == Q8_DGATE)
        if (active && i == 0 && (!CL || kci == 0))
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const int row = tile * 16 + g + (j >> 1) * 8, t = 8 * n + 2 * c + (j & 1);
                    if (t < T && row < a.N) pre[n][j] = q8_gate_load(a, row, t);
                }
    const int fin = gemm_merge<NT, CL>(acc, sp, group, kci, red, cs);
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
            if (t >= T || row >= a.N) continue;
            if constexpr (MODE == Q8_DGATE)
                q8_out_gate(a, row, t, acc[n][j], pre[n][j]);
            else
                q8_out<MODE>(a, row, t, acc[n][j]);
        }
}

#endif
