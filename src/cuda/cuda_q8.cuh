/* cuda_q8.cuh: what the two Q8_0 product kernels share: the narrow one for 1..32 tokens per launch
 * (cuda_q8.cu: steps, verify blocks, drafts) and the wide one for more (cuda_q8_wide.cu: prefill, the
 * drafter's context extension). Both compute each (row, token) with the same f32 operations in the same
 * order, fixed by the matrix's split (fmc_split), so a prompt's rows equal single steps bit for bit: per
 * 32-block acc = fma(isum, dw * dx, acc) along a warp's K share from 0, the w shares of a block added in
 * order, then the kc blocks' sums in order. The element-wise epilogues below are the one copy both use. */
#ifndef FM_CUDA_Q8_CUH
#define FM_CUDA_Q8_CUH

#include "cuda/cuda_gemm.cuh"

/* Q8_D*: the drafter's epilogues (fmc_q8_dmatmul): + bias, then store, GELU or the gated add. */
enum { Q8_STORE = 0, Q8_ADD = 1, Q8_GLU = 2, Q8_DSTORE = 3, Q8_DGELU = 4, Q8_DGATE = 5 };
enum { Q8_WARPS = 8, Q8_THREADS = 256, Q8_SMEM_LIMIT = 200 * 1024 };

struct q8_args {
    const int4 *qs;
    const uint32_t *sc;
    int N, K, T;
    fmc_split sp;
    const int8_t *xq; /* fragment order */
    const float *xd;
    float *y;
    int ldy;
    float *y2;
    int ldy2;
    int8_t *oq; /* GLU output, fragment order */
    float *od;
    const float *bias, *gate; /* Q8_D* modes */
};

__device__ __forceinline__ void mma_s8(int (&d)[4], const int4 &a, uint32_t b0, uint32_t b1) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
    asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%10,%10,%10};"
        : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
        : "r"(a.x), "r"(a.y), "r"(a.z), "r"(a.w), "r"(b0), "r"(b1), "r"(0));
#else
    d[0] = d[1] = d[2] = d[3] = 0;
    __trap(); /* the backend refuses devices below compute capability 8.0 */
#endif
}

__device__ __forceinline__ float half_lo(uint32_t s) {
    return __half2float(__ushort_as_half((unsigned short)(s & 0xffff)));
}
__device__ __forceinline__ float half_hi(uint32_t s) {
    return __half2float(__ushort_as_half((unsigned short)(s >> 16)));
}

/* (float)d for a block's int32 dot (|d| <= 32 * 128 * 128 < 2^22), exactly, by an integer add and an exact
 * f32 subtraction: two issue slots on the 64- and 128-lane pipes, where the int-to-float conversion takes one
 * slot on a unit of 16 lanes a clock per SM (sm_80/90). */
__device__ __forceinline__ float i2f_exact(int d) {
    return __fsub_rn(__int_as_float(d + 0x4B400000), 12582912.0f);
}

/* acc += d * (dw * dx) for the four results of one mma: rows g, g + 8 (dw0, dw1) x tokens 2c, 2c + 1. CVT of
 * the four conversions go through the conversion unit, the others through i2f_exact (the same values). The
 * wide kernel is bound by issue slots and takes 2 (prefill 512 on the H200 33.1 -> 32.2 ms); the narrow one
 * all 4 (with none, verify(17) measured 5.09-5.13 against 5.01 ms). */
template <int CVT>
__device__ __forceinline__ void q8_scale_add(float (&acc)[4], const int (&d)[4], float dw0, float dw1,
                                             float2 dx) {
    const float f0 = CVT > 0 ? (float)d[0] : i2f_exact(d[0]), f1 = CVT > 2 ? (float)d[1] : i2f_exact(d[1]);
    const float f2 = CVT > 1 ? (float)d[2] : i2f_exact(d[2]), f3 = CVT > 3 ? (float)d[3] : i2f_exact(d[3]);
    acc[0] = __fmaf_rn(f0, __fmul_rn(dw0, dx.x), acc[0]);
    acc[1] = __fmaf_rn(f1, __fmul_rn(dw0, dx.y), acc[1]);
    acc[2] = __fmaf_rn(f2, __fmul_rn(dw1, dx.x), acc[2]);
    acc[3] = __fmaf_rn(f3, __fmul_rn(dw1, dx.y), acc[3]);
}

/* q8_scale_add<4>'s acc[0] and acc[2] only, with the scale pair s (half_lo, half_hi): token 0's two rows,
 * where a one-token product never stores the other column (the same bits as q8_scale_add for those two). */
__device__ __forceinline__ void q8_scale_add_t0(float (&acc)[4], const int (&d)[4], uint32_t s, float dx0) {
    acc[0] = __fmaf_rn((float)d[0], __fmul_rn(half_lo(s), dx0), acc[0]);
    acc[2] = __fmaf_rn((float)d[2], __fmul_rn(half_hi(s), dx0), acc[2]);
}

/* v into (row, token t) of the output, and of its copy y2 when there is one. */
__device__ __forceinline__ void q8_put(const q8_args &a, int row, int t, float v) {
    a.y[(size_t)t * a.ldy + row] = v;
    if (a.y2) a.y2[(size_t)t * a.ldy2 + row] = v;
}
/* What Q8_DGATE's output (row, t) reads besides its sum: the value it adds to, the gate and the bias. */
struct q8_gate_in {
    float old, gate, bias;
};
__device__ __forceinline__ q8_gate_in q8_gate_load(const q8_args &a, int row, int t) {
    return {ld_cg(a.y + (size_t)t * a.ldy + row), a.gate[row], a.bias ? a.bias[row] : 0.0f};
}
/* Q8_DGATE's epilogue (as fmc_bf16_matmul's) from what q8_gate_load read, earlier or just before. */
__device__ __forceinline__ void q8_out_gate(const q8_args &a, int row, int t, float v, const q8_gate_in &g) {
    if (a.bias) v = __fadd_rn(v, g.bias);
    a.y[(size_t)t * a.ldy + row] = __fmaf_rn(g.gate, v, g.old);
}

/* The final value v of (row, token t) of a non-GLU mode into its output. */
template <int MODE> __device__ __forceinline__ void q8_out(const q8_args &a, int row, int t, float v) {
    if (MODE == Q8_DGATE) {
        q8_out_gate(a, row, t, v, q8_gate_load(a, row, t));
        return;
    }
    float *o = a.y + (size_t)t * a.ldy + row;
    if (MODE >= Q8_DSTORE) { /* as fmc_bf16_matmul's epilogues */
        if (a.bias) v = __fadd_rn(v, a.bias[row]);
        *o = MODE == Q8_DGELU ? 0.5f * v * (1.0f + erff(v * 0.70710678118654752f)) : v;
        return;
    }
    if (MODE == Q8_ADD) v = __fadd_rn(ld_cg(o), v);
    q8_put(a, row, t, v);
}

/* GLU: one warp, token t, features 32 fb + lane (gate value gv, up value uv): silu(gv) * uv quantised to
 * Q8_0 into a.oq / a.od (fragment order, FB = F/32 blocks). */
__device__ __forceinline__ void q8_glu_out(const q8_args &a, int t, int fb, int FB, float gv, float uv) {
    const int lane = threadIdx.x & 31;
    const float v = gv / (1.0f + expf(-gv)) * uv;
    float d;
    a.oq[frag_off(t, fb * 32 + lane, FB)] = quant_lane(v, &d);
    if (lane == 0) a.od[frag_d(t, fb, FB)] = d;
}

/* Where the quantiser (q8_quant_row) puts a 32-block's words of quants (word m: its values 4m .. 4m + 3)
 * and its scale d: token t of xq / xd in fragment order (cuda_kernels.cuh), NB blocks a row; the
 * quantiser's block b is the row's b0 + b (a part of a row). */
struct q8_frag_sink {
    int8_t *xq;
    float *xd;
    int t, NB, b0 = 0;
    __device__ __forceinline__ void word(int b, int m, uint32_t q) const {
        *(uint32_t *)(xq + frag_off(t, (b0 + b) * 32 + 4 * m, NB)) = q;
    }
    __device__ __forceinline__ void scale(int b, float d) const { xd[frag_d(t, b0 + b, NB)] = d; }
};

/* Where the quantiser reads x and the norm weights: straight from global memory (x through L2: the
 * persistent kernel's other blocks write it); cuda_megakernel.cu stages them in shared memory. */
struct q8_src_global {
    const float *x, *nw;
    __device__ __forceinline__ bool norm() const { return nw != nullptr; }
    __device__ __forceinline__ float4 first(int j) const { return ld_cg4(x + 4 * j); } /* the sum's pass */
    __device__ __forceinline__ float4 x4(int i) const { return ld_cg4(x + i); }
    __device__ __forceinline__ float4 w4(int i) const { return __ldg((const float4 *)(nw + i)); }
};

/* One token of x (f32 [K], from src): RMSNorm with weight nw (when src.norm(); double sum of squares,
 * per-thread partials over a fixed float4 stride, the warp butterfly, then the 8 warps in order), then
 * ggml's Q8_0 quantisation of each 32-block by 8 lanes (quant_lanes8: a warp takes 4 blocks at a time; one
 * thread a block left 176 of 256 threads idle behind a 32-step max chain), into out. Called by Q8_THREADS
 * threads (threadIdx.x < Q8_THREADS) that bar synchronises; ends with them synchronised. */
template <class SRC, class SINK, class BAR>
__device__ __forceinline__ void q8_quant_row_src(const SRC &src, float eps, int K, const SINK &out,
                                                 const BAR &bar) {
    __shared__ double part[Q8_WARPS];
    const int tid = threadIdx.x, NB = K >> 5;
    float r = 1.0f;
    if (src.norm()) {
        double ss = 0;
#pragma unroll 4
        for (int j = tid; j < K / 4; j += Q8_THREADS) {
            const float4 v = src.first(j);
            ss += (double)v.x * v.x;
            ss += (double)v.y * v.y;
            ss += (double)v.z * v.z;
            ss += (double)v.w * v.w;
        }
        ss = warp_sum_d(ss);
        if ((tid & 31) == 0) part[tid >> 5] = ss;
        bar.sync();
        double tot = 0;
        for (int w = 0; w < Q8_WARPS; w++) tot += part[w];
        r = (float)(1.0 / sqrt(tot / (double)K + (double)eps));
    }
    const int sub = tid & 7; /* the lane's word of its block */
    for (int b0 = (tid >> 5) * 4; b0 < NB; b0 += Q8_THREADS / 8) {
        const int b = b0 + ((tid & 31) >> 3);
        float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (b < NB) {
            const float4 xv = src.x4(b * 32 + 4 * sub);
            v[0] = __fmul_rn(xv.x, r), v[1] = __fmul_rn(xv.y, r);
            v[2] = __fmul_rn(xv.z, r), v[3] = __fmul_rn(xv.w, r);
            if (src.norm()) {
                const float4 wv = src.w4(b * 32 + 4 * sub);
                v[0] = __fmul_rn(v[0], wv.x), v[1] = __fmul_rn(v[1], wv.y);
                v[2] = __fmul_rn(v[2], wv.z), v[3] = __fmul_rn(v[3], wv.w);
            }
        }
        uint32_t q;
        const float d = quant_lanes8(v, &q);
        if (b < NB) {
            out.word(b, sub, q);
            if (sub == 0) out.scale(b, d);
        }
    }
    bar.sync();
}
template <class SINK, class BAR>
__device__ __forceinline__ void q8_quant_row(const float *x, const float *nw, float eps, int K,
                                             const SINK &out, const BAR &bar) {
    q8_quant_row_src(q8_src_global{x, nw}, eps, K, out, bar);
}

/* The wide kernel (cuda_q8_wide.cu): the whole product of a.T (> 32) tokens in one launch. */
void q8_wide_run(const fmc_q8 *w, const q8_args &a, int mode, int pdl, cudaStream_t s);
int q8_wide_init(void);

#endif
