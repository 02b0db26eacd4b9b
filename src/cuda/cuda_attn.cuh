/* cuda_attn.cuh: what the two attention kernels share: the split kernel for steps and verify blocks
 * (cuda_attn.cu) and the one-pass kernel for prefill chunks (cuda_attn_prefill.cu). Shared-memory tiles of a
 * block: K [64 keys][attn_kp(hd) = hd/2 + 4] half2 words, V [64][attn_vp(hd) = hd + 8] halves, the block's
 * queries as two f16 parts [2][QROWS][attn_vp(hd)] (the pads spread a fragment's rows over all banks); query
 * i of a block sits in row i % 16 of warp i / 16's tile.
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

/* Row pitches of the attention's shared-memory tiles (attn_smem): K rows in half2 words, V rows and the
 * queries' rows in halves. The pads spread a fragment's rows over all banks. */
__host__ __device__ constexpr int attn_kp(int hd) {
    return hd / 2 + 4;
}
__host__ __device__ constexpr int attn_vp(int hd) {
    return hd + 8;
}

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
/* The same split of one value: (hi, lo). */
__device__ __forceinline__ __half2 split_half(float x) {
    const __half h = __float2half_rn(x);
    return __halves2half2(h, __float2half_rn(x - __half2float(h)));
}

/* Where qk_norm_rope_head puts element d of query head hh of row t: q [T][n_heads * hd] (the persistent
 * step passes its own sink, the attention unit's shared-memory queries). */
__device__ __forceinline__ void qk_store_q(float *q, int t, int hh, int d, float v, int q_dim, int hd) {
    q[(size_t)t * q_dim + hh * hd + d] = v;
}
/* Where it copies element d of the key (v = 0) or value (v = 1) it has written to the caches: nowhere (the
 * persistent step's sink also puts it into its attention unit's tiles). */
__device__ __forceinline__ void qk_store_kv(float *, int, int, __half) {}

/* Head hh of row t of qkv [T][q_dim + 2 kv_dim]: q and k heads RMSNorm'd (q_norm / k_norm) and rotated (NEOX
 * RoPE at *pos + t), q into q_out (qk_store_q), k into the f16 key cache row *pos + t; v heads copied to the
 * value cache. qkv is read through L2 (a persistent launch writes it in the same kernel). */
template <class GRP, class QOUT>
__device__ __forceinline__ void qk_norm_rope_head(const float *qkv, int t, int hh, int n_heads, int n_kv,
                                                  int hd, const float *q_norm, const float *k_norm, float eps,
                                                  const float *rope, const int *pos, QOUT q_out,
                                                  __half *k_cache, __half *v_cache, const GRP &grp) {
    const int q_dim = n_heads * hd, kv_dim = n_kv * hd, half = hd / 2, tid = grp.tid(), nt = grp.size();
    const int p = *pos + t;
    const float *row = qkv + (size_t)t * (q_dim + 2 * kv_dim);
    if (hh >= n_heads + n_kv) {
        const int j = hh - n_heads - n_kv;
        for (int i = tid; i < hd; i += nt) {
            const __half h = __float2half_rn(ld_cg(row + q_dim + kv_dim + j * hd + i));
            v_cache[(size_t)p * kv_dim + j * hd + i] = h;
            qk_store_kv(q_out, 1, i, h);
        }
        return;
    }
    const int is_q = hh < n_heads;
    const float *src = is_q ? row + hh * hd : row + q_dim + (hh - n_heads) * hd;
    const float *w = is_q ? q_norm : k_norm, *rp = rope + (size_t)p * hd;
    /* elements i and i + half from their values (xa, xb), weights and rotation (c, sn), r = 1 / rms: pinned
     * (no contraction), so that every kernel that inlines this rounds alike */
    auto rotate = [&](int i, float xa, float xb, float wa, float wb, float c, float sn, float r) {
        const float a = __fmul_rn(__fmul_rn(xa, r), wa), b = __fmul_rn(__fmul_rn(xb, r), wb);
        const float o0 = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn));
        const float o1 = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn));
        if (is_q) {
            qk_store_q(q_out, t, hh, i, o0, q_dim, hd);
            qk_store_q(q_out, t, hh, i + half, o1, q_dim, hd);
        } else {
            const size_t base = (size_t)p * kv_dim + (hh - n_heads) * hd;
            const __half h0 = __float2half_rn(o0), h1 = __float2half_rn(o1);
            k_cache[base + i] = h0;
            k_cache[base + i + half] = h1;
            qk_store_kv(q_out, 0, i, h0);
            qk_store_kv(q_out, 0, i + half, h1);
        }
    };
    auto rms_inv = [&](double ss) { return (float)(1.0 / sqrt(ss / (double)hd + (double)eps)); };
    double ss = 0;
    if (nt == half) { /* a pair a thread: its operands loaded once, before the sum's barrier (one L2 round
                         trip, not two); the sum in the loop's order below */
        const float xa = ld_cg(src + tid), xb = ld_cg(src + tid + half), wa = w[tid], wb = w[tid + half];
        const float c = rp[2 * tid], sn = rp[2 * tid + 1];
        ss += (double)xa * xa;
        ss += (double)xb * xb;
        rotate(tid, xa, xb, wa, wb, c, sn, rms_inv(group_sum_d(ss, grp)));
        return;
    }
    for (int i = tid; i < hd; i += nt) {
        const float v = ld_cg(src + i);
        ss += (double)v * v;
    }
    const float r = rms_inv(group_sum_d(ss, grp));
    for (int i = tid; i < half; i += nt)
        rotate(i, ld_cg(src + i), ld_cg(src + i + half), w[i], w[i + half], rp[2 * i], rp[2 * i + 1], r);
}

/* Queries [0, nrows) of the block (rows past nq zeroed) into Qs as hi / lo parts. Query i is head
 * g G + i % G of row tb + i / G of q [T][n_heads][HD]. Threads tid of nt take part (by default all threads
 * of the block). */
template <int HD, int QROWS>
__device__ __forceinline__ void attn_load_q(const float *q, __half *Qs, int tb, int g, int G, int n_heads,
                                            int nrows, int nq, int tid = -1, int nt = 0) {
    constexpr int QP = attn_vp(HD), C8N = HD / 8;
    if (tid < 0) tid = threadIdx.x, nt = blockDim.x;
    for (int idx = tid; idx < nrows * C8N; idx += nt) {
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

/* S = Q K^T for the warp's 16 queries x the 64 keys in Ks: 8 tiles of 8 keys (or NT of them from tile n0);
 * the B fragment of key tile n is K rows n * 8 + gr, dims 16 k + 2c.. (both parts of q, f32 accumulation). */
template <int HD, int QROWS, int NT = 8>
__device__ __forceinline__ void attn_scores(const __half *Qs, const uint32_t *Ks, int warp, int lane,
                                            float (&sc)[NT][4], int n0 = 0) {
    constexpr int KP = attn_kp(HD), QP = attn_vp(HD);
    const int gr = lane >> 2, c = lane & 3;
#pragma unroll
    for (int n = 0; n < NT; n++) sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
    const __half *qa = Qs + (warp * 16 + gr) * QP + 2 * c;
#pragma unroll
    for (int k = 0; k < HD / 16; k++)
#pragma unroll
        for (int part = 0; part < 2; part++) {
            const __half *qp = qa + part * QROWS * QP + 16 * k;
            const uint32_t a0 = *(const uint32_t *)qp, a1 = *(const uint32_t *)(qp + 8 * QP),
                           a2 = *(const uint32_t *)(qp + 8), a3 = *(const uint32_t *)(qp + 8 * QP + 8);
#pragma unroll
            for (int n = 0; n < NT; n++) {
                const uint32_t *kb = Ks + ((n0 + n) * 8 + gr) * KP + 8 * k + c;
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

/* Splits a chunk of the merge (attn_combine_head) copies at once: its two buffers take <= 33 KB. */
__host__ __device__ constexpr int attn_combine_chunk(int hd) {
    return hd >= 256 ? 16 : 32;
}

/* How attn_combine_head's HD threads meet and bring a chunk of partials into shared memory: its kernel's
 * block, by cp.async (the next chunk copied while this one folds); the persistent kernel passes its own. */
struct attn_combine_block {
    __device__ __forceinline__ void sync() const { __syncthreads(); }
    /* n2 float pairs of src into dst by threads i of HD (nt), one commit group */
    __device__ __forceinline__ void fetch(float *dst, const float *src, int n2, int i, int nt) const {
        for (int k = i; k < n2; k += nt) cp_async8(dst + 2 * k, src + 2 * k);
        cp_async_commit();
    }
    template <int N> __device__ __forceinline__ void wait() const { cp_async_wait<N>(); }
};

/* Head h of row t (len keys, ns splits): fold the splits in split order (attn_fold_weights, as the one-pass
 * kernel does), then quantise the head's HD outputs (one Q8_0 block per warp) into fragment order (xq !=
 * NULL), or store them as f32 rows of out. Thread i of HD. The fold is a chain through every split; its
 * operands come through shared memory (buf: two chunks of CH splits) a chunk at a time, the next copied
 * while this one folds, because loading them split by split left the chain waiting on L2: at 16k positions
 * (256 splits) the merge took 77 us a layer, twice the split kernel. */
template <int HD, int CH, class GRP>
__device__ __forceinline__ void attn_combine_head(int n_heads, int h, int t, int len, int max_splits,
                                                  const float *part, float *buf, int8_t *xq, float *xd,
                                                  float *out, int i, const GRP &grp) {
    constexpr int R = HD + 2; /* floats a split */
    const int NB = n_heads * HD / 32, ns = (len + FMC_ATT_SPLIT - 1) / FMC_ATT_SPLIT;
    const float *pr = part + ((size_t)t * n_heads + h) * max_splits * R; /* 8-byte aligned (R is even) */
    auto fetch = [&](int c) {
        const int n2 = (min(ns, (c + 1) * CH) - c * CH) * R / 2;
        grp.fetch(buf + (c & 1) * CH * R, pr + (size_t)c * CH * R, n2, i, HD);
    };
    float M = -INFINITY, L = 0.0f, o = 0.0f;
    const int nc = (ns + CH - 1) / CH;
    fetch(0);
    for (int c = 0; c < nc; c++) {
        if (c + 1 < nc)
            fetch(c + 1), grp.template wait<1>();
        else
            grp.template wait<0>();
        grp.sync();
        const float *b = buf + (c & 1) * CH * R;
        const int n = min(ns - c * CH, CH);
#pragma unroll 4
        for (int k = 0; k < n; k++, b += R) {
            const float2 w = attn_fold_weights(&M, &L, b[HD], b[HD + 1]);
            o = attn_fold(o, b[i], w);
        }
        grp.sync(); /* the chunk's buffer is refilled next */
    }
    const float y = __fdiv_rn(o, L);
    const int k = h * HD + i;
    if (!xq) {
        out[(size_t)t * n_heads * HD + k] = y;
        return;
    }
    float d;
    xq[frag_off(t, k, NB)] = quant_lane(y, &d);
    if ((i & 31) == 0) xd[frag_d(t, k / 32, NB)] = d;
}

/* Key step k's A fragment of P (16 keys: score tiles s0 = 2k, s1 = 2k + 1, probabilities) as two f16 parts.
 */
__device__ __forceinline__ void attn_p_frags(const float (&s0)[4], const float (&s1)[4], uint32_t (&ah)[4],
                                             uint32_t (&al)[4]) {
    split_half2(s0[0], s0[1], &ah[0], &al[0]);
    split_half2(s0[2], s0[3], &ah[1], &al[1]);
    split_half2(s1[0], s1[1], &ah[2], &al[2]);
    split_half2(s1[2], s1[3], &ah[3], &al[3]);
}
/* o += P_k V_k for key step k (P's fragment ah / al) into NN pairs of output tiles, dims 16 (n0 + j) ..: V by
 * ldmatrix.trans. */
template <int HD, int NN>
__device__ __forceinline__ void attn_pv_step(const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                             const __half *Vs, int lane, int k, int n0,
                                             float (&o)[2 * NN][4]) {
    constexpr int VP = attn_vp(HD);
    const __half *vrow = Vs + (16 * k + ((lane >> 3) & 1) * 8 + (lane & 7)) * VP + (lane >> 4) * 8;
#pragma unroll
    for (int j = 0; j < NN; j++) {
        uint32_t b0, b1, b2, b3;
        asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                     : "=r"(b0), "=r"(b1), "=r"(b2), "=r"(b3)
                     : "r"((unsigned)__cvta_generic_to_shared(vrow + 16 * (n0 + j))));
        mma_f16(o[2 * j], ah[0], ah[1], ah[2], ah[3], b0, b1);
        mma_f16(o[2 * j], al[0], al[1], al[2], al[3], b0, b1);
        mma_f16(o[2 * j + 1], ah[0], ah[1], ah[2], ah[3], b2, b3);
        mma_f16(o[2 * j + 1], al[0], al[1], al[2], al[3], b2, b3);
    }
}
/* o += P V for the warp's 16 queries over the 64 keys: key step by key step. */
template <int HD>
__device__ __forceinline__ void attn_pv(const float (&sc)[8][4], const __half *Vs, int lane,
                                        float (&o)[HD / 8][4]) {
#pragma unroll
    for (int k = 0; k < 4; k++) {
        uint32_t ah[4], al[4];
        attn_p_frags(sc[2 * k], sc[2 * k + 1], ah, al);
        attn_pv_step<HD, HD / 16>(ah, al, Vs, lane, k, 0, o);
    }
}

/* Shared memory of a split block (and of the persistent step's attention units): K [64][attn_kp] half2
 * words, V [64][attn_vp] halves, the block's query rows as two f16 parts [2][qr][attn_vp]. */
__host__ __device__ inline size_t attn_smem(int hd, int qr) {
    return (size_t)FMC_ATT_SPLIT * attn_kp(hd) * 4 + (size_t)FMC_ATT_SPLIT * attn_vp(hd) * 2 +
           (size_t)2 * qr * attn_vp(hd) * 2;
}
/* The three regions of attn_smem's layout, from its base. */
template <int HD> struct attn_tiles {
    uint32_t *Ks;
    __half *Vs, *Qs; /* Qs: [2][qr][attn_vp], high and low parts */
    __device__ __forceinline__ explicit attn_tiles(unsigned char *base)
        : Ks((uint32_t *)base), Vs((__half *)(Ks + FMC_ATT_SPLIT * attn_kp(HD))),
          Qs(Vs + FMC_ATT_SPLIT * attn_vp(HD)) {}
};

/* A split block's queries (cuda_attn.cu says how they sit): KV head g with its G query heads, rows tb ..
 * of T (zb: the launch's block along z), the calling thread's lane, warp and quad. */
struct attn_block {
    int g, G, tb, p0, nq, kv_dim, lane, warp, c, maxlen;
    float scale;
    int qt[2], qh[2], qlen[2]; /* the lane's two query rows (tile rows gr, gr + 8): row t, head, length */
};

template <int HD, int QR>
__device__ __forceinline__ attn_block attn_block_setup(int T, int n_heads, int n_kv, const int *pos,
                                                       int causal, int g, int zb, int row_warp = -1) {
    attn_block a;
    a.g = g, a.G = n_heads / n_kv;
    const int rows = QR / a.G;
    a.tb = zb * rows, a.p0 = *pos;
    const int te = min(T, a.tb + rows);
    a.nq = (te - a.tb) * a.G, a.kv_dim = n_kv * HD;
    a.lane = threadIdx.x & 31, a.warp = row_warp >= 0 ? row_warp : threadIdx.x >> 5, a.c = a.lane & 3;
    a.maxlen = causal ? a.p0 + te : a.p0 + 1; /* the longest row of the block */
    a.scale = 1.0f / sqrtf((float)HD);
#pragma unroll
    for (int u = 0; u < 2; u++) {
        const int i = a.warp * 16 + (a.lane >> 2) + 8 * u;
        a.qt[u] = a.tb + i / a.G, a.qh[u] = a.g * a.G + i % a.G;
        a.qlen[u] = i >= a.nq ? 0 : causal ? a.p0 + a.qt[u] + 1 : a.p0 + 1;
    }
    return a;
}

/* One warp's tile against split s in Ks / Vs: scores, softmax, P V, and the partial (O, m, l) of each of the
 * lane's rows that reaches the split. */
template <int HD, int QR>
__device__ __forceinline__ void attn_split_tile(const attn_block &a, const __half *Qs, const uint32_t *Ks,
                                                const __half *Vs, int s, int n_heads, int max_splits,
                                                float *part) {
    const int j0 = s * FMC_ATT_SPLIT;
    float sc[8][4];
    attn_scores<HD, QR>(Qs, Ks, a.warp, a.lane, sc);
    /* softmax of each of the lane's two rows over its quad: max, exp, sum in a fixed order */
    float m[2], l[2];
#pragma unroll
    for (int u = 0; u < 2; u++) l[u] = attn_softmax_row(sc, u, a.qlen[u] - j0, a.scale, a.c, &m[u]);
    float o[HD / 8][4];
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    attn_pv<HD>(sc, Vs, a.lane, o);
#pragma unroll
    for (int u = 0; u < 2; u++) {
        if (a.qlen[u] <= j0) continue; /* past the row's length (or no row): the merge skips it */
        float *out = part + (((size_t)a.qt[u] * n_heads + a.qh[u]) * max_splits + s) * (HD + 2);
#pragma unroll
        for (int n = 0; n < HD / 8; n++)
            *(float2 *)(out + n * 8 + 2 * a.c) = make_float2(o[n][2 * u], o[n][2 * u + 1]);
        if (a.c == 0) out[HD] = m[u], out[HD + 1] = l[u];
    }
}

/* Floats of shared memory attn_split_tile_kw exchanges through: the row maxima [KW warps][2][8], P
 * [8 tiles][32 lanes][4], P's fragments [4 key steps][32 lanes][8 words]. */
constexpr int ATTN_XS_FLOATS = 4 * 2 * 8 + 8 * 32 * 4 + 4 * 32 * 8;

/* attn_split_tile for one 16-row tile of queries (a: set up with its warp as row_warp) on KW = 2 or 4 warps
 * kw, bit for bit: warp kw scores keys 64 / KW kw .. (score tiles 8 / KW kw .., P V's key steps 4 / KW kw
 * ..), the row maxima and P meet in xs (ATTN_XS_FLOATS), each row's sum is added in attn_softmax_row's order,
 * and warp kw multiplies P by V (all key steps, in order) for its share of the output tiles. On one warp the
 * tile's ~256 mma run on one of the SM's four tensor cores. bar: the KW warps' barrier. */
template <int HD, int QR, int KW, class BAR>
__device__ __forceinline__ void attn_split_tile_kw(const attn_block &a, const __half *Qs, const uint32_t *Ks,
                                                   const __half *Vs, int s, int n_heads, int max_splits,
                                                   float *part, float *xs, int kw, const BAR &bar) {
    static_assert(KW == 2 || KW == 4, "2 or 4 warps a tile");
    constexpr int NT = 8 / KW;                              /* score tiles a warp */
    constexpr int NN = HD / 16 / KW > 0 ? HD / 16 / KW : 1; /* P V's output tile pairs a warp */
    const int j0 = s * FMC_ATT_SPLIT, lane = a.lane, gr = lane >> 2, c = a.c;
    float *xm = xs, *xp = xs + 4 * 2 * 8;
    uint32_t *xa = (uint32_t *)(xp + 8 * 32 * 4);
    float sc[NT][4];
    attn_scores<HD, QR, NT>(Qs, Ks, a.warp, lane, sc, NT * kw);
    float m[2], l[2];
#pragma unroll
    for (int u = 0; u < 2; u++) { /* masked, scaled, and the maximum over the warp's keys */
        const int nk = a.qlen[u] - j0;
        float mu = -INFINITY;
#pragma unroll
        for (int t = 0; t < NT; t++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float v =
                    (NT * kw + t) * 8 + 2 * c + e < nk ? __fmul_rn(sc[t][2 * u + e], a.scale) : -INFINITY;
                sc[t][2 * u + e] = v;
                mu = fmaxf(mu, v);
            }
        mu = fmaxf(mu, __shfl_xor_sync(0xffffffffu, mu, 1));
        mu = fmaxf(mu, __shfl_xor_sync(0xffffffffu, mu, 2));
        if (c == 0) xm[(kw * 2 + u) * 8 + gr] = mu;
    }
    bar.sync();
#pragma unroll
    for (int u = 0; u < 2; u++) { /* (fmaxf is exact: any order gives attn_softmax_row's maximum) */
        m[u] = xm[u * 8 + gr];
#pragma unroll
        for (int q = 1; q < KW; q++) m[u] = fmaxf(m[u], xm[(q * 2 + u) * 8 + gr]);
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int u = 0; u < 2; u++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float v = sc[t][2 * u + e];
                const float p = v == -INFINITY ? 0.0f : expf(__fsub_rn(v, m[u]));
                sc[t][2 * u + e] = p;
                xp[((NT * kw + t) * 32 + lane) * 4 + 2 * u + e] = p;
            }
#pragma unroll
    for (int j = 0; j < NT / 2; j++) {
        uint32_t ah[4], al[4];
        attn_p_frags(sc[2 * j], sc[2 * j + 1], ah, al);
        uint4 *d = (uint4 *)(xa + ((NT / 2 * kw + j) * 32 + lane) * 8);
        d[0] = make_uint4(ah[0], ah[1], ah[2], ah[3]), d[1] = make_uint4(al[0], al[1], al[2], al[3]);
    }
    bar.sync();
    float o[2 * NN][4];
#pragma unroll
    for (int n = 0; n < 2 * NN; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    const bool pv = kw * NN < HD / 16; /* (HD 32 on 4 warps: warps 0 and 1) */
    if (pv)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            const uint4 *f = (const uint4 *)(xa + (k * 32 + lane) * 8);
            const uint4 h = f[0], lo = f[1];
            const uint32_t ah[4] = {h.x, h.y, h.z, h.w}, al[4] = {lo.x, lo.y, lo.z, lo.w};
            attn_pv_step<HD, NN>(ah, al, Vs, lane, k, kw * NN, o);
        }
#pragma unroll
    for (int u = 0; u < 2; u++) { /* the sums: tile by tile, then over the quad */
        float sum = 0.0f;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) sum = __fadd_rn(sum, xp[(n * 32 + lane) * 4 + 2 * u + e]);
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
        l[u] = sum;
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
        if (a.qlen[u] <= j0) continue; /* past the row's length (or no row): the merge skips it */
        float *out = part + (((size_t)a.qt[u] * n_heads + a.qh[u]) * max_splits + s) * (HD + 2);
        if (pv)
#pragma unroll
            for (int n = 0; n < 2 * NN; n++)
                *(float2 *)(out + (2 * kw * NN + n) * 8 + 2 * c) = make_float2(o[n][2 * u], o[n][2 * u + 1]);
        if (c == 0 && kw == 0) out[HD] = m[u], out[HD + 1] = l[u];
    }
}

/* Split s of KV head a.g from the f16 caches into Ks / Vs by cp.async (L2 only), rows past the block's
 * longest row zero-filled (P is 0 there, and 0 * garbage could be NaN); which: rows below a.p0 (0), the
 * others (1), all (2), all but the block's new rows (3: the persistent step writes those itself). Threads
 * tid of nt take part. */
template <int HD>
__device__ __forceinline__ void attn_copy_split(uint32_t *Ks, __half *Vs, const __half *kc, const __half *vc,
                                                const attn_block &a, int s, int which, int tid, int nt,
                                                uint64_t pol) {
    constexpr int KP = attn_kp(HD), VP = attn_vp(HD), C8N = HD / 8;
    const int j0 = s * FMC_ATT_SPLIT, nload = min(FMC_ATT_SPLIT, a.maxlen - j0);
#pragma unroll 4
    for (int idx = tid; idx < FMC_ATT_SPLIT * C8N; idx += nt) {
        const int j = idx / C8N, c8 = idx - j * C8N;
        const bool in = j < nload;
        if (which == 3 ? in && j0 + j >= a.p0 : which != 2 && (j0 + j < a.p0) != (which == 0)) continue;
        const size_t off = in ? (size_t)(j0 + j) * a.kv_dim + (size_t)a.g * HD + c8 * 8 : 0;
        cp_async16_hint(Ks + j * KP + c8 * 4, kc + off, in ? 16 : 0, pol);
        cp_async16_hint(Vs + j * VP + c8 * 8, vc + off, in ? 16 : 0, pol);
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
