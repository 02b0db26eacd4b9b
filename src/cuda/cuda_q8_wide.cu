/* cuda_q8_wide.cu: the Q8_0 product for more than 32 tokens in one launch (prefill chunks, the drafter's
 * context extension), on the int8 tensor cores.
 *
 * The narrow kernel (cuda_q8.cu) suits steps: one warp streams a tile row with deep per-warp prefetch, and a
 * launch takes at most 32 tokens, so a 256-token chunk read the weights 8 times. Here a block of 8 warps
 * computes 64 rows x 64 tokens (32 when the grid would not fill two blocks per SM): each stage brings 4
 * K-blocks of 4 weight tiles and the tokens' activation fragments into shared memory (cp.async, 4 stages),
 * and each warp multiplies its row tile by 4 (2) token groups with mma.m16n8k32, branch-free so that the
 * products and their f32 scaling interleave. Blocks of one row group over the token tiles are neighbours in
 * the grid, so the weights come from memory about once.
 *
 * Same results as the narrow kernel, bit for bit: a (row, token) walks K in order, and at the end of every
 * warp share of the matrix's split (nbw = K/32 / (w kc) blocks) folds its chain into the block sum, and the
 * block sums into the total, exactly as gemm_merge adds them (cuda_q8.cuh). */
#include "cuda/cuda_q8.cuh"

enum {
    QW_TILES = 4,  /* 16-row tiles per block: 64 rows (GLU: 32 gate + 32 up), one per warp row */
    QW_KB = 4,     /* 32-blocks of K per stage (2 with 4 stages: prefill 512 37.7 against 34.4 ms) */
    QW_STAGES = 4, /* stages in flight (3: prefill 512 32.2 against 31.5 ms) */
    QW_THREADS = 256,
};

/* A block: 8 warps, 4 rows of warps (a row tile each) x 2 columns (NTW token groups of 8 each), so 64 rows x
 * 16 NTW tokens. One stage: weight tiles [KB][TILES][512 B], their scale pairs [KB][TILES][8], activation
 * fragments [KB][NTB][256 B], their scales [KB][NTB][8] floats. After the stages, the threads' sums over the
 * blocks of the split ("tot", added once per block of the split, so kept out of the registers). */
template <int NTW> struct qw_shape {
    static constexpr int NTB = 2 * NTW, TOK = 8 * NTB;
    static constexpr int W = 0, WS = W + QW_KB * QW_TILES * 512, X = WS + QW_KB * QW_TILES * 32;
    static constexpr int XS = X + QW_KB * NTB * 256, STAGE = XS + QW_KB * NTB * 32;
    static constexpr int TOT = QW_STAGES * STAGE, SMEM = TOT + NTW * 4 * QW_THREADS * 4;
    static_assert(TOK * 64 * 4 <= TOT, "the GLU epilogue reuses the stages");
    static_assert(QW_KB * NTB * 2 <= 64 && QW_KB * QW_TILES * 2 <= 64,
                  "scale copies: threads 0..63, 64..127");
    static_assert((QW_KB * QW_TILES * 32) % QW_THREADS == 0 && (QW_KB * NTB * 16) % 128 == 0, "whole copies");
};

/* Tile of local row tile lt (0..3) of row group rb: 4 consecutive tiles, or for the GLU 2 gate tiles and the
 * 2 up tiles of the same 32 features (the narrow kernel's grouping). */
template <int MODE> __device__ __forceinline__ int qw_tile(int rb, int lt, int NT16) {
    if (MODE == Q8_GLU) return lt < 2 ? 2 * rb + lt : NT16 / 2 + 2 * rb + lt - 2;
    return 4 * rb + lt;
}

/* grid (token tiles, row groups of 64), QW_THREADS threads. */
template <int MODE, int NTW> __global__ void __launch_bounds__(QW_THREADS, 2) k_q8_wide(const q8_args a) {
    typedef qw_shape<NTW> S;
    extern __shared__ __align__(16) unsigned char smem[];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int wr = warp >> 1, wc = warp & 1; /* row tile wr; token groups NTW wc .. NTW wc + NTW - 1 */
    const int T = a.T, NB = a.K >> 5, NT16 = (a.N + 15) >> 4, rb = blockIdx.y;
    const int tok0 = blockIdx.x * S::TOK, n0 = blockIdx.x * S::NTB; /* first token, first token group */

    /* This thread's copies per stage, as running source pointers: 16-byte pieces of the weight tiles (WM per
     * thread, K-blocks WJ apart) and of the activations (XM, XJ apart; threads below XT), and one piece of
     * the activations' scales (threads below KB NTB 2) or of the weight scale pairs (64 .. 64 + KB TILES 2).
     * A piece of a K-block past NB, a tile past NT16 or a token group past T is zero-filled (read from
     * nowhere). */
    constexpr int WM = QW_KB * QW_TILES * 32 / QW_THREADS, WJ = QW_THREADS / (QW_TILES * 32);
    constexpr int XC = QW_KB * S::NTB * 16, XT = XC < QW_THREADS ? XC : QW_THREADS, XM = XC / XT;
    constexpr int XJ = XT / (S::NTB * 16);
    const int w_j = tid / (QW_TILES * 32), w_tile = qw_tile<MODE>(rb, (tid >> 5) & 3, NT16);
    const bool w_ok = w_tile < NT16;
    const int4 *w_src = a.qs + ((int64_t)(w_ok ? w_tile : 0) * NB + w_j) * 32 + lane;
    const int x_j = tid / (S::NTB * 16), x_n = (tid >> 4) % S::NTB;
    const bool x_ok = tid < XT && 8 * (n0 + x_n) < T;
    const int8_t *x_src = a.xq + (x_ok ? ((int64_t)(n0 + x_n) * NB + x_j) * 256 + (tid & 15) * 16 : 0);
    const bool d_thr = tid < QW_KB * S::NTB * 2, s_thr = tid >= 64 && tid < 64 + QW_KB * QW_TILES * 2;
    const int d_j = tid / (S::NTB * 2), d_n = (tid >> 1) % S::NTB;
    const bool d_ok = d_thr && 8 * (n0 + d_n) < T;
    const float *d_src = a.xd + (d_ok ? ((int64_t)(n0 + d_n) * NB + d_j) * 8 + (tid & 1) * 4 : 0);
    const int s_j = (tid - 64) >> 3, s_tile = qw_tile<MODE>(rb, ((tid - 64) >> 1) & 3, NT16);
    const bool s_ok = s_thr && s_tile < NT16;
    const uint32_t *s_src = a.sc + (s_ok ? ((int64_t)s_tile * NB + s_j) * 8 + (tid & 1) * 4 : 0);
    const int my_j = d_thr ? d_j : s_j; /* the K-block of this thread's scale piece */
    int next_b = 0;                     /* first K-block of the next stage to load */
    auto load = [&](int slot) {
        unsigned char *sb = smem + slot * S::STAGE;
#pragma unroll
        for (int m = 0; m < WM; m++) {
            const bool ok = w_ok && next_b + w_j + m * WJ < NB;
            cp_async16(sb + S::W + (tid + m * QW_THREADS) * 16, ok ? w_src + m * WJ * 32 : a.qs, ok ? 16 : 0);
        }
        if (tid < XT)
#pragma unroll
            for (int m = 0; m < XM; m++) {
                const bool ok = x_ok && next_b + x_j + m * XJ < NB;
                cp_async16(sb + S::X + (tid + m * XT) * 16, ok ? x_src + m * XJ * 256 : a.xq, ok ? 16 : 0);
            }
        const bool sc_ok = next_b + my_j < NB;
        if (d_thr) cp_async16(sb + S::XS + tid * 16, sc_ok && d_ok ? d_src : a.xd, sc_ok && d_ok ? 16 : 0);
        if (s_thr)
            cp_async16(sb + S::WS + (tid - 64) * 16, sc_ok && s_ok ? s_src : a.sc, sc_ok && s_ok ? 16 : 0);
        w_src += QW_KB * 32, x_src += QW_KB * 256, d_src += QW_KB * 8, s_src += QW_KB * 8;
        next_b += QW_KB;
    };

    pdl_trigger();
    pdl_wait();
    const int nst = (NB + QW_KB - 1) / QW_KB;
#pragma unroll
    for (int st = 0; st < QW_STAGES - 1; st++) {
        if (st < nst) load(st);
        cp_async_commit();
    }

    /* acc: the chain of the current warp share; blk: the shares of the current block of the split added in
     * order; tot (shared memory, [NTW * 4][threads]): the blocks' sums added in order. */
    float acc[NTW][4], blk[NTW][4];
    float *tot = (float *)(smem + S::TOT) + tid;
#pragma unroll
    for (int n = 0; n < NTW; n++)
#pragma unroll
        for (int k = 0; k < 4; k++) acc[n][k] = blk[n][k] = 0.0f;
    const int sw = a.sp.w, nbw = NB / (sw * a.sp.kc);
    int left = nbw, share = 0; /* blocks left in the current warp share; its index in its block */
    bool first_blk = true;

    const int a_off = wr * 512 + lane * 16, s_off = wr * 32 + g * 4;
    const int x_off = NTW * wc * 256 + lane * 8, d_off = NTW * wc * 32 + c * 8;
    for (int it = 0; it < nst; it++) {
        cp_async_wait<QW_STAGES - 2>();
        __syncthreads(); /* stage it is complete for all, and slot (it - 1) is free */
        if (it + QW_STAGES - 1 < nst) load((it + QW_STAGES - 1) % QW_STAGES);
        cp_async_commit();
        const unsigned char *sb = smem + (it % QW_STAGES) * S::STAGE;
#pragma unroll
        for (int j = 0; j < QW_KB; j++) {
            /* Branch-free, so that the compiler interleaves the products and their scaling. A K-block past
             * NB (odd NB) is all zeros: its terms are fma(0, 0, acc) = acc (a chain is never -0). Token
             * groups past T are zeros too and never stored. */
            const int4 A = *(const int4 *)(sb + S::W + j * QW_TILES * 512 + a_off);
            const uint32_t SW = *(const uint32_t *)(sb + S::WS + j * QW_TILES * 32 + s_off);
            const float dw0 = half_lo(SW), dw1 = half_hi(SW);
            uint2 xv[NTW];
            float2 dx[NTW];
            int d[NTW][4];
#pragma unroll
            for (int n = 0; n < NTW; n++) {
                xv[n] = *(const uint2 *)(sb + S::X + (j * S::NTB + n) * 256 + x_off);
                dx[n] = *(const float2 *)(sb + S::XS + (j * S::NTB + n) * 32 + d_off);
            }
#pragma unroll
            for (int n = 0; n < NTW; n++) mma_s8(d[n], A, xv[n].x, xv[n].y);
#pragma unroll
            for (int n = 0; n < NTW; n++) q8_scale_add<2>(acc[n], d[n], dw0, dw1, dx[n]);
            if (it * QW_KB + j < NB && --left == 0) { /* the end of a warp share: fold as gemm_merge */
                left = nbw;
                const bool last = share == sw - 1;
#pragma unroll
                for (int n = 0; n < NTW; n++)
#pragma unroll
                    for (int k = 0; k < 4; k++) {
                        const float v = share == 0 ? acc[n][k] : __fadd_rn(blk[n][k], acc[n][k]);
                        if (last)
                            tot[(n * 4 + k) * QW_THREADS] =
                                first_blk ? v : __fadd_rn(tot[(n * 4 + k) * QW_THREADS], v);
                        else
                            blk[n][k] = v;
                        acc[n][k] = 0.0f;
                    }
                if (last)
                    share = 0, first_blk = false;
                else
                    share++;
            }
        }
    }
    cp_async_wait<0>();

    if constexpr (MODE == Q8_GLU) {
        /* [TOK tokens][64 local rows: 32 gate, 32 up] in the freed stages, then one warp per token */
        float *gb = (float *)smem;
        __syncthreads();
#pragma unroll
        for (int n = 0; n < NTW; n++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                gb[(8 * (NTW * wc + n) + 2 * c + (k & 1)) * 64 + wr * 16 + g + (k >> 1) * 8] =
                    tot[(n * 4 + k) * QW_THREADS];
        __syncthreads();
        for (int tl = warp; tl < S::TOK && tok0 + tl < T; tl += QW_THREADS / 32)
            q8_glu_out(a, tok0 + tl, rb, a.N / 64, gb[tl * 64 + lane], gb[tl * 64 + 32 + lane]);
    } else {
        const int row0 = qw_tile<MODE>(rb, wr, NT16) * 16 + g;
#pragma unroll
        for (int n = 0; n < NTW; n++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int row = row0 + (k >> 1) * 8, t = tok0 + 8 * (NTW * wc + n) + 2 * c + (k & 1);
                if (t < T && row < a.N) q8_out<MODE>(a, row, t, tot[(n * 4 + k) * QW_THREADS]);
            }
    }
}

#define QW_MODES(X) X(Q8_STORE) X(Q8_ADD) X(Q8_GLU) X(Q8_DSTORE) X(Q8_DGELU) X(Q8_DGATE)

int q8_wide_init(void) {
    int bad = 0;
#define X(m)                                                                                                 \
    bad |= cudaFuncSetAttribute(k_q8_wide<m, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,                \
                                qw_shape<2>::SMEM) != cudaSuccess;                                           \
    bad |= cudaFuncSetAttribute(k_q8_wide<m, 4>, cudaFuncAttributeMaxDynamicSharedMemorySize,                \
                                qw_shape<4>::SMEM) != cudaSuccess;
    QW_MODES(X)
#undef X
    return bad ? -1 : 0;
}

/* 64 tokens a block when that still gives two blocks per SM, else 32 (the same results either way). */
void q8_wide_run(const fmc_q8 *w, const q8_args &a, int mode, int pdl, cudaStream_t s) {
    const unsigned groups = (unsigned)((w->N + 15) / 16 + QW_TILES - 1) / QW_TILES;
    const bool big = groups * (unsigned)((a.T + 63) / 64) >= 2 * (unsigned)fmc_sm_count();
    const dim3 grid((unsigned)((a.T + (big ? 63 : 31)) / (big ? 64 : 32)), groups);
#define X(m)                                                                                                 \
    if (mode == m) {                                                                                         \
        if (big)                                                                                             \
            fmc_launch(k_q8_wide<m, 4>, grid, dim3(QW_THREADS), (size_t)qw_shape<4>::SMEM, s, pdl, a);       \
        else                                                                                                 \
            fmc_launch(k_q8_wide<m, 2>, grid, dim3(QW_THREADS), (size_t)qw_shape<2>::SMEM, s, pdl, a);       \
    }
    QW_MODES(X)
#undef X
}
