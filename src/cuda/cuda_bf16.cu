/* cuda_bf16.cu: the drafter's BF16 weights on the GPU: the tiled layout (see cuda_kernels.cuh) and the
 * matrix product for 1..32 tokens per launch on the bf16 tensor cores (mma m16n8k16, f32 accumulation).
 *
 * f32 activations are split into bf16 hi = bf16(x) and lo = bf16(x - hi), two products per tile: each term
 * keeps ~16 mantissa bits of x (as the CPU's AVX512-BF16 kernel does), the products of two bf16 are exact
 * and the sums are f32. The work split, the cp.async pipeline and the merge of partial sums are the Q8_0
 * product's (cuda_gemm.cuh), so results are deterministic. Epilogues: + bias, then store, GELU, or the
 * drafter's gated residual add x += gate * v. */
#include "cuda/cuda_gemm.cuh"

enum { BF_SMEM_LIMIT = 200 * 1024 };

void fmc_bf16_bytes(int N, int K, size_t *bytes) {
    *bytes = (size_t)((N + 15) / 16) * (K / 16) * 512;
}

/* One thread per (tile, lane): a0..a3 = rows g, g+8 x k 2c, 2c+1, then 8+2c, 8+2c+1 (low half first). */
__global__ void k_repack_bf16(const uint16_t *rows, int N, int K, int64_t total, uint4 *out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int lane = (int)(i & 31), g = lane >> 2, c = lane & 3, NKB = K / 16;
    const int64_t tile = i >> 5;
    const int rt = (int)(tile / NKB), kb = (int)(tile % NKB);
    uint32_t w[4];
    for (int reg = 0; reg < 4; reg++) {
        const int r = rt * 16 + g + ((reg & 1) ? 8 : 0), k = kb * 16 + ((reg & 2) ? 8 : 0) + 2 * c;
        w[reg] =
            r < N ? (uint32_t)rows[(int64_t)r * K + k] | (uint32_t)rows[(int64_t)r * K + k + 1] << 16 : 0;
    }
    out[i] = make_uint4(w[0], w[1], w[2], w[3]);
}

void fmc_bf16_repack(const void *rows, int N, int K, uint4 *w_out, fmc_bf16 *w, cudaStream_t s) {
    const int NKB = K / 16, NT16 = (N + 15) / 16;
    const int64_t total = (int64_t)NT16 * NKB * 32;
    k_repack_bf16<<<(unsigned)((total + 255) / 256), 256, 0, s>>>((const uint16_t *)rows, N, K, total, w_out);
    w->w = w_out;
    w->N = N;
    w->K = K;
    gemm_plan(&w->sp, NKB, NT16, 0, 4); /* 4-warp blocks of ~50 KB at 9..16 tokens: 4 per SM */
}

struct bf_args {
    const uint4 *w;
    int N, K, T;
    fmc_split sp;
    const float *x;
    int ldx;
    const float *bias;
    float *y;
    int ldy;
    const float *gate;
};

__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint4 &a, uint32_t b0, uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1));
#else
    __trap(); /* the backend refuses devices below compute capability 8.0 */
#endif
}

__device__ __forceinline__ uint32_t pack_bf16(float lo_k, float hi_k) {
    const __nv_bfloat162 p = __floats2bfloat162_rn(lo_k, hi_k);
    return *(const uint32_t *)&p;
}

/* (x0, x1) -> bf16 pairs hi and lo = x - hi. */
__device__ __forceinline__ void split_bf16(float2 x, uint32_t *hi, uint32_t *lo) {
    const __nv_bfloat16 h0 = __float2bfloat16_rn(x.x), h1 = __float2bfloat16_rn(x.y);
    const __nv_bfloat162 hp = __halves2bfloat162(h0, h1);
    *hi = *(const uint32_t *)&hp;
    *lo = pack_bf16(x.x - __bfloat162float(h0), x.y - __bfloat162float(h1));
}

/* Bytes of one pipeline stage of a warp: the tile (512) and, per 8-token n-tile, each lane's two f32 pairs of
 * its token (32 x 16). */
__host__ __device__ constexpr int bf_stage_bytes(int NT) {
    return 512 + 512 * NT;
}

/* grid: groups x kc blocks of w warps (fmc_split, rt = 1). */
template <int NT, int MODE> __global__ void __launch_bounds__(256) k_bf16_gemm(const bf_args a) {
    constexpr int STG = gemm_stages(NT), SB = bf_stage_bytes(NT);
    extern __shared__ __align__(16) unsigned char smem[];
    const fmc_split sp = a.sp;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = sp.rt * sp.w;
    const int g = lane >> 2, c = lane & 3, T = a.T;
    const int NKB = a.K >> 4, NT16 = (a.N + 15) >> 4;
    const int group = blockIdx.x / sp.kc, kci = blockIdx.x - group * sp.kc, tile = group;
    const bool active = tile < NT16;
    const int nbw = NKB / (sp.w * sp.kc), b0 = (kci * sp.w + warp) * nbw;
    const uint4 *ap = a.w + ((int64_t)tile * NKB + b0) * 32 + lane;
    unsigned char *wb = smem + (size_t)warp * STG * SB;
    float *red = (float *)(smem + (size_t)nwarps * STG * SB);
#define BF_W(st) ((uint4 *)(wb + (st)*SB) + lane)
#define BF_X(st, n) ((float4 *)(wb + (st)*SB + 512) + (n)*32 + lane)
    /* Token 8n + g's pairs (k0 + 2c, +1) and (k0 + 8 + 2c, +1) of block j; rows past T are zero-filled. */
    auto load_x = [&](int st, int j) {
#pragma unroll
        for (int n = 0; n < NT; n++) {
            const int tb = 8 * n + g, ok = tb < T ? 8 : 0;
            const float *xr = a.x + (size_t)(ok ? tb : 0) * a.ldx + (b0 + j) * 16 + 2 * c;
            float2 *dst = (float2 *)BF_X(st, n);
            cp_async8(dst, xr, ok);
            cp_async8(dst + 1, xr + 8, ok);
        }
    };

    pdl_trigger();
#pragma unroll
    for (int st = 0; st < STG; st++)
        if (active && st < nbw) cp_async16(BF_W(st), ap + st * 32);
    cp_async_commit();
    pdl_wait();
#pragma unroll
    for (int st = 0; st < STG; st++) {
        if (active && st < nbw) load_x(st, st);
        cp_async_commit();
    }

    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int it = 0; it < nbw; it++) {
        const int slot = it % STG;
        cp_async_wait<STG - 1>();
        if (active) {
            const uint4 A = *BF_W(slot);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const float4 xv = *BF_X(slot, n);
                uint32_t h0, h1, l0, l1;
                split_bf16(make_float2(xv.x, xv.y), &h0, &l0);
                split_bf16(make_float2(xv.z, xv.w), &h1, &l1);
                mma_bf16(acc[n], A, h0, h1);
                mma_bf16(acc[n], A, l0, l1);
            }
            const int nx = it + STG;
            if (nx < nbw) cp_async16(BF_W(slot), ap + nx * 32), load_x(slot, nx);
        }
        cp_async_commit();
    }
    cp_async_wait<0>();
#undef BF_W
#undef BF_X

    const int fin = gemm_merge<NT>(acc, sp, group, kci, red);
    if (fin <= 0 || !active) return;
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int row = tile * 16 + g + (j >> 1) * 8, t = 8 * n + 2 * c + (j & 1);
            if (t >= T || row >= a.N) continue;
            float v = acc[n][j];
            if (a.bias) v += a.bias[row];
            float *o = a.y + (size_t)t * a.ldy + row;
            if (MODE == FMC_BF16_GELU)
                *o = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
            else if (MODE == FMC_BF16_GATE_ADD)
                *o = ld_cg(o) + a.gate[row] * v;
            else
                *o = v;
        }
}

#define BF_KERNELS(X)                                                                                        \
    X(1, 0) X(2, 0) X(3, 0) X(4, 0) X(1, 1) X(2, 1) X(3, 1) X(4, 1) X(1, 2) X(2, 2) X(3, 2) X(4, 2)

typedef void (*bf_kernel)(const bf_args);

static bf_kernel bf_pick(int NT, int mode) {
#define X(nt, m)                                                                                             \
    if (NT == nt && mode == m) return k_bf16_gemm<nt, m>;
    BF_KERNELS(X)
#undef X
    return NULL;
}

int fmc_bf16_init(void) {
    int bad = 0;
#define X(nt, m)                                                                                             \
    bad |= cudaFuncSetAttribute(k_bf16_gemm<nt, m>, cudaFuncAttributeMaxDynamicSharedMemorySize,             \
                                BF_SMEM_LIMIT) != cudaSuccess;
    BF_KERNELS(X)
#undef X
    return bad ? -1 : 0;
}

void fmc_bf16_matmul(const fmc_bf16 *w, const float *x, int ldx, int T, float *y, int ldy, const float *bias,
                     int mode, const float *gate, int pdl, cudaStream_t s) {
    const unsigned groups = (unsigned)((w->N + 15) / 16);
    for (int t0 = 0; t0 < T; t0 += GEMM_MAX_TOK) {
        const int n = T - t0 < GEMM_MAX_TOK ? T - t0 : GEMM_MAX_TOK, NT = (n + 7) / 8;
        bf_args a;
        a.w = w->w, a.N = w->N, a.K = w->K, a.T = n, a.sp = w->sp;
        a.x = x + (size_t)t0 * ldx, a.ldx = ldx, a.bias = bias, a.y = y + (size_t)t0 * ldy, a.ldy = ldy;
        a.gate = gate;
        const unsigned blocks = groups * w->sp.kc;
        const size_t smem =
            fmc_gemm_spread((size_t)w->sp.w * (gemm_stages(NT) * bf_stage_bytes(NT) + NT * 4 * 32 * 4),
                            blocks, BF_SMEM_LIMIT);
        fmc_launch(bf_pick(NT, mode), dim3(blocks), dim3(w->sp.w * 32), smem, s, pdl && T <= GEMM_MAX_TOK, a);
    }
}
