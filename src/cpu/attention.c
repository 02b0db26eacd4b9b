/* attention.c: GQA attention (causal, or over all n_keys rows). A work item takes up to FM_ATTN_ITEM_QUERIES
 * (row, head) queries in (KV head, row, head of the group) order and runs them over the keys in blocks of
 * KEY_BLOCK rows, so each key and value row is read (and converted, four queries at a time) once per item;
 * a block's scores live in the worker's scratch; the softmax is online, in f32 (attention_item). */
#include "cpu/attention.h"

#include <math.h>
#include <pthread.h>

#include "core/dtype.h"
#include "cpu/attention_kernels.h"
#include "cpu/cpu_features.h"

static float f16_table[1 << 16];
static pthread_once_t f16_once = PTHREAD_ONCE_INIT;

static void f16_table_init(void) {
    for (uint32_t i = 0; i < (1u << 16); i++) f16_table[i] = fm_f16_to_f32((uint16_t)i);
}

float fm_f16_lookup(uint16_t h) {
    return f16_table[h];
}

/* Scalar reference loops (the f16 table is exact). */
static float dot_f16_scalar(const float *q, const uint16_t *k, int n) {
    float s = 0;
    for (int d = 0; d < n; d++) s += q[d] * f16_table[k[d]];
    return s;
}

static void axpy_f16_scalar(float *o, float p, const uint16_t *v, int n) {
    for (int d = 0; d < n; d++) o[d] += p * f16_table[v[d]];
}

static float exp_sum_scalar(float *s, int n, float mx) {
    float sum = 0;
    for (int j = 0; j < n; j++) {
        s[j] = expf(s[j] - mx);
        sum += s[j];
    }
    return sum;
}

typedef struct {
    const fm_attention_args *a;
    fm_attn_dot_fn dot;
    fm_attn_axpy_fn axpy;
    fm_attn_exp_sum_fn exp_sum;
    /* four queries at a time (NULL: one at a time): the same bits per query */
    void (*dot4_rows)(const float *const q[4], const uint16_t *k, int64_t stride, int nk, int n, float scale,
                      float *const out[4], int npf, int ahead);
    void (*axpy4_rows)(float *const o[4], const float *const p[4], const uint16_t *v, int64_t stride, int nk,
                       int n, int npf, int ahead);
    int qpi; /* queries (row, head) per work item */
} attention_job;

/* Keys of a block: 64 K (or V) rows of one KV head stay in L1 while every query of the item uses them. */
enum { KEY_BLOCK = 64 };

/* A key (or value) row one block ahead, into the cache while this one is computed. Rows of all KV heads side
 * by side put a head's rows hd * 2 bytes every kv_dim * 2, a stride the hardware prefetchers do not follow
 * across pages: without it the loads waited on memory (perf: 90 % of the time on the first use of each key
 * row). One row per row used, not a whole block at the block's start: the burst of 1,024 prefetches left the
 * kernels waiting on their loads (16k positions, a step: 12.3-15.3 -> 7.3-9.7 ms a layer, same bits). With
 * each head's rows contiguous (the target's cache) it still helps: 7.4-7.8 -> 6.8 ms at 16k. */
/* Always inlined: called (not inlined), GCC 12 took it for a function without side effects and deleted
 * every call, prefetches and all. */
static inline __attribute__((always_inline)) void prefetch_ahead(const uint16_t *row, int j, int n,
                                                                 int64_t kv_dim, int width) {
    if (j + KEY_BLOCK >= n) return;
    row += (int64_t)KEY_BLOCK * kv_dim;
    for (int off = 0; off < width; off += 32) __builtin_prefetch(row + off, 0, 3);
}

/* The rows j .. e (returned) of a block that four queries share, e = end if it is past j; *npf of them, those
 * below nmax - KEY_BLOCK, prefetch the next block's row. */
static inline int four_rows(int j, int end, int nmax, int *npf) {
    const int e = end > j ? end : j, pe = nmax - KEY_BLOCK < e ? nmax - KEY_BLOCK : e;
    *npf = pe > j ? pe - j : 0;
    return e;
}

/* One item: queries q0 .. q1-1 in (KV head, row, head of the group) order, so an item holds rows of one or
 * two KV heads (verify blocks, prompt chunks) or the one row of several adjacent KV heads (a step). The keys
 * go by blocks of KEY_BLOCK rows, each block's key and value rows read from memory once for all the item's
 * queries and reused from L1 (four queries at a time), with the softmax taken online: per query a running
 * max m and sum l, the output rescaled by e^(m_old - m_new) when a block raises the max, divided by l at the
 * end. Each query gets the same operations in the same order whatever shares its item (scores in key order,
 * blocks at the same key offsets, its own causal end), so its bits never depend on T or the thread count. */
static void attention_item(const attention_job *job, int q0, int q1, float *sc0) {
    const fm_attention_args *a = job->a;
    const int hd = a->head_dim, q_dim = a->n_heads * hd, nq = q1 - q0;
    /* kv_dim: elements from one key row to the next; hs: from one KV head to the next */
    const int64_t kv_dim = a->row_stride ? a->row_stride : (int64_t)a->n_kv_heads * hd;
    const int64_t hs = a->head_stride ? a->head_stride : hd;
    const int G = a->n_heads / a->n_kv_heads, per_kv = a->T * G;
    const float scale = 1.0f / sqrtf((float)hd);
    int len[FM_ATTN_ITEM_QUERIES], kvh[FM_ATTN_ITEM_QUERIES], nmax = 0;
    const float *qp[FM_ATTN_ITEM_QUERIES];
    float *sc[FM_ATTN_ITEM_QUERIES], *op[FM_ATTN_ITEM_QUERIES], mx[FM_ATTN_ITEM_QUERIES],
        sum[FM_ATTN_ITEM_QUERIES];
    for (int i = 0; i < nq; i++) { /* causal: row t attends to keys 0 .. pos0+t */
        const int q = q0 + i, t = q % per_kv / G;
        kvh[i] = q / per_kv;
        const int h = kvh[i] * G + q % G;
        len[i] = a->n_keys > 0 ? a->n_keys : a->pos0 + t + 1;
        if (len[i] > nmax) nmax = len[i];
        qp[i] = a->q + (int64_t)t * q_dim + (int64_t)h * hd;
        op[i] = a->out + (int64_t)t * q_dim + (int64_t)h * hd;
        sc[i] = sc0 + i * KEY_BLOCK;
        mx[i] = -INFINITY, sum[i] = 0;
        for (int d = 0; d < hd; d++) op[i][d] = 0;
    }
    const uint16_t *kb = a->k_cache + kvh[0] * hs, *vb = a->v_cache + kvh[0] * hs;
    /* Four queries at a time share a key row while they have the same KV head and all attend to the key
     * (within a KV head, later rows are longer); the others one at a time. dot4_rows and axpy4_rows come
     * together. The first use of a KV head's block in the item prefetches its next block. */
#define FOUR(i) (job->dot4_rows && (i) + 4 <= nq && kvh[i] == kvh[(i) + 3])
#define END(i) (len[i] < jb ? len[i] : jb)
    for (int j0 = 0; j0 < nmax; j0 += KEY_BLOCK) {
        const int jb = j0 + KEY_BLOCK < nmax ? j0 + KEY_BLOCK : nmax;
        /* scores of the block: sc[i][j - j0] */
        for (int i = 0, seen = -1; i < nq;) {
            const uint16_t *k = kb + (kvh[i] - kvh[0]) * hs;
            const int first = kvh[i] != seen;
            seen = kvh[i];
            int j = j0;
            if (FOUR(i)) {
                int npf;
                const int e = four_rows(j, END(i), nmax, &npf);
                float *const so[4] = {sc[i], sc[i + 1], sc[i + 2], sc[i + 3]};
                job->dot4_rows(qp + i, k + (int64_t)j * kv_dim, kv_dim, e - j, hd, scale, so, first ? npf : 0,
                               KEY_BLOCK);
                j = e;
                for (int u = 0; u < 4; u++)
                    for (int jj = j; jj < END(i + u); jj++)
                        sc[i + u][jj - j0] = job->dot(qp[i + u], k + (int64_t)jj * kv_dim, hd) * scale;
                i += 4;
            } else {
                for (; j < END(i); j++) {
                    if (first) prefetch_ahead(k + (int64_t)j * kv_dim, j, nmax, kv_dim, hd);
                    sc[i][j - j0] = job->dot(qp[i], k + (int64_t)j * kv_dim, hd) * scale;
                }
                i++;
            }
        }
        /* the online softmax: sc becomes e^(s - m), the output is rescaled where the max rose */
        for (int i = 0; i < nq; i++) {
            const int n = END(i) - j0;
            if (n <= 0) continue;
            float m = mx[i];
            for (int j = 0; j < n; j++)
                if (sc[i][j] > m) m = sc[i][j];
            if (m > mx[i] && mx[i] > -INFINITY) {
                const float r = expf(mx[i] - m);
                sum[i] *= r;
                for (int d = 0; d < hd; d++) op[i][d] *= r;
            }
            mx[i] = m;
            sum[i] += job->exp_sum(sc[i], n, m);
        }
        /* o += p v in key order for each query */
        for (int i = 0, seen = -1; i < nq;) {
            const uint16_t *v = vb + (kvh[i] - kvh[0]) * hs;
            const int first = kvh[i] != seen;
            seen = kvh[i];
            int j = j0;
            if (FOUR(i)) {
                int npf;
                const int e = four_rows(j, END(i), nmax, &npf);
                const float *const p[4] = {sc[i], sc[i + 1], sc[i + 2], sc[i + 3]};
                job->axpy4_rows(op + i, p, v + (int64_t)j * kv_dim, kv_dim, e - j, hd, first ? npf : 0,
                                KEY_BLOCK);
                j = e;
                for (int u = 0; u < 4; u++)
                    for (int jj = j; jj < END(i + u); jj++)
                        job->axpy(op[i + u], sc[i + u][jj - j0], v + (int64_t)jj * kv_dim, hd);
                i += 4;
            } else {
                for (; j < END(i); j++) {
                    if (first) prefetch_ahead(v + (int64_t)j * kv_dim, j, nmax, kv_dim, hd);
                    job->axpy(op[i], sc[i][j - j0], v + (int64_t)j * kv_dim, hd);
                }
                i++;
            }
        }
    }
#undef FOUR
#undef END
    for (int i = 0; i < nq; i++) {
        const float inv = 1.0f / sum[i];
        for (int d = 0; d < hd; d++) op[i][d] *= inv;
    }
}

static void attention_items(void *ctx, int64_t begin, int64_t end, int thread) {
    const attention_job *job = ctx;
    const fm_attention_args *a = job->a;
    const int nq = a->n_heads * a->T;
    float *sc0 = a->scratch + (int64_t)thread * FM_ATTN_ITEM_QUERIES * KEY_BLOCK;
    for (int64_t item = begin; item < end; item++) {
        const int q0 = (int)item * job->qpi;
        attention_item(job, q0, q0 + job->qpi < nq ? q0 + job->qpi : nq, sc0);
    }
}

void fm_attention_store_kv(uint16_t *k_cache, uint16_t *v_cache, int64_t head_stride, int pos, const float *k,
                           const float *v, int n_heads, int head_dim) {
    for (int h = 0; h < n_heads; h++) {
        uint16_t *kr = k_cache + h * head_stride + (int64_t)pos * head_dim,
                 *vr = v_cache + h * head_stride + (int64_t)pos * head_dim;
        for (int i = 0; i < head_dim; i++) {
            kr[i] = fm_f32_to_f16(k[h * head_dim + i]);
            vr[i] = fm_f32_to_f16(v[h * head_dim + i]);
        }
    }
}

size_t fm_attention_scratch_floats(int threads) {
    return (size_t)(threads > 0 ? threads : 1) * FM_ATTN_ITEM_QUERIES * KEY_BLOCK;
}

void fm_attention(fm_pool *pool, const fm_attention_args *a) {
    pthread_once(&f16_once, f16_table_init);
    const int fast = fm_cpu_isa() >= FM_ISA_AVX2;
    /* Items of whole groups of four queries, as large as keeps every thread busy with two of them (a KV
     * head's keys are read once per item: 4x less traffic than a query at a time for a Qwen3-4B step, 17x
     * for a verify block of 17 rows), at most FM_ATTN_ITEM_QUERIES; a step's 32 queries stay at 16 an item
     * (four KV heads, one item a thread). */
    const int nq = a->n_heads * a->T, threads = fm_pool_size(pool) > 0 ? fm_pool_size(pool) : 1;
    int items = a->T == 1 ? threads : 2 * threads;
    if (items < (nq + FM_ATTN_ITEM_QUERIES - 1) / FM_ATTN_ITEM_QUERIES)
        items = (nq + FM_ATTN_ITEM_QUERIES - 1) / FM_ATTN_ITEM_QUERIES;
    items = (items + threads - 1) / threads * threads; /* the same number for every thread */
    int qpi = (nq + items - 1) / items;
    qpi = (qpi + 3) / 4 * 4;
    qpi = qpi < 1 ? 1 : qpi > FM_ATTN_ITEM_QUERIES ? FM_ATTN_ITEM_QUERIES : qpi;
    const int four = fast && a->head_dim % 16 == 0;
    attention_job job = {a,
                         fast ? fm_attn_dot_f16_avx2 : dot_f16_scalar,
                         fast ? fm_attn_axpy_f16_avx2 : axpy_f16_scalar,
                         fast ? fm_attn_exp_sum_avx2 : exp_sum_scalar,
                         four ? fm_attn_dot4_rows_f16_avx2 : NULL,
                         four ? fm_attn_axpy4_rows_f16_avx2 : NULL,
                         qpi};
    fm_pool_for(pool, (nq + qpi - 1) / qpi, 1, attention_items, &job);
}
