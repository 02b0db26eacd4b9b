/* cuda_kernels.cu: the CUDA backend's kernels (see cuda_kernels.cuh for layouts and the T-invariance rule).
 * Matrix products are warp-per-output-row: each lane walks its share of the row in a fixed order and the
 * warp reduces with a fixed butterfly, so a row's value never depends on how many token rows ran with it.
 * Reductions that the CPU reference does in double (norms) are done in double here too. */
#include <math.h>

#include "cuda/cuda_kernels.cuh"

#define WARP 32
static const int GEMV_WARPS = 8; /* warps (output rows) per block */

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim a multiple of 32, <= 1024); every thread gets the result. */
__device__ double block_sum_d(double v) {
    __shared__ double sh[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum_d(v);
    __syncthreads();
    if (lane == 0) sh[w] = v;
    __syncthreads();
    double t = 0;
    for (int i = 0; i < nw; i++) t += sh[i];
    return t;
}
__device__ float block_sum_f(float v) {
    __shared__ float shf[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) shf[w] = v;
    __syncthreads();
    float t = 0;
    for (int i = 0; i < nw; i++) t += shf[i];
    return t;
}
__device__ float block_max_f(float v) {
    __shared__ float shm[32];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) shm[w] = v;
    __syncthreads();
    float t = -INFINITY;
    for (int i = 0; i < nw; i++) t = fmaxf(t, shm[i]);
    return t;
}

/* ---- Q8_0 ---- */

__global__ void k_repack_q8(const uint8_t *blocks, int64_t n_blocks, int8_t *qs, __half *d) {
    const int64_t b = (int64_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    const int lane = threadIdx.x & 31;
    if (b >= n_blocks) return;
    const uint8_t *src = blocks + b * 34;
    qs[b * 32 + lane] = (int8_t)src[2 + lane];
    if (lane == 0) {
        __half_raw r;
        r.x = (unsigned short)(src[0] | (src[1] << 8));
        d[b] = __half(r);
    }
}

void fmc_repack_q8(const void *blocks, int64_t n_blocks, int8_t *qs, __half *d, cudaStream_t s) {
    const int per = 8;
    k_repack_q8<<<(unsigned)((n_blocks + per - 1) / per), per * 32, 0, s>>>((const uint8_t *)blocks, n_blocks, qs, d);
}

__device__ __forceinline__ int dot16(int4 a, int4 b, int s) {
    s = __dp4a(a.x, b.x, s);
    s = __dp4a(a.y, b.y, s);
    s = __dp4a(a.z, b.z, s);
    return __dp4a(a.w, b.w, s);
}

/* One warp per output row; lane l takes blocks l, l+32, ...: per block the exact int32 dot of 32 quants, then
 * acc += isum * (dw * dx) as ggml does (in a different block order than the CPU: f32 rounding only). */
template <int NT>
__global__ void __launch_bounds__(256) k_gemv_q8(const int8_t *__restrict__ qs, const __half *__restrict__ d, int N,
                                                 int K, const int8_t *__restrict__ xq, const float *__restrict__ xd,
                                                 float *__restrict__ y, int ldy, int add) {
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const int nb = K >> 5;
    const int8_t *wr = qs + (size_t)row * K;
    const __half *dr = d + (size_t)row * nb;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
#pragma unroll 4
    for (int b = lane; b < nb; b += 32) {
        const int4 w0 = __ldg((const int4 *)(wr + (size_t)b * 32));
        const int4 w1 = __ldg((const int4 *)(wr + (size_t)b * 32 + 16));
        const float dw = __half2float(dr[b]);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const int4 *xp = (const int4 *)(xq + (size_t)t * K + (size_t)b * 32);
            const int s = dot16(w1, __ldg(xp + 1), dot16(w0, __ldg(xp), 0));
            acc[t] += (float)s * (dw * __ldg(xd + (size_t)t * nb + b));
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const float v = warp_sum(acc[t]);
        if (lane == 0) {
            float *o = y + (size_t)t * ldy + row;
            *o = add ? *o + v : v;
        }
    }
}

#define FMC_T_CASES(X) \
    X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11) X(12) X(13) X(14) X(15) X(16) X(17)

void fmc_gemv_q8(const fmc_q8 *w, const int8_t *xq, const float *xd, int T, float *y, int ldy, int add,
                 cudaStream_t s) {
    const unsigned grid = (unsigned)((w->N + GEMV_WARPS - 1) / GEMV_WARPS);
    const int nb = w->K / 32;
    for (int t0 = 0; t0 < T;) {
        int n = T - t0;
        if (n > 17) n = 16;
        const int8_t *xq_t = xq + (size_t)t0 * w->K;
        const float *xd_t = xd + (size_t)t0 * nb;
        float *y_t = y + (size_t)t0 * ldy;
        switch (n) {
#define X(k) \
    case k: k_gemv_q8<k><<<grid, GEMV_WARPS * 32, 0, s>>>(w->qs, w->d, w->N, w->K, xq_t, xd_t, y_t, ldy, add); break;
            FMC_T_CASES(X)
#undef X
        }
        t0 += n;
    }
}

/* ---- BF16 ---- */

__device__ __forceinline__ float bf_lo(unsigned u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf_hi(unsigned u) { return __uint_as_float(u & 0xffff0000u); }

/* One warp per output row; lane l takes 8-element chunks l, l+32, ... */
template <int NT>
__global__ void __launch_bounds__(256) k_gemv_bf16(const __nv_bfloat16 *__restrict__ w, int N, int K,
                                                   const float *__restrict__ x, float *__restrict__ y, int ldy,
                                                   const float *__restrict__ bias, int add) {
    const int row = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const int nc = K >> 3;
    const __nv_bfloat16 *wr = w + (size_t)row * K;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.f;
#pragma unroll 2
    for (int c = lane; c < nc; c += 32) {
        const uint4 wv = __ldg((const uint4 *)(wr + (size_t)c * 8));
        const float w0 = bf_lo(wv.x), w1 = bf_hi(wv.x), w2 = bf_lo(wv.y), w3 = bf_hi(wv.y);
        const float w4 = bf_lo(wv.z), w5 = bf_hi(wv.z), w6 = bf_lo(wv.w), w7 = bf_hi(wv.w);
#pragma unroll
        for (int t = 0; t < NT; t++) {
            const float4 *xp = (const float4 *)(x + (size_t)t * K + (size_t)c * 8);
            const float4 a = __ldg(xp), b = __ldg(xp + 1);
            float s = acc[t];
            s += w0 * a.x; s += w1 * a.y; s += w2 * a.z; s += w3 * a.w;
            s += w4 * b.x; s += w5 * b.y; s += w6 * b.z; s += w7 * b.w;
            acc[t] = s;
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = warp_sum(acc[t]);
        if (lane == 0) {
            if (bias) v += bias[row];
            float *o = y + (size_t)t * ldy + row;
            *o = add ? *o + v : v;
        }
    }
}

void fmc_gemv_bf16(const fmc_bf16 *w, const float *x, int T, float *y, int ldy, const float *bias, int add,
                   cudaStream_t s) {
    const unsigned grid = (unsigned)((w->N + GEMV_WARPS - 1) / GEMV_WARPS);
    for (int t0 = 0; t0 < T;) {
        int n = T - t0;
        if (n > 17) n = 16;
        const float *x_t = x + (size_t)t0 * w->K;
        float *y_t = y + (size_t)t0 * ldy;
        switch (n) {
#define X(k) \
    case k: k_gemv_bf16<k><<<grid, GEMV_WARPS * 32, 0, s>>>(w->w, w->N, w->K, x_t, y_t, ldy, bias, add); break;
            FMC_T_CASES(X)
#undef X
        }
        t0 += n;
    }
}

/* ---- norms, quantisation, element-wise ---- */

/* Block per row, 256 threads: optional RMSNorm (x * r * w, r from a double sum of squares), then ggml's
 * quantize_row_q8_0_ref per 32-block: d = amax / 127, id = d ? 1/d : 0, q = roundf(v * id). */
__global__ void k_norm_quant(const float *x, int ldx, const float *w, float eps, int n, int8_t *xq, float *xd) {
    const int t = blockIdx.x;
    const float *xr = x + (size_t)t * ldx;
    float r = 1.f;
    if (w) {
        double ss = 0;
        for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
        ss = block_sum_d(ss);
        r = (float)(1.0 / sqrt(ss / (double)n + (double)eps));
    }
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5, nb = n >> 5;
    for (int b = wi; b < nb; b += nw) {
        const int i = b * 32 + lane;
        float v = xr[i];
        if (w) v = v * r * w[i];
        const float amax = warp_max(fabsf(v));
        const float dd = amax / 127.0f;
        const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
        xq[(size_t)t * n + i] = (int8_t)roundf(v * id);
        if (lane == 0) xd[(size_t)t * nb + b] = __half2float(__float2half_rn(dd));
    }
}

void fmc_norm_quant(const float *x, int ldx, const float *w, float eps, int T, int n, int8_t *xq, float *xd,
                    cudaStream_t s) {
    k_norm_quant<<<T, 1024, 0, s>>>(x, ldx, w, eps, n, xq, xd);
}

/* grid (T, ceil(F/32/8)), 256 threads: warp w of block y quantises 32-block y*8 + w. */
__global__ void k_silu_mul_quant(const float *gu, int F, int8_t *xq, float *xd) {
    const int t = blockIdx.x, nb = F >> 5, b = blockIdx.y * 8 + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (b >= nb) return;
    const float *g = gu + (size_t)t * 2 * F, *u = g + F;
    const int i = b * 32 + lane;
    const float gv = g[i];
    const float v = gv / (1.0f + expf(-gv)) * u[i];
    const float amax = warp_max(fabsf(v));
    const float dd = amax / 127.0f;
    const float id = dd != 0.0f ? 1.0f / dd : 0.0f;
    xq[(size_t)t * F + i] = (int8_t)roundf(v * id);
    if (lane == 0) xd[(size_t)t * nb + b] = __half2float(__float2half_rn(dd));
}

void fmc_silu_mul_quant(const float *gu, int T, int F, int8_t *xq, float *xd, cudaStream_t s) {
    dim3 grid(T, (F / 32 + 7) / 8);
    k_silu_mul_quant<<<grid, 256, 0, s>>>(gu, F, xq, xd);
}

__global__ void k_embed_q8(const int8_t *qs, const __half *d, int K, const int32_t *ids, float *x) {
    const int t = blockIdx.x;
    const int64_t row = ids[t];
    for (int i = threadIdx.x; i < K; i += blockDim.x)
        x[(size_t)t * K + i] = __half2float(d[row * (K / 32) + i / 32]) * (float)qs[row * K + i];
}

void fmc_embed_q8(const fmc_q8 *tab, const int32_t *ids, int T, float *x, cudaStream_t s) {
    k_embed_q8<<<T, 256, 0, s>>>(tab->qs, tab->d, tab->K, ids, x);
}

/* grid (T, n_heads + 2 n_kv); q and k heads: RMSNorm then NEOX rotation; v heads: copied to the cache. */
__global__ void k_qk_norm_rope_kv(const float *qkv, int n_heads, int n_kv, int hd, const float *q_norm,
                                  const float *k_norm, float eps, const float *rope, const int *pos, float *q_out,
                                  __half *k_cache, __half *v_cache) {
    const int t = blockIdx.x, hh = blockIdx.y, q_dim = n_heads * hd, kv_dim = n_kv * hd, half = hd / 2;
    const int p = *pos + t;
    const float *row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    if (hh >= n_heads + n_kv) {
        const int j = hh - n_heads - n_kv;
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            v_cache[(size_t)p * kv_dim + j * hd + i] = __float2half_rn(row[q_dim + kv_dim + j * hd + i]);
        return;
    }
    const int is_q = hh < n_heads;
    const float *src = is_q ? row + hh * hd : row + q_dim + (hh - n_heads) * hd;
    const float *w = is_q ? q_norm : k_norm;
    double ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += (double)src[i] * src[i];
    ss = block_sum_d(ss);
    const float r = (float)(1.0 / sqrt(ss / (double)hd + (double)eps));
    const float *rp = rope + (size_t)p * hd;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float a = src[i] * r * w[i], b = src[i + half] * r * w[i + half];
        const float c = rp[2 * i], sn = rp[2 * i + 1];
        const float o0 = a * c - b * sn, o1 = b * c + a * sn;
        if (is_q) {
            q_out[(size_t)t * q_dim + hh * hd + i] = o0;
            q_out[(size_t)t * q_dim + hh * hd + i + half] = o1;
        } else {
            const size_t base = (size_t)p * kv_dim + (hh - n_heads) * hd;
            k_cache[base + i] = __float2half_rn(o0);
            k_cache[base + i + half] = __float2half_rn(o1);
        }
    }
}

void fmc_qk_norm_rope_kv(const float *qkv, int T, int n_heads, int n_kv, int hd, const float *q_norm,
                         const float *k_norm, float eps, const float *rope, const int *pos, float *q_out,
                         __half *k_cache, __half *v_cache, cudaStream_t s) {
    dim3 grid(T, n_heads + 2 * n_kv);
    k_qk_norm_rope_kv<<<grid, 64, 0, s>>>(qkv, n_heads, n_kv, hd, q_norm, k_norm, eps, rope, pos, q_out, k_cache,
                                         v_cache);
}

/* ---- attention (target): split-K, fixed split boundaries ---- */

/* grid (max_splits, n_heads, T), 128 threads: keys [s*SPLIT, min((s+1)*SPLIT, len)) of row t. Warp w takes
 * keys w, w+4, ...; lane l the dims 2l, 2l+1, 2l+64, ... (half2 loads). Partial (o unnormalised, m, l) per split. */
__global__ void __launch_bounds__(128) k_attn_split(const float *q, int n_heads, int n_kv, int hd,
                                                    const __half *kc, const __half *vc, const int *pos,
                                                    int max_splits, float *part) {
    const int s = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    const int len = *pos + t + 1, j0 = s * FMC_ATT_SPLIT;
    if (j0 >= len) return;
    const int n = min(FMC_ATT_SPLIT, len - j0), kv_dim = n_kv * hd, kvh = h / (n_heads / n_kv);
    __shared__ float qs[256];
    __shared__ float sc[FMC_ATT_SPLIT];
    __shared__ float red[4][256];
    const float *qr = q + (size_t)t * n_heads * hd + h * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = qr[i];
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5;
    const __half *kb = kc + (size_t)j0 * kv_dim + kvh * hd, *vb = vc + (size_t)j0 * kv_dim + kvh * hd;
#pragma unroll 4
    for (int j = wi; j < n; j += 4) {
        float dot = 0.f;
        for (int i = 2 * lane; i < hd; i += 64) {
            const float2 k2 = __half22float2(*(const __half2 *)(kb + (size_t)j * kv_dim + i));
            dot += qs[i] * k2.x + qs[i + 1] * k2.y;
        }
        dot = warp_sum(dot);
        if (lane == 0) sc[j] = dot * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = block_max_f(m);
    float l = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
        const float e = expf(sc[j] - m);
        sc[j] = e;
        l += e;
    }
    l = block_sum_f(l); /* includes a barrier: sc is complete below */
    float2 acc[4] = {{0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}, {0.f, 0.f}};
#pragma unroll 4
    for (int j = wi; j < n; j += 4) {
        const float p = sc[j];
#pragma unroll
        for (int c = 0; c < 4; c++) {
            const int i = 2 * lane + 64 * c;
            if (i < hd) {
                const float2 v2 = __half22float2(*(const __half2 *)(vb + (size_t)j * kv_dim + i));
                acc[c].x += p * v2.x;
                acc[c].y += p * v2.y;
            }
        }
    }
#pragma unroll
    for (int c = 0; c < 4; c++) {
        const int i = 2 * lane + 64 * c;
        if (i < hd) red[wi][i] = acc[c].x, red[wi][i + 1] = acc[c].y;
    }
    __syncthreads();
    float *out = part + (((size_t)t * n_heads + h) * max_splits + s) * (hd + 2);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) out[i] = ((red[0][i] + red[1][i]) + red[2][i]) + red[3][i];
    if (threadIdx.x == 0) {
        out[hd] = m;
        out[hd + 1] = l;
    }
}

__global__ void k_attn_combine(int n_heads, int hd, const int *pos, int max_splits, const float *part, float *out) {
    const int h = blockIdx.x, t = blockIdx.y;
    const int len = *pos + t + 1, ns = (len + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
    const float *pr = part + ((size_t)t * n_heads + h) * max_splits * (hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, pr[(size_t)s * (hd + 2) + hd]);
    float L = 0.f;
    for (int s = 0; s < ns; s++) L += pr[(size_t)s * (hd + 2) + hd + 1] * expf(pr[(size_t)s * (hd + 2) + hd] - M);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float o = 0.f;
        for (int s = 0; s < ns; s++) o += pr[(size_t)s * (hd + 2) + i] * expf(pr[(size_t)s * (hd + 2) + hd] - M);
        out[(size_t)t * n_heads * hd + h * hd + i] = o / L;
    }
}

void fmc_attention(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                   const __half *v_cache, const int *pos, int max_splits, float *part, float *out,
                   cudaStream_t s) {
    dim3 g1(max_splits, n_heads, T);
    k_attn_split<<<g1, 128, 0, s>>>(q, n_heads, n_kv, hd, k_cache, v_cache, pos, max_splits, part);
    dim3 g2(n_heads, T);
    k_attn_combine<<<g2, 128, 0, s>>>(n_heads, hd, pos, max_splits, part, out);
}

/* ---- argmax ---- */

__global__ void k_argmax(const float *x, int n, int32_t *out) {
    const float *r = x + (size_t)blockIdx.x * n;
    float bv = -INFINITY;
    int bi = -1;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const float v = r[i];
        if (v == v && (bi < 0 || v > bv)) bv = v, bi = i; /* strided: first hit of a value is the lowest */
    }
    __shared__ float sv[1024];
    __shared__ int si[1024];
    sv[threadIdx.x] = bv;
    si[threadIdx.x] = bi;
    __syncthreads();
    for (int st = blockDim.x / 2; st > 0; st >>= 1) {
        if (threadIdx.x < st) {
            const float ov = sv[threadIdx.x + st];
            const int oi = si[threadIdx.x + st];
            const int mi = si[threadIdx.x];
            if (oi >= 0 && (mi < 0 || ov > sv[threadIdx.x] || (ov == sv[threadIdx.x] && oi < mi)))
                sv[threadIdx.x] = ov, si[threadIdx.x] = oi;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = si[0] < 0 ? 0 : si[0];
}

void fmc_argmax(const float *x, int T, int n, int32_t *out, cudaStream_t s) {
    k_argmax<<<T, 1024, 0, s>>>(x, n, out);
}

void fmc_copy_rows(const float *src, int lds, float *dst, int ldd, int T, int n, cudaStream_t s) {
    cudaMemcpy2DAsync(dst, (size_t)ldd * 4, src, (size_t)lds * 4, (size_t)n * 4, T, cudaMemcpyDeviceToDevice, s);
}

/* ---- drafter ---- */

__global__ void k_rmsnorm_rows(const float *x, const float *w, int n, float eps, float *y) {
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss);
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * (w[i] * r);
}

void fmc_rmsnorm_rows(const float *x, const float *w, int T, int n, float eps, float *y, cudaStream_t s) {
    k_rmsnorm_rows<<<T, 256, 0, s>>>(x, w, n, eps, y);
}

__global__ void k_ln_mod_rows(const float *x, const float *scale, const float *shift, int n, float eps, float *y) {
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double su = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) su += xr[i];
    const double mu = block_sum_d(su) / n;
    double q = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) q += (xr[i] - mu) * (xr[i] - mu);
    q = block_sum_d(q);
    const float r = (float)(1.0 / sqrt(q / n + eps)), muf = (float)mu;
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = (xr[i] - muf) * r * (1.0f + scale[i]) + shift[i];
}

void fmc_ln_mod_rows(const float *x, const float *scale, const float *shift, int T, int n, float eps, float *y,
                     cudaStream_t s) {
    k_ln_mod_rows<<<T, 256, 0, s>>>(x, scale, shift, n, eps, y);
}

__global__ void k_dr_norm_rope(float *x, int ld, int hd, const float *w, float eps, int pos0, const float *inv_freq,
                               const float *v, __half *kc, __half *vc, int D) {
    const int t = blockIdx.x, h = blockIdx.y, half = hd / 2;
    float *r = x + (size_t)t * ld + h * hd;
    double ss = 0;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) ss += (double)r[i] * r[i];
    ss = block_sum_d(ss);
    const float rs = (float)(1.0 / sqrt(ss / hd + eps));
    const float pf = (float)(pos0 + t);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float a0 = r[2 * i] * (w[2 * i] * rs), a1 = r[2 * i + 1] * (w[2 * i + 1] * rs);
        const float ang = pf * inv_freq[i];
        const float c = (float)cos((double)ang), sn = (float)sin((double)ang);
        const float o0 = a0 * c - a1 * sn, o1 = a1 * c + a0 * sn;
        if (kc) {
            kc[(size_t)(pos0 + t) * D + h * hd + 2 * i] = __float2half_rn(o0);
            kc[(size_t)(pos0 + t) * D + h * hd + 2 * i + 1] = __float2half_rn(o1);
        } else {
            r[2 * i] = o0;
            r[2 * i + 1] = o1;
        }
    }
    if (kc)
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            vc[(size_t)(pos0 + t) * D + h * hd + i] = __float2half_rn(v[(size_t)t * ld + h * hd + i]);
}

void fmc_dr_norm_rope(float *x, int ld, int T, int n_heads, int hd, const float *w, float eps, int pos0,
                      const float *inv_freq, const float *v, __half *k_cache, __half *v_cache, cudaStream_t s) {
    dim3 grid(T, n_heads);
    /* Each thread reads exactly the pair it writes, so the in-place update needs no barrier. */
    k_dr_norm_rope<<<grid, 64, 0, s>>>(x, ld, hd, w, eps, pos0, inv_freq, v, k_cache, v_cache, n_heads * hd);
}

__global__ void k_dr_attention(const float *q, int ldq, const float *kf, const float *vf, int ldkv, const __half *kh,
                               const __half *vh, int L, int n_heads, int hd, float *o) {
    extern __shared__ float dsh[];
    float *qs = dsh, *sc = dsh + hd;
    const int h = blockIdx.x, t = blockIdx.y, D = n_heads * hd;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = q[(size_t)t * ldq + h * hd + i];
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = wi; j < L; j += nw) {
        float dot = 0.f;
        if (kf)
            for (int i = lane; i < hd; i += 32) dot += qs[i] * kf[(size_t)j * ldkv + h * hd + i];
        else
            for (int i = lane; i < hd; i += 32) dot += qs[i] * __half2float(kh[(size_t)j * D + h * hd + i]);
        dot = warp_sum(dot);
        if (lane == 0) sc[j] = dot * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = threadIdx.x; j < L; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = block_max_f(m);
    float l = 0.f;
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        const float e = expf(sc[j] - m);
        sc[j] = e;
        l += e;
    }
    l = block_sum_f(l);
    const float inv = 1.0f / l;
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        float acc = 0.f;
        if (vf)
            for (int j = 0; j < L; j++) acc += sc[j] * vf[(size_t)j * ldkv + h * hd + i];
        else
            for (int j = 0; j < L; j++) acc += sc[j] * __half2float(vh[(size_t)j * D + h * hd + i]);
        o[(size_t)t * D + h * hd + i] = acc * inv;
    }
}

void fmc_dr_attention(const float *q, int ldq, int T, const float *kf, const float *vf, int ldkv,
                      const __half *kh, const __half *vh, int L, int n_heads, int hd, float *o, cudaStream_t s) {
    const size_t shm = (size_t)(hd + L) * sizeof(float);
    static int raised = 0;
    if (!raised) {
        cudaFuncSetAttribute(k_dr_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
        raised = 1;
    }
    dim3 grid(n_heads, T);
    k_dr_attention<<<grid, 128, shm, s>>>(q, ldq, kf, vf, ldkv, kh, vh, L, n_heads, hd, o);
}

__global__ void k_gate_add(float *x, const float *y, const float *gate, int n, int64_t total) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < total) x[i] += gate[i % n] * y[i];
}

void fmc_gate_add(float *x, const float *y, const float *gate, int T, int n, cudaStream_t s) {
    const int64_t total = (int64_t)T * n;
    k_gate_add<<<(unsigned)((total + 255) / 256), 256, 0, s>>>(x, y, gate, n, total);
}

__global__ void k_gelu(float *x, int64_t n) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

void fmc_gelu(float *x, int64_t n, cudaStream_t s) { k_gelu<<<(unsigned)((n + 255) / 256), 256, 0, s>>>(x, n); }

__global__ void k_broadcast_row(const float *row, int n, float *x) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[(size_t)blockIdx.x * n + i] = row[i];
}

void fmc_broadcast_row(const float *row, int T, int n, float *x, cudaStream_t s) {
    k_broadcast_row<<<T, 256, 0, s>>>(row, n, x);
}
