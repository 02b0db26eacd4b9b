/* cuda_kernels.cu: the CUDA backend's small kernels: argmax over the vocabulary and the drafter's norms,
 * RoPE, attention and element-wise steps. The matrix products are in cuda_q8.cu / cuda_bf16.cu and the
 * target's attention in cuda_attn.cu. Reductions that the CPU reference does in double (norms) are done in
 * double here too. */
#include "cuda/cuda_device.cuh"
#include "cuda/cuda_kernels.cuh"

int fmc_q8_init(void);
int fmc_bf16_init(void);
int fmc_attn_init(void);
static int dr_init(void);

int fmc_init(void) {
    return fmc_q8_init() || fmc_bf16_init() || fmc_attn_init() || dr_init() ? -1 : 0;
}

int fmc_sm_count(void) {
    static int n;
    if (!n) {
        int dev = 0, v = 0;
        n = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess && v > 0
                ? v
                : 132;
    }
    return n;
}

double fmc_mem_gbps_per_sm(void) {
    static double v = -1;
    if (v < 0) {
        int dev = 0, khz = 0, bits = 0;
        v = cudaGetDevice(&dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&bits, cudaDevAttrGlobalMemoryBusWidth, dev) == cudaSuccess
                ? 2.0 * khz * 1e3 * (bits / 8) / 1e9 / fmc_sm_count() /* double data rate */
                : 0;
    }
    return v;
}

/* Sum over the block (blockDim a multiple of 32, <= 1024); every thread gets the result. */
static __device__ double block_sum_d(double v) {
    __shared__ double sh[32];
    return group_sum_d(v, block_group{sh});
}
static __device__ float block_sum_f(float v) {
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
static __device__ float block_max_f(float v) {
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

/* ---- argmax ---- */

enum { ARGMAX_CHUNK = 4096 };

/* grid (ceil(n / ARGMAX_CHUNK), T): each block's best of its chunk, then one atomicMax per block. */
__global__ void k_argmax(const float *x, int n, unsigned long long *out) {
    pdl_trigger();
    pdl_wait();
    const int t = blockIdx.y, c0 = blockIdx.x * ARGMAX_CHUNK, c1 = min(n, c0 + ARGMAX_CHUNK);
    const float *r = x + (size_t)t * n;
    unsigned long long best = 0;
    for (int i = c0 + threadIdx.x; i < c1; i += blockDim.x) {
        const float v = r[i];
        if (v == v) {
            const unsigned long long p = argmax_pack(v, i);
            best = p > best ? p : best;
        }
    }
    block_argmax_to(best, out + t);
}

void fmc_argmax(const float *x, int T, int n, unsigned long long *out, int pdl, cudaStream_t s) {
    fmc_launch(k_argmax, dim3((n + ARGMAX_CHUNK - 1) / ARGMAX_CHUNK, T), dim3(256), 0, s, pdl, x, n, out);
}

/* ---- drafter ---- */

__global__ void k_rmsnorm_rows(const float *x, const float *w, int n, float eps, float *y) {
    pdl_trigger();
    pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += (double)xr[i] * xr[i];
    ss = block_sum_d(ss);
    const float r = (float)(1.0 / sqrt(ss / n + eps));
    for (int i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * (w[i] * r);
}

void fmc_rmsnorm_rows(const float *x, const float *w, int T, int n, float eps, float *y, int pdl,
                      cudaStream_t s) {
    fmc_launch(k_rmsnorm_rows, dim3(T), dim3(256), 0, s, pdl, x, w, n, eps, y);
}

__global__ void k_ln_mod_rows(const float *x, const float *scale, const float *shift, int n, float eps,
                              float *y) {
    pdl_trigger();
    pdl_wait();
    const float *xr = x + (size_t)blockIdx.x * n;
    float *yr = y + (size_t)blockIdx.x * n;
    double su = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) su += xr[i];
    const double mu = block_sum_d(su) / n;
    double q = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) q += (xr[i] - mu) * (xr[i] - mu);
    q = block_sum_d(q);
    const float r = (float)(1.0 / sqrt(q / n + eps)), muf = (float)mu;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        yr[i] = (xr[i] - muf) * r * (1.0f + scale[i]) + shift[i];
}

void fmc_ln_mod_rows(const float *x, const float *scale, const float *shift, int T, int n, float eps,
                     float *y, int pdl, cudaStream_t s) {
    fmc_launch(k_ln_mod_rows, dim3(T), dim3(256), 0, s, pdl, x, scale, shift, n, eps, y);
}

/* (cos, sin) of RoPE pair i at position p: the angle in float, its cosine and sine in double */
__device__ __forceinline__ float2 dr_rot(float p, const float *inv_freq, int i) {
    const float ang = p * inv_freq[i];
    return make_float2((float)cos((double)ang), (float)sin((double)ang));
}

/* Pair (x0, x1) of a head's row RMS-normed (1 / rms: rs) with weights (w0, w1), then rotated by cs: the one
 * copy of this arithmetic for the block (dr_norm_rope_head) and warp (dr_norm_rope_warp) forms. */
__device__ __forceinline__ float2 dr_norm_rot_pair(float x0, float x1, float w0, float w1, float rs,
                                                   float2 cs) {
    const float a0 = x0 * (w0 * rs), a1 = x1 * (w1 * rs);
    return make_float2(a0 * cs.x - a1 * cs.y, a1 * cs.x + a0 * cs.y);
}

/* Row blockIdx.x, head blockIdx.y of one launch of fmc_dr_norm_rope (rotations rope: [T][hd / 2]) or
 * fmc_dr_kv_rows (rope NULL: computed at the rows' positions). */
__device__ __forceinline__ void dr_norm_rope_head(float *x, int ld, int hd, const float *w, float eps,
                                                  const int *dpos, int pos0, const float *inv_freq,
                                                  const float2 *rope, const float *v, __half *kc, __half *vc,
                                                  int D) {
    const int t = blockIdx.x, h = blockIdx.y, half = hd / 2;
    const int p0 = pos0 + (dpos ? *dpos : 0);
    float *r = x + (size_t)t * ld + h * hd;
    double ss = 0;
    /* x and v may come from further back than the kernel before (the context's layers): through L2 */
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const double xi = __ldcg(r + i);
        ss += xi * xi;
    }
    ss = block_sum_d(ss);
    const float rs = (float)(1.0 / sqrt(ss / hd + eps));
    const float pf = (float)(p0 + t);
    const size_t at = (size_t)(p0 + t) * D + h * hd; /* the row's head in the caches */
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float2 cs = rope ? rope[(size_t)t * half + i] : dr_rot(pf, inv_freq, i);
        const float2 o =
            dr_norm_rot_pair(__ldcg(r + 2 * i), __ldcg(r + 2 * i + 1), w[2 * i], w[2 * i + 1], rs, cs);
        if (kc) {
            kc[at + 2 * i] = __float2half_rn(o.x);
            kc[at + 2 * i + 1] = __float2half_rn(o.y);
        } else {
            r[2 * i] = o.x;
            r[2 * i + 1] = o.y;
        }
    }
    if (kc)
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            vc[at + i] = __float2half_rn(__ldcg(v + (size_t)t * ld + h * hd + i));
}

/* grid (T, n_heads) */
__global__ void k_dr_norm_rope(float *x, int ld, int hd, const float *w, float eps, const float2 *rope,
                               int D) {
    pdl_trigger();
    pdl_wait();
    dr_norm_rope_head(x, ld, hd, w, eps, NULL, 0, NULL, rope, NULL, NULL, NULL, D);
}

/* grid (T, n_heads, layers): layer blockIdx.z's cross keys and values into its caches. */
__global__ void k_dr_kv_layers(float *x, int ld, int hd, size_t lstride, size_t vofs,
                               const fmc_dr_kv_layers L, float eps, const int *dpos, int pos0,
                               const float *inv_freq, int D) {
    pdl_trigger();
    pdl_wait();
    const int l = blockIdx.z;
    float *xl = x + (size_t)l * lstride;
    dr_norm_rope_head(xl, ld, hd, L.w[l], eps, dpos, pos0, inv_freq, NULL, xl + vofs, L.kc[l], L.vc[l], D);
}

void fmc_dr_norm_rope(float *x, int ld, int T, int n_heads, int hd, const float *w, float eps,
                      const float2 *rope, int pdl, cudaStream_t s) {
    /* Each thread reads exactly the pair it writes, so the in-place update needs no barrier. */
    fmc_launch(k_dr_norm_rope, dim3(T, n_heads), dim3(64), 0, s, pdl, x, ld, hd, w, eps, rope, n_heads * hd);
}

void fmc_dr_kv_rows(float *x, int ld, int T, int n_heads, int hd, int n_layers, size_t lstride, size_t vofs,
                    const fmc_dr_kv_layers *L, float eps, const int *dpos, int pos0, const float *inv_freq,
                    int pdl, cudaStream_t s) {
    fmc_launch(k_dr_kv_layers, dim3(T, n_heads, n_layers), dim3(64), 0, s, pdl, x, ld, hd, lstride, vofs, *L,
               eps, dpos, pos0, inv_freq, n_heads * hd);
}

/* Row src (hd values) of a head RMS-normed with w and rotated by rot ([hd / 2] (cos, sin)) as
 * dr_norm_rope_head does, by one warp, into dst (shared memory). */
__device__ __forceinline__ void dr_norm_rope_warp(const float *src, const float *w, float eps, int hd,
                                                  const float2 *rot, float *dst) {
    const int lane = threadIdx.x & 31, half = hd / 2;
    float2 v[FMC_DR_HD_MAX / 64];
    double ss = 0;
#pragma unroll
    for (int k = 0; k < FMC_DR_HD_MAX / 64; k++) {
        const int i = lane + 32 * k;
        v[k] = i < half ? __ldcg((const float2 *)src + i) : make_float2(0.f, 0.f);
        ss += (double)v[k].x * v[k].x + (double)v[k].y * v[k].y;
    }
    ss = warp_sum_d(ss);
    const float rs = (float)(1.0 / sqrt(ss / hd + eps));
#pragma unroll
    for (int k = 0; k < FMC_DR_HD_MAX / 64; k++) {
        const int i = lane + 32 * k;
        if (i >= half) break;
        *(float2 *)(dst + 2 * i) = dr_norm_rot_pair(v[k].x, v[k].y, w[2 * i], w[2 * i + 1], rs, rot[i]);
    }
}

/* grid (n_heads, T), DR_SELF_THREADS threads: the drafter's self-attention of slot t, head h over the T
 * slots' keys, no mask: the query and the T keys normed and rotated here into shared memory, beside the T
 * values, then scores, softmax, weighted sum of the values. One kernel where the norms and RoPE were one of
 * their own before (~4.5 us a layer), each block norming the 16 keys it reads instead of one row. */
enum { DR_SELF_THREADS = 256 };
__global__ void __launch_bounds__(DR_SELF_THREADS)
    k_dr_self_attention(const float *qkv, int ld, int T, int n_heads, int hd, const float *wq,
                        const float *wk, float eps, const float2 *rope, float *o, int8_t *xq, float *xd) {
    extern __shared__ float dsh[];
    pdl_trigger();
    pdl_wait(); /* the rows come from the kernel before */
    const int h = blockIdx.x, t = blockIdx.y, D = n_heads * hd;
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = DR_SELF_THREADS / 32;
    float *qs = dsh, *ks = dsh + hd, *vs = ks + (size_t)T * hd, *sc = vs + (size_t)T * hd;
    for (int r = wi; r <= 2 * T; r += nw) { /* row 0: the query; 1 + j: key j; 1 + T + j: value j */
        if (r > T) {
            const float *src = qkv + (size_t)(r - 1 - T) * ld + 2 * D + h * hd;
            for (int i = lane; i < hd; i += 32) vs[(size_t)(r - 1 - T) * hd + i] = __ldcg(src + i);
            continue;
        }
        const int slot = r ? r - 1 : t;
        const float *src = qkv + (size_t)slot * ld + (r ? D : 0) + h * hd;
        dr_norm_rope_warp(src, r ? wk : wq, eps, hd, rope + (size_t)slot * (hd / 2),
                          r ? ks + (size_t)(r - 1) * hd : qs);
    }
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    for (int j = wi; j < T; j += nw) {
        float dot = 0.f;
        for (int i = lane; i < hd; i += 32) dot += qs[i] * ks[(size_t)j * hd + i];
        dot = warp_sum(dot);
        if (lane == 0) sc[j] = dot * scale;
    }
    __syncthreads();
    float m = -INFINITY;
    for (int j = threadIdx.x; j < T; j += DR_SELF_THREADS) m = fmaxf(m, sc[j]);
    m = block_max_f(m);
    float l = 0.f;
    for (int j = threadIdx.x; j < T; j += DR_SELF_THREADS) {
        const float e = expf(sc[j] - m);
        sc[j] = e;
        l += e;
    }
    l = block_sum_f(l);
    const float inv = 1.0f / l;
    for (int i = threadIdx.x; i < hd; i += DR_SELF_THREADS) {
        float acc = 0.f;
        for (int j = 0; j < T; j++) acc += sc[j] * vs[(size_t)j * hd + i];
        const float v = acc * inv;
        if (!xq) {
            o[(size_t)t * D + h * hd + i] = v;
            continue;
        }
        /* quantised for the next Q8_0 product as its activation quantiser would (hd % 32 == 0: a warp holds
         * one 32-block of the row) */
        float d;
        xq[frag_off(t, h * hd + i, D / 32)] = quant_lane(v, &d);
        if (lane == 0) xd[frag_d(t, (h * hd + i) / 32, D / 32)] = d;
    }
}

static int dr_init(void) {
    const int shm = (FMC_DR_HD_MAX * (2 * FMC_DR_MAX_SLOTS + 1) + FMC_DR_MAX_SLOTS) * (int)sizeof(float);
    return cudaFuncSetAttribute(k_dr_self_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, shm) ==
                   cudaSuccess
               ? 0
               : -1;
}

void fmc_dr_self_attention(const float *qkv, int ld, int T, int n_heads, int hd, const float *wq,
                           const float *wk, float eps, const float2 *rope, float *o, int8_t *xq, float *xd,
                           int pdl, cudaStream_t s) {
    const size_t shm = ((size_t)hd * (2 * T + 1) + T) * sizeof(float);
    fmc_launch(k_dr_self_attention, dim3(n_heads, T), dim3(DR_SELF_THREADS), shm, s, pdl, qkv, ld, T, n_heads,
               hd, wq, wk, eps, rope, o, xq, xd);
}

/* grid (T): slot t's input row and its rotations. */
__global__ void k_dr_slots(const float *row, int n, float *x, const int *dpos, int pos0,
                           const float *inv_freq, int half, float2 *rope) {
    pdl_trigger();
    pdl_wait(); /* x and rope may still be read by the kernels before */
    const int t = blockIdx.x;
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[(size_t)t * n + i] = row[i];
    const float p = (float)(pos0 + *dpos + t);
    for (int i = threadIdx.x; i < half; i += blockDim.x) rope[(size_t)t * half + i] = dr_rot(p, inv_freq, i);
}

void fmc_dr_slots(const float *row, int T, int n, float *x, const int *dpos, int pos0, const float *inv_freq,
                  int half, float2 *rope, int pdl, cudaStream_t s) {
    fmc_launch(k_dr_slots, dim3(T), dim3(256), 0, s, pdl, row, n, x, dpos, pos0, inv_freq, half, rope);
}
