/* cuda_kernel_checks.h: kernel-level checks of the CUDA backend, part of test_cuda_parity (GPU machine only):
 * the Q8_0 product (with its quantising / RMSNorm prologue, the SiLU-gate epilogue and the drafter's bias /
 * GELU / gated-add epilogues) and the BF16 product against the CPU's scalar references on random data, and
 * the T-invariance of the Q8_0 product (a token's result bit for bit the same whether it runs alone or with
 * up to 39 others), and the target's attention against a double-precision reference and for T-invariance.
 * Header-only; included once. Needs CHECK() and hx_rel_err from the including file. */
#ifndef FM_TESTS_CUDA_KERNEL_CHECKS_H
#define FM_TESTS_CUDA_KERNEL_CHECKS_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/dtype.h"
#include "attention_ref.h"
#include "cuda/cuda_debug.h"

static float kc_uniform(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* N rows of K/32 random Q8_0 blocks (scales 1e-3 .. 2e-2, quants -127..127). */
static fm_block_q8_0 *kc_q8_weights(int N, int K, uint64_t *s) {
    fm_block_q8_0 *w = malloc(sizeof *w * (size_t)N * (K / 32));
    for (size_t i = 0; i < (size_t)N * (K / 32); i++) {
        w[i].d = fm_f32_to_f16(1e-3f + 1e-2f * (kc_uniform(s) + 1.0f));
        for (int j = 0; j < 32; j++) w[i].qs[j] = (int8_t)lrintf(127.0f * kc_uniform(s));
    }
    return w;
}

/* ggml's quantize_row_q8_0_ref, formula for formula: n values to n/32 blocks. */
static void kc_quant(const float *x, fm_block_q8_0 *y, int n) {
    for (int b = 0; b < n / 32; b++) {
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[32 * b + j]));
        const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fm_f32_to_f16(d);
        for (int j = 0; j < 32; j++) y[b].qs[j] = (int8_t)roundf(x[32 * b + j] * id);
    }
}

/* The scalar reference: RMSNorm (double sum, as qwen3.c) when nw, Q8_0 quantisation, then per row and block
 * the exact int32 dot and s += isum * (d_w * d_x) in f32, block by block, as ggml's vec_dot_q8_0_q8_0. */
static void kc_q8_ref(const fm_block_q8_0 *w, int N, int K, const float *x, const float *nw, float eps, int T,
                      float *y) {
    const int nb = K / 32;
    float *xn = malloc(sizeof(float) * K);
    fm_block_q8_0 *xq = malloc(sizeof *xq * nb);
    for (int t = 0; t < T; t++) {
        const float *xr = x + (size_t)t * K;
        float r = 1.0f;
        if (nw) {
            double ss = 0;
            for (int i = 0; i < K; i++) ss += (double)xr[i] * xr[i];
            r = (float)(1.0 / sqrt(ss / K + (double)eps));
        }
        for (int i = 0; i < K; i++) xn[i] = nw ? xr[i] * r * nw[i] : xr[i];
        kc_quant(xn, xq, K);
        for (int row = 0; row < N; row++) {
            const fm_block_q8_0 *wr = w + (size_t)row * nb;
            float s = 0.0f;
            for (int b = 0; b < nb; b++) {
                int32_t isum = 0;
                for (int j = 0; j < 32; j++) isum += (int32_t)wr[b].qs[j] * xq[b].qs[j];
                s += (float)isum * (fm_f16_to_f32(wr[b].d) * fm_f16_to_f32(xq[b].d));
            }
            y[(size_t)t * N + row] = s;
        }
    }
    free(xn), free(xq);
}

static void kc_check_q8(int N, int K, int use_norm, uint64_t seed) {
    uint64_t s = seed;
    /* 40 and 130 tokens: the wide kernel (one and two token tiles of 128, the last one partial) */
    const int Ts[] = {1, 8, 17, 40, 130}, NTS = sizeof Ts / sizeof Ts[0], TM = 130;
    fm_block_q8_0 *w = kc_q8_weights(N, K, &s);
    float *x = malloc(sizeof(float) * TM * K), *nw = malloc(sizeof(float) * K);
    for (int i = 0; i < TM * K; i++) x[i] = 3.0f * kc_uniform(&s);
    for (int i = 0; i < K; i++) nw[i] = 1.0f + 0.5f * kc_uniform(&s);
    float *y = malloc(sizeof(float) * TM * N), *y1 = malloc(sizeof(float) * TM * N),
          *r = malloc(sizeof(float) * TM * N);
    for (int ti = 0; ti < NTS; ti++) {
        const int T = Ts[ti];
        const float *n = use_norm ? nw : NULL;
        const int rc = fm_cuda_debug_q8_matmul(w, N, K, x, n, 1e-6f, T, T, 0, y) ||
                       fm_cuda_debug_q8_matmul(w, N, K, x, n, 1e-6f, T, 1, 0, y1);
        kc_q8_ref(w, N, K, x, n, 1e-6f, T, r);
        const double e = hx_rel_err(y, r, (size_t)T * N);
        /* Plain quantisation is bit-identical to the CPU's, and each block's int32 dot is exact: only the f32
         * order of at most K/32 block terms differs (each rounding <= 2^-24 of a partial sum), ~1e-6 of
         * max |y| for random data; 1e-4 leaves room. With the RMSNorm the double sums differ in order, r can
         * differ by an ulp and flip one int8 rounding (1/127 of a block's range): 3e-2, as the model test. */
        const double tol = use_norm ? 3e-2 : 1e-4;
        CHECK(!rc && e < tol, "kernel q8 N=%d K=%d T=%d%s: rel err vs CPU scalar %.2e (tol %.0e)", N, K, T,
              use_norm ? " rmsnorm" : "", e, tol);
        CHECK(!rc && !memcmp(y, y1, sizeof(float) * (size_t)T * N),
              "kernel q8 N=%d K=%d T=%d%s: one launch == %d single-token launches bit for bit", N, K, T,
              use_norm ? " rmsnorm" : "", T);
    }
    free(w), free(x), free(nw), free(y), free(y1), free(r);
}

static void kc_check_glu(int F, int K, int T, uint64_t seed) {
    uint64_t s = seed;
    const int N = 2 * F;
    fm_block_q8_0 *w = kc_q8_weights(N, K, &s);
    float *x = malloc(sizeof(float) * T * K), *nw = malloc(sizeof(float) * K);
    for (int i = 0; i < T * K; i++) x[i] = kc_uniform(&s);
    for (int i = 0; i < K; i++) nw[i] = 1.0f + 0.5f * kc_uniform(&s);
    float *h = malloc(sizeof(float) * T * F), *h1 = malloc(sizeof(float) * T * F);
    float *gu = malloc(sizeof(float) * T * N), *ref = malloc(sizeof(float) * T * F);
    const int rc = fm_cuda_debug_q8_matmul(w, N, K, x, nw, 1e-6f, T, T, 1, h) ||
                   fm_cuda_debug_q8_matmul(w, N, K, x, nw, 1e-6f, T, 1, 1, h1);
    kc_q8_ref(w, N, K, x, nw, 1e-6f, T, gu);
    /* The CPU's SiLU * up, quantised to Q8_0 and dequantised as the next product sees it. */
    float *v = malloc(sizeof(float) * F);
    fm_block_q8_0 *q = malloc(sizeof *q * (F / 32));
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < F; i++) {
            const float g = gu[(size_t)t * N + i], u = gu[(size_t)t * N + F + i];
            v[i] = g / (1.0f + expf(-g)) * u;
        }
        kc_quant(v, q, F);
        for (int i = 0; i < F; i++)
            ref[(size_t)t * F + i] = fm_f16_to_f32(q[i / 32].d) * (float)q[i / 32].qs[i % 32];
    }
    const double e = hx_rel_err(h, ref, (size_t)T * F);
    /* 3e-2: the model test's tolerance (RMSNorm in a different double order, then int8 roundings). */
    CHECK(!rc && e < 3e-2, "kernel q8 gate/up + SiLU F=%d K=%d T=%d: rel err vs CPU %.2e (tol 3e-2)", F, K, T,
          e);
    CHECK(!rc && !memcmp(h, h1, sizeof(float) * (size_t)T * F),
          "kernel q8 gate/up + SiLU F=%d K=%d: one launch of %d == single-token launches bit for bit", F, K,
          T);
    free(w), free(x), free(nw), free(h), free(h1), free(gu), free(ref), free(v), free(q);
}

static void kc_check_bf16(int N, int K, int T, int mode, uint64_t seed) {
    uint64_t s = seed;
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)N * K);
    float *x = malloc(sizeof(float) * (size_t)T * K), *bias = malloc(sizeof(float) * N);
    float *gate = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * (size_t)T * N);
    float *ref = malloc(sizeof(float) * (size_t)T * N);
    for (size_t i = 0; i < (size_t)N * K; i++) w[i] = fm_f32_to_bf16(0.05f * kc_uniform(&s));
    for (size_t i = 0; i < (size_t)T * K; i++) x[i] = kc_uniform(&s);
    for (int i = 0; i < N; i++) bias[i] = 0.1f * kc_uniform(&s), gate[i] = kc_uniform(&s);
    for (size_t i = 0; i < (size_t)T * N; i++) y[i] = kc_uniform(&s); /* the residual for the gated add */
    /* The scalar reference: f32 products of bf16 weights and f32 activations, summed in order, + bias. */
    for (int t = 0; t < T; t++)
        for (int r = 0; r < N; r++) {
            float acc = 0.0f;
            for (int k = 0; k < K; k++) acc += fm_bf16_to_f32(w[(size_t)r * K + k]) * x[(size_t)t * K + k];
            ref[(size_t)t * N + r] = acc + bias[r];
        }
    for (size_t i = 0; i < (size_t)T * N; i++) {
        const float v = ref[i];
        ref[i] = mode == 1   ? 0.5f * v * (1.0f + erff(v * 0.70710678118654752f))
                 : mode == 2 ? y[i] + gate[i % N] * v
                             : v;
    }
    const int rc = fm_cuda_debug_bf16_matmul(w, N, K, x, T, bias, mode, gate, y);
    const double e = hx_rel_err(y, ref, (size_t)T * N);
    /* x is carried as bf16 hi + lo (~16 mantissa bits, 2^-17 relative per product) and summed in f32 in
     * another order: ~1e-5 of max |y| for random data; 1e-3 leaves room. */
    CHECK(!rc && e < 1e-3, "kernel bf16 N=%d K=%d T=%d mode %d: rel err vs CPU scalar %.2e (tol 1e-3)", N, K,
          T, mode, e);
    free(w), free(x), free(bias), free(gate), free(y), free(ref);
}

/* The drafter's Q8_0 product: x quantised in the kernel (no norm), + bias, then store / GELU / gated add. */
static void kc_check_q8d(int N, int K, int T, int mode, uint64_t seed) {
    uint64_t s = seed;
    fm_block_q8_0 *w = kc_q8_weights(N, K, &s);
    float *x = malloc(sizeof(float) * (size_t)T * K), *bias = malloc(sizeof(float) * N);
    float *gate = malloc(sizeof(float) * N), *y = malloc(sizeof(float) * (size_t)T * N);
    float *ref = malloc(sizeof(float) * (size_t)T * N);
    for (size_t i = 0; i < (size_t)T * K; i++) x[i] = kc_uniform(&s);
    for (int i = 0; i < N; i++) bias[i] = 0.1f * kc_uniform(&s), gate[i] = kc_uniform(&s);
    for (size_t i = 0; i < (size_t)T * N; i++) y[i] = kc_uniform(&s); /* the residual for the gated add */
    kc_q8_ref(w, N, K, x, NULL, 0.0f, T, ref);
    for (size_t i = 0; i < (size_t)T * N; i++) {
        const float v = ref[i] + bias[i % N];
        ref[i] = mode == 1   ? 0.5f * v * (1.0f + erff(v * 0.70710678118654752f))
                 : mode == 2 ? y[i] + gate[i % N] * v
                             : v;
    }
    float *y0 = malloc(sizeof(float) * (size_t)T * N), *y1 = malloc(sizeof(float) * N);
    memcpy(y0, y, sizeof(float) * (size_t)T * N);
    const int rc = fm_cuda_debug_q8_dmatmul(w, N, K, x, T, bias, mode, gate, y);
    const double e = hx_rel_err(y, ref, (size_t)T * N);
    /* As kc_check_q8 without a norm: quantisation bit-identical, exact int32 block dots, only the f32 order
     * of the block terms differs (~1e-6 of max |y|); the epilogues are the same f32 formulas. */
    CHECK(!rc && e < 1e-4, "kernel q8 drafter N=%d K=%d T=%d mode %d: rel err vs CPU scalar %.2e (tol 1e-4)",
          N, K, T, mode, e);
    /* Rows of one launch == launches of that row alone (the wide kernel beyond 32 rows, the narrow one at 1)
     */
    const int rows[] = {0, T / 3, T - 1};
    for (int i = 0; i < 3; i++) {
        const int t = rows[i];
        memcpy(y1, y0 + (size_t)t * N, sizeof(float) * N);
        const int rc1 = fm_cuda_debug_q8_dmatmul(w, N, K, x + (size_t)t * K, 1, bias, mode, gate, y1);
        CHECK(!rc1 && !memcmp(y1, y + (size_t)t * N, sizeof(float) * N),
              "kernel q8 drafter N=%d K=%d T=%d mode %d: row %d == a launch of that row alone bit for bit", N,
              K, T, mode, t);
    }
    /* The narrow kernel's groups of several blocks (gemm_plan gives these shapes kc = 2 from K = 2048)
     * merged in thread-block clusters (sm_90) == merged through L2, bit for bit. */
    if (T <= 32 && K >= 2048 && fm_cuda_debug_set_cluster(1)) {
        float *y2 = malloc(sizeof(float) * (size_t)T * N);
        memcpy(y2, y0, sizeof(float) * (size_t)T * N);
        fm_cuda_debug_set_cluster(0);
        const int rc2 = fm_cuda_debug_q8_dmatmul(w, N, K, x, T, bias, mode, gate, y2);
        fm_cuda_debug_set_cluster(1);
        CHECK(!rc2 && !memcmp(y2, y, sizeof(float) * (size_t)T * N),
              "kernel q8 drafter N=%d K=%d T=%d mode %d: merged in clusters == through L2 bit for bit", N, K,
              T, mode);
        free(y2);
    }
    free(w), free(x), free(bias), free(gate), free(y), free(ref), free(y0), free(y1);
}

/* Attention (split + merge, f32 output) against a double-precision reference over the same f16 keys and
 * values: q ~ 2 U(-1, 1) so that the softmax is neither flat nor one-hot; contexts that end inside, at and
 * past split boundaries. Then the T-invariance the engine relies on (verify blocks == steps, and a prompt
 * cache that keeps rows whatever batch computed them): row t of a T-row launch == a 1-row launch at pos + t,
 * bit for bit, prefill-sized launches included. */
static void kc_check_attention(int T, int n_heads, int n_kv, int hd, int pos, int causal, uint64_t seed) {
    uint64_t s = seed;
    const int n_keys = causal ? pos + T : pos + 1, W = n_heads * hd, KW = n_kv * hd;
    float *q = malloc(sizeof(float) * (size_t)T * W), *y = malloc(sizeof(float) * (size_t)T * W);
    float *ref = malloc(sizeof(float) * (size_t)T * W), *y1 = malloc(sizeof(float) * W);
    uint16_t *k = malloc(2 * (size_t)n_keys * KW), *v = malloc(2 * (size_t)n_keys * KW);
    for (size_t i = 0; i < (size_t)T * W; i++) q[i] = 2.0f * kc_uniform(&s);
    for (size_t i = 0; i < (size_t)n_keys * KW; i++)
        k[i] = fm_f32_to_f16(kc_uniform(&s)), v[i] = fm_f32_to_f16(kc_uniform(&s));
    /* causal: row t attends to keys 0 .. pos + t; else every row to keys 0 .. pos */
    attention_ref(q, T, n_heads, n_kv, hd, k, v, pos, causal ? 0 : pos + 1, ref);
    const int rc = fm_cuda_debug_attention(q, T, n_heads, n_kv, hd, k, v, pos, causal, 0, y);
    const double e = hx_rel_err(y, ref, (size_t)T * W);
    /* q and the probabilities enter the f16 tensor cores as two f16 parts (~22 bits), sums in f32: ~1e-6. */
    CHECK(!rc && e < 1e-4,
          "kernel attention T=%d heads %d/%d hd %d pos %d causal %d: rel err vs double %.2e (tol 1e-4)", T,
          n_heads, n_kv, hd, pos, causal, e);
    /* the long-context form (small blocks for up to 64 rows x heads of a group) gives the same bits */
    float *y2 = malloc(sizeof(float) * (size_t)T * W);
    CHECK(!fm_cuda_debug_attention(q, T, n_heads, n_kv, hd, k, v, pos, causal, 1, y2) &&
              !memcmp(y2, y, sizeof(float) * (size_t)T * W),
          "kernel attention T=%d heads %d/%d hd %d pos %d causal %d: long-context form == short bit for bit",
          T, n_heads, n_kv, hd, pos, causal);
    free(y2);
    if (causal && T > 1) {
        int same = 1;
        for (int t = 0; t < T && same; t++) /* 1-row launches in both forms, alternately */
            same = !fm_cuda_debug_attention(q + (size_t)t * W, 1, n_heads, n_kv, hd, k, v, pos + t, 1, t & 1,
                                            y1) &&
                   !memcmp(y1, y + (size_t)t * W, sizeof(float) * W);
        CHECK(same, "kernel attention T=%d heads %d/%d hd %d pos %d: rows == 1-row launches bit for bit", T,
              n_heads, n_kv, hd, pos);
    }
    free(q), free(y), free(ref), free(y1), free(k), free(v);
}

static void kc_run_all(void) {
    /* Shapes that take each split of gemm_plan: warps per tile w and blocks per row group kc. */
    kc_check_q8(40, 96, 0, 1);      /* rows past a 16-row tile, K/32 = 3: w = 1 */
    kc_check_q8(256, 1024, 0, 2);   /* w = 4, kc = 1 */
    kc_check_q8(64, 4096, 0, 3);    /* kc = 2: merged by the last block */
    kc_check_q8(48, 8192, 0, 4);    /* kc = 4 */
    kc_check_q8(16400, 64, 0, 5);   /* w = 2, a partial last tile */
    kc_check_q8(256, 1024, 1, 6);   /* RMSNorm in the quantiser */
    kc_check_glu(96, 256, 17, 7);   /* gate/up group of 4 tiles, kc = 1 */
    kc_check_glu(96, 2048, 17, 8);  /* kc = 2 */
    kc_check_glu(96, 2048, 150, 8); /* the wide kernel */
    kc_check_bf16(40, 64, 1, 0, 9);
    kc_check_bf16(300, 2048, 16, 0, 10); /* kc = 2 */
    kc_check_bf16(300, 2048, 17, 1, 11);
    kc_check_bf16(2048, 512, 40, 2, 12);
    kc_check_q8d(40, 64, 1, 0, 13);
    kc_check_q8d(300, 2048, 16, 0, 14); /* kc = 2 */
    kc_check_q8d(300, 2048, 17, 1, 15);
    kc_check_q8d(300, 2048, 16, 2, 43); /* the gated add at the drafter's 16 slots, kc = 2 */
    kc_check_q8d(2048, 512, 40, 2, 16); /* the wide kernel from 33 tokens, in each epilogue */
    kc_check_q8d(300, 2048, 200, 0, 25);
    kc_check_q8d(300, 2048, 133, 1, 26);
    /* attention: GQA 32/8 x 128 (Qwen3-4B) and the test models' shapes; contexts around split boundaries */
    kc_check_attention(1, 32, 8, 128, 0, 1, 17);
    kc_check_attention(1, 32, 8, 128, 700, 1, 18);
    kc_check_attention(1, 32, 8, 128, 5000, 1, 34);  /* 79 splits: the long form's blocks take two */
    kc_check_attention(8, 32, 8, 128, 4990, 1, 35);  /* the long form's 32-query blocks */
    kc_check_attention(16, 32, 8, 128, 4100, 1, 36); /* its 64-query blocks, 3 splits for some */
    kc_check_attention(17, 32, 8, 128, 4500, 1, 37); /* past the long form: 68 queries */
    /* longer contexts: 141 splits (the long form's blocks take 2 or 3), rows crossing 8192 keys, verify
     * blocks and a prompt chunk across 4096 keys, the drafter's cross-attention over 9001 keys */
    kc_check_attention(1, 32, 8, 128, 9000, 1, 38);
    kc_check_attention(8, 32, 8, 128, 8187, 1, 39);
    kc_check_attention(17, 32, 8, 128, 4350, 1, 40);
    kc_check_attention(100, 32, 8, 128, 4040, 1, 41);
    kc_check_attention(16, 16, 16, 128, 9000, 0, 42);
    kc_check_attention(8, 32, 8, 128, 60, 1, 19);   /* rows cross the 64-key boundary */
    kc_check_attention(17, 32, 8, 128, 511, 1, 20); /* first row at a split's last key */
    kc_check_attention(40, 32, 8, 128, 90, 1, 21);  /* 40 rows: two row groups of 32 */
    kc_check_attention(64, 32, 8, 128, 90, 1, 27);  /* the split kernel's longest launch */
    /* prefill chunks (the one-pass kernel from 65 rows): partial row groups, many splits, masks inside a
     * split; every row == a 1-row launch on the split kernel */
    kc_check_attention(130, 32, 8, 128, 700, 1, 28);
    kc_check_attention(256, 32, 8, 128, 0, 1, 29);
    kc_check_attention(300, 32, 8, 128, 200, 1, 33); /* 304 blocks: the one-buffer variant (132 SMs) */
    kc_check_attention(67, 4, 2, 32, 5, 1, 30);
    kc_check_attention(65, 32, 8, 128, 0, 1, 31);
    kc_check_attention(80, 8, 8, 256, 40, 1, 32); /* 256-dim heads: the split kernel throughout */
    kc_check_attention(17, 4, 2, 32, 23, 1, 22);
    kc_check_attention(16, 4, 4, 16, 130, 0, 23); /* the drafter's cross-attention: no mask, G = 1 */
    kc_check_attention(16, 16, 16, 128, 300, 0, 24);
    kc_check_attention(16, 16, 16, 128, 4500, 0, 35);
}

#endif
