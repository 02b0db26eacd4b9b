/* cuda_attn.cuh: what the two attention kernels share: the split kernel for steps and verify blocks
 * (cuda_attn.cu) and the one-pass kernel for prefill chunks (cuda_attn_prefill.cu). Shared-memory tiles of a
 * block: K [64 keys][hd/2 + 4] half2 words, V [64][hd + 8] halves, the block's queries as two f16 parts
 * [2][QROWS][hd + 8] (the pads spread a fragment's rows over all banks); query i of a block sits in row
 * i % 16 of warp i / 16's tile.
 *
 * Both kernels give the same bits for a (row, head): each computes every 64-key split's partial (max m_s,
 * sum l_s, output O_s) from zero with the same code, and folds the partials in split order with
 * attn_fold_weights; the split kernel writes them out and its merge folds them, the one-pass kernel folds
 * them in registers as it walks the keys. The arithmetic is pinned (__fmul_rn, __fmaf_rn, ...) so that the
 * compiler cannot contract it differently in the two kernels. So a prompt's KV rows are the same whatever
 * chunk, verify block or step computed them, which the server's prompt cache relies on. */
#ifndef FM_CUDA_ATTN_CUH
#define FM_CUDA_ATTN_CUH

#include "cuda/cuda_device.cuh"
#include "cuda/cuda_kernels.cuh"

#include <type_traits>

__device__ __forceinline__ void mma_f16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                        uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t *)&h;
}

/* x = hi + lo with hi = f16(x), lo = f16(x - hi): two f16 operands that carry about 22 bits of x, so the
 * tensor-core products keep nearly f32 accuracy (the keys and values are f16 already). */
__device__ __forceinline__ void split_half2(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    const __half2 h = __floats2half2_rn(x0, x1);
    const float2 hf = __half22float2(h);
    *hi = *(const uint32_t *)&h;
    *lo = pack_half2(x0 - hf.x, x1 - hf.y);
}

/* Queries [0, nrows) of the block (rows past nq zeroed) into Qs as hi / lo parts. Query i is head
 * g G + i % G of row tb + i / G of q [T][n_heads][HD]. All threads of the block take part. */
template <int HD, int QROWS>
__device__ __forceinline__ void attn_load_q(const float *q, __half *Qs, int tb, int g, int G, int n_heads,
                                            int nrows, int nq) {
    constexpr int QP = HD + 8, C8N = HD / 8;
    for (int idx = threadIdx.x; idx < nrows * C8N; idx += blockDim.x) {
        const int i = idx / C8N, c8 = idx - i * C8N;
        uint4 h = make_uint4(0, 0, 0, 0), l = h;
        if (i < nq) {
            const float *src = q + ((size_t)(tb + i / G) * n_heads + g * G + i % G) * HD + c8 * 8;
            const float4 x0 = ld_cg4(src), x1 = ld_cg4(src + 4);
            split_half2(x0.x, x0.y, &h.x, &l.x), split_half2(x0.z, x0.w, &h.y, &l.y);
            split_half2(x1.x, x1.y, &h.z, &l.z), split_half2(x1.z, x1.w, &h.w, &l.w);
        }
        *(uint4 *)(Qs + i * QP + c8 * 8) = h;
        *(uint4 *)(Qs + (QROWS + i) * QP + c8 * 8) = l;
    }
}

/* S = Q K^T for the warp's 16 queries x the 64 keys in Ks: 8 tiles of 8 keys; the B fragment of key tile n
 * is K rows n * 8 + gr, dims 16 k + 2c.. (both parts of q, f32 accumulation). */
template <int HD, int QROWS>
__device__ __forceinline__ void attn_scores(const __half *Qs, const uint32_t *Ks, int warp, int lane,
                                            float (&sc)[8][4]) {
    constexpr int KP = HD / 2 + 4, QP = HD + 8;
    const int gr = lane >> 2, c = lane & 3;
#pragma unroll
    for (int n = 0; n < 8; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
    const __half *qa = Qs + (warp * 16 + gr) * QP + 2 * c;
#pragma unroll
    for (int k = 0; k < HD / 16; k++)
#pragma unroll
        for (int part = 0; part < 2; part++) {
            const __half *qp = qa + part * QROWS * QP + 16 * k;
            const uint32_t a0 = *(const uint32_t *)qp, a1 = *(const uint32_t *)(qp + 8 * QP),
                           a2 = *(const uint32_t *)(qp + 8), a3 = *(const uint32_t *)(qp + 8 * QP + 8);
#pragma unroll
            for (int n = 0; n < 8; n++) {
                const uint32_t *kb = Ks + (n * 8 + gr) * KP + 8 * k + c;
                mma_f16(sc[n], a0, a1, a2, a3, kb[0], kb[4]);
            }
        }
}

/* The softmax pieces of one of the lane's two query rows (u: tile row gr or gr + 8) over the 64 keys of sc,
 * whose scores sit in one lane quad: scores past the row's first nk keys masked, the others scaled; *mx =
 * the row's maximum over the quad; then sc = exp(score - *mx) (0 where masked) and their sum over the quad
 * is returned, in a fixed order. */
__device__ __forceinline__ float attn_softmax_row(float (&sc)[8][4], int u, int nk, float scale, int c,
                                                  float *mx) {
    float m = -INFINITY;
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float v = n * 8 + 2 * c + e < nk ? __fmul_rn(sc[n][2 * u + e], scale) : -INFINITY;
            sc[n][2 * u + e] = v;
            m = fmaxf(m, v);
        }
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const float v = sc[n][2 * u + e];
            const float p = v == -INFINITY ? 0.0f : expf(__fsub_rn(v, m));
            sc[n][2 * u + e] = p;
            sum = __fadd_rn(sum, p);
        }
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
    *mx = m;
    return sum;
}

/* One step of the fold of a row's splits, in split order: the running max *M and sum *L (-inf and 0 before
 * the first split) take split (m_s, l_s); the running output then becomes attn_fold(o, O_s, a, b) with the
 * returned weights a (of the old output) and b (of the split's). */
__device__ __forceinline__ float2 attn_fold_weights(float *M, float *L, float m_s, float l_s) {
    const float mn = fmaxf(*M, m_s);
    const float a = expf(__fsub_rn(*M, mn)), b = expf(__fsub_rn(m_s, mn)); /* a = 0 at the first split */
    *L = __fmaf_rn(l_s, b, __fmul_rn(*L, a));
    *M = mn;
    return make_float2(a, b);
}
__device__ __forceinline__ float attn_fold(float o, float o_s, float2 w) {
    return __fmaf_rn(o_s, w.y, __fmul_rn(o, w.x));
}

/* o += P V for the warp's 16 queries: P's score tiles 2k, 2k + 1 (probabilities, as two f16 parts) are the A
 * fragment of key step k; V by ldmatrix.trans. */
template <int HD>
__device__ __forceinline__ void attn_pv(const float (&sc)[8][4], const __half *Vs, int lane,
                                        float (&o)[HD / 8][4]) {
    constexpr int VP = HD + 8;
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t ah[4], al[4];
        split_half2(sc[2 * k][0], sc[2 * k][1], &ah[0], &al[0]);
        split_half2(sc[2 * k][2], sc[2 * k][3], &ah[1], &al[1]);
        split_half2(sc[2 * k + 1][0], sc[2 * k + 1][1], &ah[2], &al[2]);
        split_half2(sc[2 * k + 1][2], sc[2 * k + 1][3], &ah[3], &al[3]);
        const __half *vrow = Vs + (16 * k + ((lane >> 3) & 1) * 8 + (lane & 7)) * VP + (lane >> 4) * 8;
#pragma unroll
        for (int n = 0; n < HD / 16; n++) {
            uint32_t b0, b1, b2, b3;
            asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                         : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                         : "r"((unsigned)__cvta_generic_to_shared(vrow + 16 * n)));
            mma_f16(o[2 * n], ah[0], ah[1], ah[2], ah[3], b0, b1);
            mma_f16(o[2 * n], al[0], al[1], al[2], al[3], b0, b1);
            mma_f16(o[2 * n + 1], ah[0], ah[1], ah[2], ah[3], b2, b3);
            mma_f16(o[2 * n + 1], al[0], al[1], al[2], al[3], b2, b3);
        }
    }
}

/* f(std::integral_constant<int, hd>()) for the head sizes the kernels take (16 .. 256, powers of two), else
 * NULL: picks a kernel instantiation, as in attn_pick (cuda_attn.cu). */
template <typename R, typename F> R attn_by_hd(int hd, F f) {
    switch (hd) {
    case 16:
        return f(std::integral_constant<int, 16>());
    case 32:
        return f(std::integral_constant<int, 32>());
    case 64:
        return f(std::integral_constant<int, 64>());
    case 128:
        return f(std::integral_constant<int, 128>());
    case 256:
        return f(std::integral_constant<int, 256>());
    default:
        return NULL;
    }
}

/* The one-pass kernel (cuda_attn_prefill.cu): out [T][n_heads * hd] f32, for the launches
 * fmc_attention_q8 / _f32 route to it (see FMC_ATT_SPLIT_MAX_T in cuda_kernels.cuh). */
int attn_prefill_init(void);
void attn_prefill(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                  const __half *v_cache, const int *pos, float *out, int pdl, cudaStream_t s);

#endif
