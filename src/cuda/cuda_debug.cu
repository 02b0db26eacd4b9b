/* cuda_debug.cu: device checks of the CUDA backend for the GPU tests and the benchmark: copy bandwidth, the
 * device's name, and the Q8_0 / BF16 products run alone on caller data (kernel tests against the CPU's
 * scalar references). See cuda_debug.h. */
#include <stdio.h>

#include <algorithm>
#include <vector>

#include "cuda/cuda_debug.h"
#include "cuda/cuda_kernels.cuh"

extern "C" double fm_cuda_debug_copy_bandwidth(size_t bytes, int reps) {
    void *a = NULL, *c = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&c, bytes) != cudaSuccess) {
        cudaFree(a);
        return 0;
    }
    cudaMemset(a, 1, bytes);
    const double ms =
        fmc_median_ms([&] { cudaMemcpyAsync(c, a, bytes, cudaMemcpyDeviceToDevice, 0); }, 0, 2, reps);
    cudaFree(a);
    cudaFree(c);
    return ms > 0 ? 2.0 * (double)bytes / (ms * 1e-3) / 1e9 : 0;
}

extern "C" void fm_cuda_debug_device_name(char *buf, size_t len) {
    cudaDeviceProp p;
    int drv = 0, rt = 0;
    cudaDriverGetVersion(&drv);
    cudaRuntimeGetVersion(&rt);
    if (cudaGetDeviceProperties(&p, 0) != cudaSuccess) {
        snprintf(buf, len, "no device");
        return;
    }
    snprintf(buf, len, "%s (%d SMs, %.1f GiB, peak memory %.0f GB/s an SM, CUDA driver API %d, runtime %d)",
             p.name, p.multiProcessorCount, (double)p.totalGlobalMem / (1 << 30), fmc_mem_gbps_per_sm(), drv,
             rt);
}

extern "C" void fm_cuda_debug_sync(void) {
    cudaDeviceSynchronize();
}

/* Device copies of host arrays, freed together. */
struct dev_bufs {
    std::vector<void *> p;
    ~dev_bufs() {
        for (void *q : p) cudaFree(q);
    }
    void *up(const void *src, size_t bytes) {
        void *d = NULL;
        if (cudaMalloc(&d, bytes ? bytes : 16) != cudaSuccess) return NULL;
        p.push_back(d);
        if (src) cudaMemcpy(d, src, bytes, cudaMemcpyHostToDevice);
        return d;
    }
};

/* Split-K scratch and zeroed counters for one product. */
static int attach(dev_bufs *d, fmc_split *sp, int N) {
    size_t part;
    int cnt;
    fmc_split_scratch(sp, N, &part, &cnt);
    sp->part = (float *)d->up(NULL, part * 4 + 4);
    sp->cnt = (unsigned *)d->up(NULL, (size_t)cnt * 4 + 4);
    return !sp->part || !sp->cnt || cudaMemset(sp->cnt, 0, (size_t)cnt * 4 + 4) != cudaSuccess;
}

/* A Q8_0 matrix from N rows of K/32 GGUF blocks on the host: uploaded, repacked, split scratch attached. */
static int q8_upload(dev_bufs *d, const void *blocks, int N, int K, int glu, fmc_q8 *w) {
    size_t qb, sb;
    fmc_q8_bytes(N, K, &qb, &sb);
    void *db = d->up(blocks, (size_t)N * (K / 32) * 34);
    int4 *qs = (int4 *)d->up(NULL, qb);
    uint32_t *sc = (uint32_t *)d->up(NULL, sb);
    if (!db || !qs || !sc) return -1;
    fmc_q8_repack(db, N, K, glu, qs, sc, w, 0);
    return attach(d, &w->sp, N);
}

/* Waits for the launches, checks them, and copies `bytes` of device src to host dst. */
static int read_back(void *dst, const void *src, size_t bytes) {
    if (cudaDeviceSynchronize() != cudaSuccess || cudaGetLastError() != cudaSuccess) return -1;
    return cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost) == cudaSuccess ? 0 : -1;
}

extern "C" int fm_cuda_debug_set_cluster(int on) {
    return fmc_q8_set_cluster(on);
}

extern "C" int fm_cuda_debug_q8_matmul(const void *blocks, int N, int K, const float *x, const float *nw,
                                       float eps, int T, int chunk, int glu, float *y) {
    if (fmc_init() || K % 32 || (glu && N % 64)) return -1;
    dev_bufs d;
    fmc_q8 w;
    if (q8_upload(&d, blocks, N, K, glu, &w)) return -1;
    float *dx = (float *)d.up(x, (size_t)T * K * 4);
    float *dn = nw ? (float *)d.up(nw, (size_t)K * 4) : NULL;
    const int F = N / 2;
    float *dy = (float *)d.up(NULL, (size_t)T * N * 4);
    /* Launches of `chunk` tokens; each has its own fragment-order region of RS tokens (a multiple of 8). */
    const int nch = (T + chunk - 1) / chunk, RS = (chunk + 7) / 8 * 8;
    const size_t TR = (size_t)nch * RS;
    int8_t *xq = (int8_t *)d.up(NULL, TR * K), *oq = (int8_t *)d.up(NULL, TR * F);
    float *xd = (float *)d.up(NULL, TR * (K / 32) * 4), *od = (float *)d.up(NULL, TR * (F / 32) * 4);
    if (!dx || (nw && !dn) || !dy || !xq || !oq || !xd || !od) return -1;
    for (int ci = 0; ci < nch; ci++) {
        const int t0 = ci * chunk, n = T - t0 < chunk ? T - t0 : chunk;
        const size_t r0 = (size_t)ci * RS;
        const fmc_q8_in in = {xq + r0 * K, xd + r0 * (K / 32), dx + (size_t)t0 * K, K, dn, eps};
        if (glu)
            fmc_q8_glu(&w, &in, n, oq + r0 * F, od + r0 * (F / 32), 0, 0);
        else
            fmc_q8_matmul(&w, &in, n, dy + (size_t)t0 * N, N, 0, NULL, 0, 0, 0);
    }
    if (!glu) return read_back(y, dy, (size_t)T * N * 4);
    std::vector<int8_t> hq(TR * F);
    std::vector<float> hd(TR * (F / 32));
    if (read_back(hq.data(), oq, hq.size()) || read_back(hd.data(), od, hd.size() * 4)) return -1;
    /* Back from fragment order (see frag_off in cuda_device.cuh); token t sits at tr in its chunk's region.
     */
    const int FB = F / 32;
    for (int t = 0; t < T; t++) {
        const size_t tr = (size_t)(t / chunk) * RS + t % chunk;
        for (int k = 0; k < F; k++) {
            const int kk = k & 31, m = kk >> 2;
            const size_t blk = (tr >> 3) * FB + (k >> 5);
            const size_t off = (blk * 32 + (tr & 7) * 4 + (m & 3)) * 8 + (m >> 2) * 4 + (kk & 3);
            y[(size_t)t * F + k] = hd[blk * 8 + (tr & 7)] * (float)hq[off];
        }
    }
    return 0;
}

extern "C" int fm_cuda_debug_bf16_matmul(const uint16_t *wt, int N, int K, const float *x, int T,
                                         const float *bias, int mode, const float *gate, float *y) {
    if (fmc_init() || K % 16) return -1;
    dev_bufs d;
    size_t bytes;
    fmc_bf16_bytes(N, K, &bytes);
    void *dw = d.up(wt, (size_t)N * K * 2);
    uint4 *w4 = (uint4 *)d.up(NULL, bytes);
    float *dx = (float *)d.up(x, (size_t)T * K * 4);
    float *dbias = bias ? (float *)d.up(bias, (size_t)N * 4) : NULL;
    float *dgate = gate ? (float *)d.up(gate, (size_t)N * 4) : NULL;
    float *dy = (float *)d.up(y, (size_t)T * N * 4); /* y holds the residual for GATE_ADD */
    if (!dw || !w4 || !dx || (bias && !dbias) || (gate && !dgate) || !dy) return -1;
    fmc_bf16 w;
    fmc_bf16_repack(dw, N, K, w4, &w, 0);
    if (attach(&d, &w.sp, N)) return -1;
    fmc_bf16_matmul(&w, dx, K, T, dy, N, dbias, mode, dgate, 0, 0);
    return read_back(y, dy, (size_t)T * N * 4);
}

extern "C" int fm_cuda_debug_q8_dmatmul(const void *blocks, int N, int K, const float *x, int T,
                                        const float *bias, int mode, const float *gate, float *y) {
    if (fmc_init() || K % 32) return -1;
    dev_bufs d;
    fmc_q8 w;
    if (q8_upload(&d, blocks, N, K, 0, &w)) return -1;
    float *dx = (float *)d.up(x, (size_t)T * K * 4);
    float *dbias = bias ? (float *)d.up(bias, (size_t)N * 4) : NULL;
    float *dgate = gate ? (float *)d.up(gate, (size_t)N * 4) : NULL;
    float *dy = (float *)d.up(y, (size_t)T * N * 4); /* y holds the residual for GATE_ADD */
    const size_t T8 = (size_t)(T + 7) / 8 * 8;
    int8_t *xq = (int8_t *)d.up(NULL, T8 * K);
    float *xd = (float *)d.up(NULL, T8 * (K / 32) * 4);
    if (!dx || (bias && !dbias) || (gate && !dgate) || !dy || !xq || !xd) return -1;
    const fmc_q8_in in = {xq, xd, dx, K, NULL, 0.f};
    fmc_q8_dmatmul(&w, &in, T, dy, N, dbias, mode, dgate, 0, 0);
    return read_back(y, dy, (size_t)T * N * 4);
}

extern "C" int fm_cuda_debug_attention(const float *q, int T, int n_heads, int n_kv, int hd,
                                       const uint16_t *k, const uint16_t *v, int pos, int causal, int form,
                                       float *out) {
    if (fmc_init() || !fmc_attn_head_dim_ok(hd) || n_heads % n_kv) return -1;
    const int n_keys = causal ? pos + T : pos + 1, splits = (n_keys + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
    const size_t kv = (size_t)n_keys * n_kv * hd * 2, qn = (size_t)T * n_heads * hd;
    dev_bufs d;
    float *dq = (float *)d.up(q, qn * 4), *dout = (float *)d.up(NULL, qn * 4);
    __half *dk = (__half *)d.up(k, kv), *dv = (__half *)d.up(v, kv);
    int *dpos = (int *)d.up(&pos, sizeof pos);
    float *part = (float *)d.up(NULL, (size_t)T * n_heads * splits * (hd + 2) * 4);
    if (!dq || !dout || !dk || !dv || !dpos || !part) return -1;
    fmc_attention_f32(dq, T, n_heads, n_kv, hd, dk, dv, dpos, causal, splits, part, dout, form, 0, 0);
    return read_back(out, dout, qn * 4);
}
