/* cuda_attn.cu: the target's attention on the GPU: q/k RMSNorm + NEOX RoPE + the KV-cache write, then
 * split-K attention ("flash decoding") and the merge of the splits with the Q8_0 quantisation of the output.
 *
 * Splits have fixed boundaries (multiples of FMC_ATT_SPLIT keys), and each (row, head, split) is computed by
 * one warp with the same code whatever T is and whichever warp it lands on: lanes own keys for the scores,
 * dims for the weighted sum. A block loads one split of one KV head into shared memory once and serves all
 * query heads of the group and up to ATT_ROWS rows of a verify block, so a verify block reads the cache
 * about once instead of once per row and head. */
#include "cuda/cuda_device.cuh"
#include "cuda/cuda_kernels.cuh"

enum { ATT_ROWS = 4, ATT_WARPS = 8 };

static __device__ double block_sum_d(double v) {
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

/* grid (T, n_heads + 2 n_kv); q and k heads: RMSNorm then NEOX rotation; v heads: copied to the cache. */
__global__ void k_qk_norm_rope_kv(const float *qkv, int n_heads, int n_kv, int hd, const float *q_norm,
                                  const float *k_norm, float eps, const float *rope, const int *pos,
                                  float *q_out, __half *k_cache, __half *v_cache) {
    pdl_trigger();
    pdl_wait();
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
                         __half *k_cache, __half *v_cache, int pdl, cudaStream_t s) {
    fmc_launch(k_qk_norm_rope_kv, dim3(T, n_heads + 2 * n_kv), dim3(64), 0, s, pdl, qkv, n_heads, n_kv, hd,
               q_norm, k_norm, eps, rope, pos, q_out, k_cache, v_cache);
}

static size_t attn_smem(int hd) {
    return (size_t)FMC_ATT_SPLIT * (hd / 2 + 1) * 4 + (size_t)FMC_ATT_SPLIT * hd * 2 +
           (size_t)ATT_WARPS * hd * 4 + (size_t)ATT_WARPS * FMC_ATT_SPLIT * 4;
}

/* grid (min(max_splits, ATT_SPLIT_BLOCKS), n_kv, ceil(T / ATT_ROWS)), ATT_WARPS warps; block x takes splits
 * x, x + gridDim.x, ... (so that a graph sized for the whole context launches few idle blocks). Split s: keys
 * [j0, j0 + 64), j0 = 64 s, of KV head g, for rows t in [tb, tb + ATT_ROWS) whose length passes j0; the
 * length of row t is pos + t + 1 (causal) or pos + 1 (every row, no mask). Smem: K as half2 words [64][hd/2 +
 * 1] (the pad puts lane j's row j in bank j), V [64][hd], per-warp q [hd] and probabilities [64]. */
__global__ void __launch_bounds__(ATT_WARPS * 32)
    k_attn_split(const float *q, int T, int n_heads, int n_kv, int hd, const __half *kc, const __half *vc,
                 const int *pos, int causal, int max_splits, float *part) {
    extern __shared__ __align__(16) unsigned char smem[];
    pdl_trigger();
    /* *pos comes from the host before the graph; cache rows below it were written by earlier forwards, so
     * the first split's rows below it load before the predecessor (which writes rows pos ..) is done. */
    const int g = blockIdx.y, tb = blockIdx.z * ATT_ROWS, p0 = *pos, te = min(T, tb + ATT_ROWS);
    const int kv_dim = n_kv * hd, hd2 = hd / 2, G = n_heads / n_kv, c8n = hd / 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int maxlen = causal ? p0 + te : p0 + 1; /* the longest row of the block */
    uint32_t *Ks = (uint32_t *)smem;
    __half *Vs = (__half *)(Ks + FMC_ATT_SPLIT * (hd2 + 1));
    float *qs = (float *)(Vs + FMC_ATT_SPLIT * hd);
    float *pw = qs + ATT_WARPS * hd;
    float *qw = qs + warp * hd, *pr = pw + warp * FMC_ATT_SPLIT;
    const float scale = 1.0f / sqrtf((float)hd);
    bool waited = false;
    for (int s = blockIdx.x; s < max_splits; s += gridDim.x) {
        const int j0 = s * FMC_ATT_SPLIT;
        if (tb >= T || maxlen <= j0) break;
        const int nload = min(FMC_ATT_SPLIT, maxlen - j0);
        /* All of a thread's 16-byte loads in flight at once (at most 8 each for K and V: 64 keys x 256 dims).
         */
        int4 kr[8], vr[8];
        for (int pass = 0; pass < 2; pass++) {
            if (pass == 1 && !waited) pdl_wait(), waited = true;
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int idx = threadIdx.x + u * ATT_WARPS * 32, j = idx / c8n, c8 = idx - j * c8n;
                if (idx < nload * c8n && (j0 + j < p0) == (pass == 0)) {
                    const size_t off = (size_t)(j0 + j) * kv_dim + (size_t)g * hd + c8 * 8;
                    kr[u] = __ldcg((const int4 *)(kc + off));
                    vr[u] = __ldcg((const int4 *)(vc + off));
                }
            }
        }
#pragma unroll
        for (int u = 0; u < 8; u++) {
            const int idx = threadIdx.x + u * ATT_WARPS * 32;
            if (idx < nload * c8n) {
                const int j = idx / c8n, c8 = idx - j * c8n;
                uint32_t *kd = Ks + j * (hd2 + 1) + c8 * 4;
                kd[0] = (uint32_t)kr[u].x, kd[1] = (uint32_t)kr[u].y, kd[2] = (uint32_t)kr[u].z,
                kd[3] = (uint32_t)kr[u].w;
                *(int4 *)(Vs + j * hd + c8 * 8) = vr[u];
            }
        }
        __syncthreads();
        const int npairs = (te - tb) * G;
        for (int pi = warp; pi < npairs; pi += ATT_WARPS) {
            const int t = tb + pi / G, h = g * G + pi % G, len = causal ? p0 + t + 1 : p0 + 1;
            if (len <= j0) continue;
            const int n = min(FMC_ATT_SPLIT, len - j0);
            for (int i = lane; i < hd; i += 32) qw[i] = ld_cg(q + (size_t)t * n_heads * hd + h * hd + i);
            __syncwarp();
            float sc[2];
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int j = lane + 32 * half;
                float d = -INFINITY;
                if (j < n) {
                    const uint32_t *krow = Ks + j * (hd2 + 1);
                    d = 0.0f;
#pragma unroll 8
                    for (int i = 0; i < hd2; i++) {
                        const uint32_t u = krow[i];
                        const float2 kf = __half22float2(*(const __half2 *)&u);
                        d = __fmaf_rn(qw[2 * i], kf.x, d);
                        d = __fmaf_rn(qw[2 * i + 1], kf.y, d);
                    }
                    d *= scale;
                }
                sc[half] = d;
            }
            const float m = warp_max(fmaxf(sc[0], sc[1]));
            const float e0 = lane < n ? expf(sc[0] - m) : 0.0f, e1 = lane + 32 < n ? expf(sc[1] - m) : 0.0f;
            const float l = warp_sum(e0 + e1);
            pr[lane] = e0;
            pr[lane + 32] = e1;
            __syncwarp();
            float o[8];
#pragma unroll
            for (int k = 0; k < 8; k++) o[k] = 0.0f;
#pragma unroll 4
            for (int j = 0; j < n; j++) {
                const float pj = pr[j];
                const __half *vrow = Vs + j * hd + lane;
#pragma unroll
                for (int k = 0; k < 8; k++)
                    if (lane + 32 * k < hd) o[k] = __fmaf_rn(pj, __half2float(vrow[32 * k]), o[k]);
            }
            float *out = part + (((size_t)t * n_heads + h) * max_splits + s) * (hd + 2);
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (lane + 32 * k < hd) out[lane + 32 * k] = o[k];
            if (lane == 0) out[hd] = m, out[hd + 1] = l;
            __syncwarp(); /* qw and pr are rewritten by the next pair */
        }
        __syncthreads(); /* Ks / Vs are rewritten by the next split */
    }
    if (!waited) pdl_wait();
}

/* grid (n_heads, T), hd threads: merge the splits in split order, then quantise the head's hd outputs (one
 * Q8_0 block per warp) into fragment order (xq != NULL), or store them as f32 rows of out. Smem: the splits'
 * maxima and sums. */
__global__ void k_attn_combine(int n_heads, int hd, const int *pos, int causal, int max_splits,
                               const float *part, int8_t *xq, float *xd, float *out) {
    extern __shared__ float cs[];
    pdl_trigger();
    pdl_wait();
    const int h = blockIdx.x, t = blockIdx.y, i = threadIdx.x, NB = n_heads * hd / 32;
    const int len = causal ? *pos + t + 1 : *pos + 1, ns = (len + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
    const float *pr = part + ((size_t)t * n_heads + h) * max_splits * (hd + 2);
    float *ms = cs, *ls = cs + max_splits;
    for (int s = i; s < ns; s += blockDim.x) {
        ms[s] = pr[(size_t)s * (hd + 2) + hd];
        ls[s] = pr[(size_t)s * (hd + 2) + hd + 1];
    }
    __syncthreads();
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, ms[s]);
    float L = 0.f, o = 0.f;
#pragma unroll 8
    for (int s = 0; s < ns; s++) {
        const float w = expf(ms[s] - M);
        L = __fmaf_rn(ls[s], w, L);
        o = __fmaf_rn(pr[(size_t)s * (hd + 2) + i], w, o);
    }
    const int k = h * hd + i;
    if (!xq) {
        out[(size_t)t * n_heads * hd + k] = o / L;
        return;
    }
    float d;
    xq[frag_off(t, k, NB)] = quant_lane(o / L, &d);
    if ((i & 31) == 0) xd[frag_d(t, k / 32, NB)] = d;
}

enum { ATT_SPLIT_BLOCKS = 16 };

int fmc_attn_init(void) {
    return cudaFuncSetAttribute(k_attn_split, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                (int)attn_smem(256)) == cudaSuccess
               ? 0
               : -1;
}

static void attention(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                      const __half *v_cache, const int *pos, int causal, int max_splits, float *part,
                      int8_t *xq, float *xd, float *out, int pdl, cudaStream_t s) {
    const int sb = max_splits < ATT_SPLIT_BLOCKS ? max_splits : ATT_SPLIT_BLOCKS;
    fmc_launch(k_attn_split, dim3(sb, n_kv, (T + ATT_ROWS - 1) / ATT_ROWS), dim3(ATT_WARPS * 32),
               attn_smem(hd), s, pdl, q, T, n_heads, n_kv, hd, k_cache, v_cache, pos, causal, max_splits,
               part);
    fmc_launch(k_attn_combine, dim3(n_heads, T), dim3(hd), (size_t)2 * max_splits * sizeof(float), s, pdl,
               n_heads, hd, pos, causal, max_splits, (const float *)part, xq, xd, out);
}

void fmc_attention_quant(const float *q, int T, int n_heads, int n_kv, int hd, const __half *k_cache,
                         const __half *v_cache, const int *pos, int max_splits, float *part, int8_t *xq,
                         float *xd, int pdl, cudaStream_t s) {
    attention(q, T, n_heads, n_kv, hd, k_cache, v_cache, pos, 1, max_splits, part, xq, xd, NULL, pdl, s);
}

void fmc_attention_f32(const float *q, int T, int n_heads, int hd, const __half *k_cache,
                       const __half *v_cache, const int *pos, int max_splits, float *part, float *out,
                       cudaStream_t s) {
    attention(q, T, n_heads, n_heads, hd, k_cache, v_cache, pos, 0, max_splits, part, NULL, NULL, out, 0, s);
}
