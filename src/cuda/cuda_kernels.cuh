/* cuda_kernels.cuh: launchers of the CUDA backend's kernels (cuda_kernels.cu), called by cuda_backend.cu.
 *
 * Layouts (device memory):
 *   q8 matrix   qs int8 [N][K] + d half [N][K/32]: the GGUF Q8_0 blocks split into quants and scales so that
 *               a warp reads its row with 16-byte loads (same bytes, same values as the GGUF blocks).
 *   bf16 matrix [N][K] as stored.
 *   activations f32 [T][width]; quantised activations int8 [T][K] + f32 scales [T][K/32] (the f16 scale,
 *               widened), bit-identical to ggml's quantize_row_q8_0_ref.
 * Invariant (losslessness): every row's result is computed by the same threads in the same order whatever T
 * is, so a verify block's rows equal step-by-step rows bit for bit. */
#ifndef FM_CUDA_KERNELS_CUH
#define FM_CUDA_KERNELS_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

typedef struct {
    const int8_t *qs; /* [N][K] */
    const __half *d;  /* [N][K/32] */
    int N, K;
} fmc_q8;

typedef struct {
    const __nv_bfloat16 *w; /* [N][K] */
    int N, K;
} fmc_bf16;

/* GGUF blocks [N][K/32] (device) -> split layout. */
void fmc_repack_q8(const void *blocks, int64_t n_blocks, int8_t *qs, __half *d, cudaStream_t s);

/* y[t][r] (+)= W[r] . x[t] (+ bias[r]) for t < T; x quantised (xq, xd). add: accumulate into y. ldy: row
 * stride of y. */
void fmc_gemv_q8(const fmc_q8 *w, const int8_t *xq, const float *xd, int T, float *y, int ldy, int add,
                 cudaStream_t s);
/* bf16 weights, f32 activations [T][K]. */
void fmc_gemv_bf16(const fmc_bf16 *w, const float *x, int T, float *y, int ldy, const float *bias, int add,
                   cudaStream_t s);

/* out = RMSNorm(x) * w (w may be NULL: plain quantisation of x), quantised to Q8_0 per row: [T][n]. */
void fmc_norm_quant(const float *x, int ldx, const float *w, float eps, int T, int n, int8_t *xq, float *xd,
                    cudaStream_t s);
/* g = silu(gu[t][0..F)) * gu[t][F..2F), quantised. */
void fmc_silu_mul_quant(const float *gu, int T, int F, int8_t *xq, float *xd, cudaStream_t s);
/* x[t] = dequantised token rows of a q8 table. */
void fmc_embed_q8(const fmc_q8 *tab, const int32_t *ids, int T, float *x, cudaStream_t s);

/* Target: qkv [T][q_dim + 2 kv_dim] -> per-head RMSNorm(q_norm / k_norm), NEOX RoPE at *pos + t, q into
 * q_out [T][q_dim], K/V rows into the f16 caches [n_ctx][kv_dim] at *pos + t. rope: [n_ctx][hd/2][2]. */
void fmc_qk_norm_rope_kv(const float *qkv, int T, int n_heads, int n_kv, int hd, const float *q_norm,
                         const float *k_norm, float eps, const float *rope, const int *pos, float *q_out,
                         __half *k_cache, __half *v_cache, cudaStream_t s);
/* Causal GQA attention of T rows at *pos + t over the f16 caches, split-K: splits of FMC_ATT_SPLIT keys, each
 * written to part, merged in a fixed order. part: [T][n_heads][max_splits][hd + 2]. */
#define FMC_ATT_SPLIT 64
void fmc_attention(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                   const __half *v_cache, const int *pos, int max_splits, float *part, float *out,
                   cudaStream_t s);
/* argmax of each row of x [T][n] (ties to the lowest index, NaN never wins). */
void fmc_argmax(const float *x, int T, int n, int32_t *out, cudaStream_t s);
/* dst[t][0..n) = src[t][0..n) with row strides. */
void fmc_copy_rows(const float *src, int lds, float *dst, int ldd, int T, int n, cudaStream_t s);

/* ---- drafter ---- */
/* y = x * (w / rms(x)) per row (double sums as the CPU reference). */
void fmc_rmsnorm_rows(const float *x, const float *w, int T, int n, float eps, float *y, cudaStream_t s);
/* y = LN(x) * (1 + scale) + shift. */
void fmc_ln_mod_rows(const float *x, const float *scale, const float *shift, int T, int n, float eps, float *y,
                     cudaStream_t s);
/* In place on x [T][ld] (heads at col 0): per-head RMSNorm w, interleaved RoPE (2i, 2i+1) at pos0 + t with
 * angle (float)pos * inv_freq[i]. When k_cache != NULL the result goes to k_cache rows pos0 + t (f16, row
 * stride n_heads*hd) instead, and v (same shape, stride ld) to v_cache. */
void fmc_dr_norm_rope(float *x, int ld, int T, int n_heads, int hd, const float *w, float eps, int pos0,
                      const float *inv_freq, const float *v, __half *k_cache, __half *v_cache, cudaStream_t s);
/* o[t][h] = softmax(q . k / sqrt(hd)) v over L keys, no mask; K/V f32 (ld strides) or f16 caches. */
void fmc_dr_attention(const float *q, int ldq, int T, const float *kf, const float *vf, int ldkv,
                      const __half *kh, const __half *vh, int L, int n_heads, int hd, float *o, cudaStream_t s);
/* x[t][i] += gate[i] * y[t][i]. */
void fmc_gate_add(float *x, const float *y, const float *gate, int T, int n, cudaStream_t s);
void fmc_gelu(float *x, int64_t n, cudaStream_t s);
/* x[t] = row (broadcast). */
void fmc_broadcast_row(const float *row, int T, int n, float *x, cudaStream_t s);

#endif
