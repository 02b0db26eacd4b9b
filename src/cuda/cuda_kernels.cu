/* cuda_kernels.cu: the CUDA backend's small kernels: argmax over the vocabulary and the drafter's norms,
 * RoPE, attention and element-wise steps. The matrix products are in cuda_q8.cu / cuda_bf16.cu and the
 * target's attention in cuda_attn.cu. Reductions that the CPU reference does in double (norms) are done in
 * double here too. */
#include "cuda/cuda_device.cuh"
#include "cuda/cuda_kernels.cuh"

int fmc_q8_init(void);
int fmc_bf16_init(void);
int fmc_attn_init(void);
__global__ void k_dr_attention(const float *q, int ldq, const float *kf, const float *vf, int ldkv,
                               const __half *kh, const __half *vh, const int *dL, int L0, int n_heads, int hd,
                               float *o, int8_t *xq, float *xd);

int fmc_init(void) {
    if (fmc_q8_init() || fmc_bf16_init() || fmc_attn_init()) return -1;
    const int shm = (256 + FMC_DR_ATT_MAX_L) * (int)sizeof(float);
    return cudaFuncSetAttribute(k_dr_attention, cudaFuncAttributeMaxDynamicSharedMemorySize, shm) ==
                   cudaSuccess
               ? 0
               : -1;
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

/* Row blockIdx.x, head blockIdx.y of one launch of fmc_dr_norm_rope (heads past n_heads: the second set). */
__device__ __forceinline__ void dr_norm_rope_head(float *x, int ld, int hd, const float *w, const float *w2,
                                                  float eps, const int *dpos, int pos0, const float *inv_freq,
                                                  const float *v, __half *kc, __half *vc, int D) {
    const int set = blockIdx.y * hd >= D, t = blockIdx.x, h = blockIdx.y - set * (D / hd), half = hd / 2;
    const int p0 = pos0 + (dpos ? *dpos : 0);
    if (set) w = w2;
    float *r = x + (size_t)t * ld + set * D + h * hd;
    double ss = 0;
    /* x and v may come from further back than the kernel before (the context's layers): through L2 */
    for (int i = threadIdx.x; i < hd; i += blockDim.x) {
        const double xi = __ldcg(r + i);
        ss += xi * xi;
    }
    ss = block_sum_d(ss);
    const float rs = (float)(1.0 / sqrt(ss / hd + eps));
    const float pf = (float)(p0 + t);
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        const float a0 = __ldcg(r + 2 * i) * (w[2 * i] * rs),
                    a1 = __ldcg(r + 2 * i + 1) * (w[2 * i + 1] * rs);
        const float ang = pf * inv_freq[i];
        const float c = (float)cos((double)ang), sn = (float)sin((double)ang);
        const float o0 = a0 * c - a1 * sn, o1 = a1 * c + a0 * sn;
        if (kc) {
            kc[(size_t)(p0 + t) * D + h * hd + 2 * i] = __float2half_rn(o0);
            kc[(size_t)(p0 + t) * D + h * hd + 2 * i + 1] = __float2half_rn(o1);
        } else {
            r[2 * i] = o0;
            r[2 * i + 1] = o1;
        }
    }
    if (kc)
        for (int i = threadIdx.x; i < hd; i += blockDim.x)
            vc[(size_t)(p0 + t) * D + h * hd + i] = __float2half_rn(__ldcg(v + (size_t)t * ld + h * hd + i));
}

/* grid (T, n_heads or 2 n_heads with w2: blocks of the second set take the heads after the first). */
__global__ void k_dr_norm_rope(float *x, int ld, int hd, const float *w, const float *w2, float eps,
                               const int *dpos, int pos0, const float *inv_freq, int D) {
    pdl_trigger();
    pdl_wait();
    dr_norm_rope_head(x, ld, hd, w, w2, eps, dpos, pos0, inv_freq, NULL, NULL, NULL, D);
}

/* grid (T, n_heads, layers): layer blockIdx.z's cross keys and values into its caches. */
__global__ void k_dr_kv_layers(float *x, int ld, int hd, size_t lstride, size_t vofs,
                               const fmc_dr_kv_layers L, float eps, const int *dpos, int pos0,
                               const float *inv_freq, int D) {
    pdl_trigger();
    pdl_wait();
    const int l = blockIdx.z;
    float *xl = x + (size_t)l * lstride;
    dr_norm_rope_head(xl, ld, hd, L.w[l], NULL, eps, dpos, pos0, inv_freq, xl + vofs, L.kc[l], L.vc[l], D);
}

void fmc_dr_norm_rope(float *x, int ld, int T, int n_heads, int hd, const float *w, const float *w2,
                      float eps, const int *dpos, int pos0, const float *inv_freq, int pdl, cudaStream_t s) {
    const dim3 grid(T, w2 ? 2 * n_heads : n_heads);
    /* Each thread reads exactly the pair it writes, so the in-place update needs no barrier. */
    fmc_launch(k_dr_norm_rope, grid, dim3(64), 0, s, pdl, x, ld, hd, w, w2, eps, dpos, pos0, inv_freq,
               n_heads * hd);
}

void fmc_dr_kv_rows(float *x, int ld, int T, int n_heads, int hd, int n_layers, size_t lstride, size_t vofs,
                    const fmc_dr_kv_layers *L, float eps, const int *dpos, int pos0, const float *inv_freq,
                    int pdl, cudaStream_t s) {
    fmc_launch(k_dr_kv_layers, dim3(T, n_heads, n_layers), dim3(64), 0, s, pdl, x, ld, hd, lstride, vofs, *L,
               eps, dpos, pos0, inv_freq, n_heads * hd);
}

/* grid (n_heads, T), 128 threads: scores of all L keys in shared memory (L read from the device so that a
 * captured graph serves every position), softmax, weighted sum. */
__global__ void k_dr_attention(const float *q, int ldq, const float *kf, const float *vf, int ldkv,
                               const __half *kh, const __half *vh, const int *dL, int L0, int n_heads, int hd,
                               float *o, int8_t *xq, float *xd) {
    extern __shared__ float dsh[];
    pdl_trigger();
    pdl_wait(); /* q and k come from the kernel before; v from further back: read through L2 (__ldcg) */
    float *qs = dsh, *sc = dsh + hd;
    const int h = blockIdx.x, t = blockIdx.y, D = n_heads * hd, L = L0 + (dL ? *dL : 0);
    for (int i = threadIdx.x; i < hd; i += blockDim.x) qs[i] = __ldcg(q + (size_t)t * ldq + h * hd + i);
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int j = wi; j < L; j += nw) {
        float dot = 0.f;
        if (kf)
            for (int i = lane; i < hd; i += 32) dot += qs[i] * __ldcg(kf + (size_t)j * ldkv + h * hd + i);
        else
            for (int i = lane; i < hd; i += 32)
                dot += qs[i] * __half2float(__ldcg(kh + (size_t)j * D + h * hd + i));
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
            for (int j = 0; j < L; j++) acc += sc[j] * __ldcg(vf + (size_t)j * ldkv + h * hd + i);
        else
            for (int j = 0; j < L; j++) acc += sc[j] * __half2float(__ldcg(vh + (size_t)j * D + h * hd + i));
        const float v = acc * inv;
        if (!xq) {
            o[(size_t)t * D + h * hd + i] = v;
            continue;
        }
        /* quantised for the next Q8_0 product as its activation quantiser would (hd % 32 == 0: a warp holds
         * one 32-block of the row) */
        float d;
        xq[frag_off(t, h * hd + i, D / 32)] = quant_lane(v, &d);
        if ((threadIdx.x & 31) == 0) xd[frag_d(t, (h * hd + i) / 32, D / 32)] = d;
    }
}

void fmc_dr_attention(const float *q, int ldq, int T, const float *kf, const float *vf, int ldkv,
                      const __half *kh, const __half *vh, const int *dL, int L0, int Lmax, int n_heads,
                      int hd, float *o, int8_t *xq, float *xd, int pdl, cudaStream_t s) {
    /* With dL, shared memory for Lmax keys, so that the launch does not depend on the position. */
    const size_t shm = (size_t)(hd + (dL ? Lmax : L0)) * sizeof(float);
    dim3 grid(n_heads, T);
    fmc_launch(k_dr_attention, grid, dim3(128), shm, s, pdl, q, ldq, kf, vf, ldkv, kh, vh, dL, L0, n_heads,
               hd, o, xq, xd);
}

__global__ void k_broadcast_row(const float *row, int n, float *x) {
    pdl_trigger();
    pdl_wait(); /* x may still be read by the kernels before */
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[(size_t)blockIdx.x * n + i] = row[i];
}

void fmc_broadcast_row(const float *row, int T, int n, float *x, int pdl, cudaStream_t s) {
    fmc_launch(k_broadcast_row, dim3(T), dim3(256), 0, s, pdl, row, n, x);
}
