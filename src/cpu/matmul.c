/* matmul.c: fm_matmul's dispatcher. Picks the kernels of the current ISA level (cpu_features, read at every
 * call so tests can switch levels), prepares the activations once per call (Q8_0 blocks, interleaved for the
 * SIMD kernels; a bf16 hi/lo split for the AVX512-BF16 kernel), and hands out row chunks of one or several
 * matrices (fm_matmul_multi) to the pool's workers from one shared counter. On CPUs with AMX-INT8 (and
 * Linux's permission, fm_cpu_amx) Q8_0 batches of 9..16 and 25+ tokens (amx_batch) take the AMX kernel
 * (matmul_q8_amx.c: tdpbssd block dots, the VNNI kernel's f32 steps, bit-identical); FLASHMAP_NO_AMX=1 turns
 * it off.
 *
 * Workspace: each thread that calls fm_matmul owns one buffer (a pthread key), grown when a call needs more
 * and never shrunk, so the hot path does not allocate. It holds the prepared activations (written by the
 * caller before the rows are handed out, then read-only) and one private slot per worker (the SIMD Q8_0
 * kernels pack weight rows there). Buffers are freed at thread exit (key destructor), at process exit for
 * the thread calling exit (atexit), or on demand (fm_matmul_scratch_release).
 *
 * Pre-packed weights (fm_matrix_pack_q8_0): a matrix multiplied by many batches (the drafter's, 16 slots a
 * draft) can keep its rows in the packing kernel's layout, made once by the family that would read it; the
 * kernel then skips packing them. */
#include "cpu/matmul.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul_kernels.h"
#include "cpu/q8_layout.h"
#include "cpu/quant_k.h"
#include "cpu/quant_legacy.h"

typedef struct {
    fm_mm_kernel kern[FM_DTYPE_COUNT]; /* Q8_0: the scalar kernel; SIMD levels use q8 instead */
    fm_mm_quant_fn quant;
    void (*quant_k)(const float *x, fm_block_q8_K *y, int64_t n); /* to Q8_K, bit-identical at every level */
    const fm_mm_q8_family *q8;     /* NULL: the scalar Q8_0 kernel on block-major activations */
    const fm_mm_q8_family *q8_amx; /* the batches of amx_batch, when set */
    int split_bf16;                /* the BF16 kernel reads xbf_hi/xbf_lo */
} fm_mm_table;

static const fm_mm_table k_scalar = {
    .kern = {[FM_DTYPE_F32] = fm_mm_f32_scalar,
             [FM_DTYPE_F16] = fm_mm_f16_scalar,
             [FM_DTYPE_BF16] = fm_mm_bf16_scalar,
             [FM_DTYPE_Q8_0] = fm_mm_q8_0_scalar,
             [FM_DTYPE_Q4_K] = fm_mm_k_scalar,
             [FM_DTYPE_Q5_K] = fm_mm_k_scalar,
             [FM_DTYPE_Q6_K] = fm_mm_k_scalar,
             [FM_DTYPE_Q4_0] = fm_mm_legacy_scalar,
             [FM_DTYPE_Q5_0] = fm_mm_legacy_scalar},
    .quant = fm_quant_q8_0_scalar,
    .quant_k = fm_quant_q8_K_ref,
};

#if defined(__x86_64__) || defined(__i386__)
#define FM_HAVE_X86_KERNELS 1
static const fm_mm_table k_avx2 = {
    .kern = {[FM_DTYPE_F32] = fm_mm_f32_avx2,
             [FM_DTYPE_F16] = fm_mm_f16_avx2,
             [FM_DTYPE_BF16] = fm_mm_bf16_avx2,
             [FM_DTYPE_Q8_0] = fm_mm_q8_0_scalar,
             [FM_DTYPE_Q4_K] = fm_mm_q4_K_avx2,
             [FM_DTYPE_Q5_K] = fm_mm_q5_K_avx2,
             [FM_DTYPE_Q6_K] = fm_mm_q6_K_avx2,
             [FM_DTYPE_Q4_0] = fm_mm_legacy_avx2,
             [FM_DTYPE_Q5_0] = fm_mm_legacy_avx2},
    .quant = fm_quant_q8_0_avx2,
    .quant_k = fm_quant_q8_K_avx2,
    .q8 = &fm_q8_family_avx2,
};
#endif

/* The table of the current level; the AVX-512 one depends on the optional VNNI and BF16 extensions. */
static fm_mm_table current_table(void) {
#ifdef FM_HAVE_X86_KERNELS
    fm_isa isa = fm_cpu_isa();
    if (isa == FM_ISA_AVX512) {
        const fm_cpu_features *f = fm_cpu_features_get();
        fm_mm_table t = k_avx2;
        t.kern[FM_DTYPE_F32] = fm_mm_f32_avx512;
        t.kern[FM_DTYPE_F16] = fm_mm_f16_avx512;
        t.kern[FM_DTYPE_BF16] = f->avx512bf16 ? fm_mm_bf16_dpbf16_avx512 : fm_mm_bf16_avx512;
        t.split_bf16 = f->avx512bf16;
        if (f->avx512vnni) { /* else the AVX2 int8 kernels */
            t.q8 = &fm_q8_family_vnni_avx512;
            t.kern[FM_DTYPE_Q4_K] = fm_mm_q4_K_vnni_avx512;
            t.kern[FM_DTYPE_Q5_K] = fm_mm_q5_K_vnni_avx512;
            t.kern[FM_DTYPE_Q6_K] = fm_mm_q6_K_vnni_avx512;
        }
#ifdef FLASHMAP_HAVE_AMX
        if (f->avx512vnni && fm_cpu_amx()) t.q8_amx = &fm_q8_family_amx;
#endif
        return t;
    }
    if (isa == FM_ISA_AVX2) return k_avx2;
#endif
    return k_scalar;
}

/* Batches that take the AMX kernel where there is one, from bench_cpu_forward on the device's Xeon (2
 * threads, bench/RESULTS.md): 9..16 tokens (the 9-row verify block, the drafter's 16 slots) and 25 or more
 * (prefill). Up to 8 the VNNI direct path was faster in the forward; at 17..24 the second 16-token tile is at
 * most half full and the VNNI row-pair path was as fast. */
static int amx_batch(int T) {
    return (T >= 9 && T <= 16) || T >= 25;
}

/* The family that batches of T tokens take at the current level, or NULL (scalar level). */
static const fm_mm_q8_family *q8_family(const fm_mm_table *tab, int T) {
    return tab->q8_amx && amx_batch(T) ? tab->q8_amx : tab->q8;
}

static atomic_ulong g_amx_calls;

int fm_mm_have_amx(void) {
#ifdef FLASHMAP_HAVE_AMX
    return 1;
#else
    return 0;
#endif
}

int fm_matrix_batch_granule(const fm_matrix *w) {
    const fm_mm_table tab = current_table();
    return w->dtype == FM_DTYPE_Q8_0 && tab.q8_amx ? 8 : 1;
}

unsigned long fm_mm_amx_calls(void) {
    return atomic_load(&g_amx_calls);
}

/* ---- per-thread workspace ---- */

typedef struct {
    void *p;
    size_t cap;
} fm_scratch;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_ok;

static void scratch_destroy(void *v) {
    fm_scratch *s = v;
    if (s) free(s->p);
    free(s);
}

void fm_matmul_scratch_release(void) {
    if (!g_scratch_ok) return;
    fm_scratch *s = pthread_getspecific(g_scratch_key);
    if (!s) return;
    pthread_setspecific(g_scratch_key, NULL);
    scratch_destroy(s);
}

static void scratch_init(void) {
    g_scratch_ok = pthread_key_create(&g_scratch_key, scratch_destroy) == 0;
    if (g_scratch_ok) atexit(fm_matmul_scratch_release);
}

/* The calling thread's workspace of at least `bytes` (64-byte aligned), or NULL when out of memory. */
static void *scratch_get(size_t bytes) {
    pthread_once(&g_scratch_once, scratch_init);
    if (!g_scratch_ok) return NULL;
    fm_scratch *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s || pthread_setspecific(g_scratch_key, s) != 0) {
            free(s);
            return NULL;
        }
    }
    if (s->cap < bytes) {
        size_t cap = bytes + bytes / 2 + 4096;
        cap = (cap + 63) & ~(size_t)63;
        void *p = aligned_alloc(64, cap);
        if (!p) return NULL;
        free(s->p);
        s->p = p;
        s->cap = cap;
    }
    return s->p;
}

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

/* ---- the call ---- */

/* One matrix of a job: its rows go out in chunks numbered from `first`. */
typedef struct {
    const fm_matrix *w;
    float *y;
    const float *bias;
    int64_t chunk, first; /* rows per chunk; the job-wide index of this matrix's first chunk */
} fm_mm_part;

typedef struct {
    fm_mm_kernel kern;
    const fm_mm_act *act;
    const fm_mm_part *parts;
    int n_parts;
    int64_t n_chunks;           /* over all parts */
    char *tls;                  /* n_tls private slots of tls_stride bytes, or NULL */
    size_t tls_stride;          /* bytes per slot */
    int n_tls;                  /* slots: the pool size */
    _Atomic int64_t next_chunk; /* the next chunk to take */
} fm_mm_job;

/* Workers take chunks of rows from a shared counter until none are left, so a core that streams slower
 * (a shared VM, a busy sibling) gets fewer chunks instead of making the other wait at the end of every
 * product. A row's result does not depend on which worker computes it, nor on the chunk it falls in. */
static void mm_task(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)begin;
    (void)end;
    fm_mm_job *j = ctx;
    /* A serial run (nested call, busy pool) may carry any worker index; it is alone on this job's slots. */
    void *tls = j->tls ? j->tls + (size_t)(thread < j->n_tls ? thread : 0) * j->tls_stride : NULL;
    int p = 0;
    for (;;) {
        const int64_t c = atomic_fetch_add_explicit(&j->next_chunk, 1, memory_order_relaxed);
        if (c >= j->n_chunks) break;
        while (p + 1 < j->n_parts && c >= j->parts[p + 1].first) p++; /* c only grows */
        const fm_mm_part *pt = &j->parts[p];
        const int64_t rows = pt->w->rows, r0 = (c - pt->first) * pt->chunk;
        const int64_t r1 = r0 + pt->chunk < rows ? r0 + pt->chunk : rows;
        j->kern(pt->w, j->act, pt->y, pt->bias, r0, r1, tls);
    }
}

/* One block's term of a row's dot product in the fallback below: x (one block of activations) quantised as
 * the kernels quantise it, then the scalar kernel's formula for the weight type. */
static float nomem_block_term(fm_dtype dt, const void *wb, const float *x) {
    if (fm_dtype_is_k_quant(dt)) {
        fm_block_q8_K xb;
        fm_quant_q8_K_ref(x, &xb, FM_QK_K);
        return fm_k_block_dot(dt, wb, &xb);
    }
    fm_block_q8_0 xb;
    fm_quant_q8_0_scalar(x, &xb, NULL, FM_QK8_0, 1);
    float dw;
    int32_t isum = 0;
    if (dt == FM_DTYPE_Q8_0) {
        const fm_block_q8_0 *q = wb;
        for (int k = 0; k < FM_QK8_0; k++) isum += (int32_t)q->qs[k] * xb.qs[k];
        dw = fm_f16_to_f32(q->d);
    } else {
        isum = fm_legacy_isum(dt, wb, &xb, &dw);
    }
    return (float)isum * (dw * fm_f16_to_f32(xb.d));
}

/* Serial fallback for the block types when the workspace cannot be had: the scalar kernels on blocks
 * quantised one at a time would need storage too, so quantise into a stack block per (token, block) and use
 * the scalar formula. */
static void matmul_blocks_nomem(const fm_matrix *w, const float *x, int T, float *y, const float *bias) {
    const int be = fm_dtype_block_elems(w->dtype);
    const int64_t nb = w->cols / be;
    const size_t bb = (size_t)fm_dtype_block_bytes(w->dtype);
    for (int64_t r = 0; r < w->rows; r++) {
        const char *wr = (const char *)w->data + (size_t)r * (size_t)nb * bb;
        for (int t = 0; t < T; t++) {
            float s = 0;
            for (int64_t b = 0; b < nb; b++) {
                const fm_block_q8_0 q8 =
                    w->dtype == FM_DTYPE_Q8_0 ? fm_matrix_q8_0_block(w, r, b) : (fm_block_q8_0){0};
                const void *wb = w->dtype == FM_DTYPE_Q8_0 ? (const void *)&q8 : wr + (size_t)b * bb;
                s += nomem_block_term(w->dtype, wb, x + (int64_t)t * w->cols + b * be);
            }
            y[(int64_t)t * w->rows + r] = s + (bias ? bias[r] : 0.0f);
        }
    }
}

enum { MM_MAX_PARTS = 16 };

static void matmul_run(fm_pool *pool, const fm_mm_table *tab, const fm_matrix *const *ws, int n,
                       const float *x, int T, float *const *ys, const float *const *biases);

/* Whether the level's Q8_0 kernel reads FM_LAYOUT_Q8_VNNI4 matrices itself. */
static int reads_vnni4(const fm_mm_table *tab) {
    return tab->q8 && tab->q8->reads_vnni4;
}

/* A repacked matrix at a level whose kernels read only rows (tests lower the level after loading): through
 * a temporary copy in rows, the same products bit for bit; block by block when that copy cannot be had. */
static void matmul_via_rows(fm_pool *pool, const fm_mm_table *tab, const fm_matrix *w, const float *x, int T,
                            float *y, const float *bias) {
    const int64_t nb = w->cols / FM_QK8_0;
    fm_block_q8_0 *rows = malloc((size_t)w->rows * (size_t)nb * sizeof *rows);
    if (!rows) {
        matmul_blocks_nomem(w, x, T, y, bias);
        return;
    }
    for (int64_t r = 0; r < w->rows; r++)
        for (int64_t b = 0; b < nb; b++) rows[r * nb + b] = fm_matrix_q8_0_block(w, r, b);
    const fm_matrix copy = {w->dtype, w->rows, w->cols, rows, NULL, FM_LAYOUT_ROWS};
    const fm_matrix *cp = &copy;
    matmul_run(pool, tab, &cp, 1, x, T, &y, bias ? &bias : NULL);
    free(rows);
}

/* ys[i] = ws[i] x (+ biases[i]) for n matrices of one dtype and one cols, sharing x's preparation and one
 * pool job. */
static void matmul_run(fm_pool *pool, const fm_mm_table *tab, const fm_matrix *const *ws, int n,
                       const float *x, int T, float *const *ys, const float *const *biases) {
    if (T <= 0 || n <= 0) return;
    int vnni4 = 0;
    for (int i = 0; i < n; i++) vnni4 |= ws[i]->layout == FM_LAYOUT_Q8_VNNI4;
    if (vnni4 && !reads_vnni4(tab)) {
        for (int i = 0; i < n; i++) {
            const float *bias = biases ? biases[i] : NULL;
            if (ws[i]->layout == FM_LAYOUT_Q8_VNNI4)
                matmul_via_rows(pool, tab, ws[i], x, T, ys[i], bias);
            else
                matmul_run(pool, tab, &ws[i], 1, x, T, &ys[i], biases ? &biases[i] : NULL);
        }
        return;
    }
    const fm_dtype dt = ws[0]->dtype;
    const int64_t cols = ws[0]->cols;
    const int workers = fm_pool_size(pool);
    fm_mm_act act = {.T = T, .x = x};
    fm_mm_kernel kern = tab->kern[dt];
    char *tls = NULL;
    size_t tls_stride = 0;
    if (dt == FM_DTYPE_Q8_0 && tab->q8) {
        const fm_mm_q8_family *q8 = vnni4 ? tab->q8 : q8_family(tab, T); /* AMX reads rows only */
        if (q8 != tab->q8) atomic_fetch_add_explicit(&g_amx_calls, 1, memory_order_relaxed);
        const size_t abytes = align64(q8->act_bytes(T, cols));
        tls_stride = align64(q8->tls_bytes(T, cols));
        char *ws_buf = scratch_get(abytes + (size_t)workers * tls_stride);
        if (!ws_buf) {
            for (int i = 0; i < n; i++) matmul_blocks_nomem(ws[i], x, T, ys[i], biases ? biases[i] : NULL);
            return;
        }
        q8->act_prep(x, T, cols, ws_buf, &act);
        tls = ws_buf + abytes;
        kern = q8->kern;
    } else if (dt == FM_DTYPE_Q8_0 || fm_dtype_is_legacy_quant(dt)) { /* block-major Q8_0 activations */
        const int64_t nb = cols / FM_QK8_0;
        fm_block_q8_0 *xq = scratch_get((size_t)T * (size_t)nb * sizeof(fm_block_q8_0)); /* [nb][T] */
        if (!xq) {
            for (int i = 0; i < n; i++) matmul_blocks_nomem(ws[i], x, T, ys[i], biases ? biases[i] : NULL);
            return;
        }
        for (int t = 0; t < T; t++) tab->quant(x + (int64_t)t * cols, xq + t, NULL, cols, T);
        act.xq = xq;
    } else if (fm_dtype_is_k_quant(dt)) {
        const int64_t nb = cols / FM_QK_K;
        fm_block_q8_K *xk = scratch_get((size_t)T * (size_t)nb * sizeof(fm_block_q8_K)); /* [T][nb] */
        if (!xk) {
            for (int i = 0; i < n; i++) matmul_blocks_nomem(ws[i], x, T, ys[i], biases ? biases[i] : NULL);
            return;
        }
        tab->quant_k(x, xk, (int64_t)T * cols);
        act.xk = xk;
    } else if (dt == FM_DTYPE_BF16 && tab->split_bf16) {
        size_t m = (size_t)T * (size_t)cols, half = align64(m * sizeof(uint16_t));
        uint16_t *buf = scratch_get(2 * half);
        if (!buf) {
            kern = k_scalar.kern[FM_DTYPE_BF16];
        } else {
            act.xbf_hi = buf;                              /* [T][cols] */
            act.xbf_lo = (uint16_t *)((char *)buf + half); /* [T][cols] */
#ifdef FM_HAVE_X86_KERNELS
            fm_split_bf16_avx512(x, buf, (uint16_t *)act.xbf_lo, (int64_t)m);
#endif
        }
    }
    fm_mm_part parts[MM_MAX_PARTS];
    int64_t n_chunks = 0;
    for (int i = 0; i < n; i++) {
        const fm_matrix *w = ws[i];
        /* Threads pay off above ~32k multiply-adds per range (a wake-up costs a few microseconds). */
        int64_t grain = 32768 / (w->cols * (int64_t)T) + 1;
        if (grain < 4) grain = 4;
        /* About 8 chunks per worker: enough to even out the workers, few enough that taking one is free. */
        int64_t chunk = w->rows / (8 * (int64_t)workers);
        if (chunk < grain) chunk = grain;
        if (w->layout == FM_LAYOUT_Q8_VNNI4) chunk = (chunk + 3) & ~(int64_t)3; /* whole units of 4 rows */
        parts[i] = (fm_mm_part){w, ys[i], biases ? biases[i] : NULL, chunk, n_chunks};
        n_chunks += (w->rows + chunk - 1) / chunk;
    }
    fm_mm_job job = {kern, &act, parts, n, n_chunks, tls, tls_stride, workers, 0};
    const int64_t takers = n_chunks < workers ? n_chunks : workers;
    fm_pool_for(pool, takers, 1, mm_task, &job);
}

void fm_matmul(fm_pool *pool, const fm_matrix *w, const float *x, int T, float *y, const float *bias) {
    fm_mm_table tab = current_table();
    if (w->rows <= 0 || w->cols <= 0) return;
    matmul_run(pool, &tab, &w, 1, x, T, &y, bias ? &bias : NULL);
}

void fm_matmul_multi(fm_pool *pool, const fm_matrix *const *ws, int n, const float *x, int T,
                     float *const *ys) {
    fm_mm_table tab = current_table();
    int same = n <= MM_MAX_PARTS;
    for (int i = 0; i < n && same; i++)
        same = ws[i]->dtype == ws[0]->dtype && ws[i]->cols == ws[0]->cols && ws[i]->rows > 0;
    if (!same) {
        for (int i = 0; i < n; i++) fm_matmul(pool, ws[i], x, T, ys[i], NULL);
        return;
    }
    matmul_run(pool, &tab, ws, n, x, T, ys, NULL);
}

void fm_matmul_reference(const fm_matrix *w, const float *x, int T, float *y, const float *bias) {
    if (w->rows <= 0 || w->cols <= 0) return;
    matmul_run(NULL, &k_scalar, &w, 1, x, T, &y, bias ? &bias : NULL);
}

void fm_quantize_row_q8_0(const float *x, fm_block_q8_0 *y, int64_t n) {
    fm_mm_table tab = current_table();
    tab.quant(x, y, NULL, n, 1);
}

void fm_quantize_row_q8_0_reference(const float *x, fm_block_q8_0 *y, int64_t n) {
    fm_quant_q8_0_scalar(x, y, NULL, n, 1);
}

int fm_matrix_check(const fm_matrix *w, char *err, size_t errlen) {
    if (!w) return fm_set_error(err, errlen, "matmul: matrix is NULL");
    if ((unsigned)w->dtype >= FM_DTYPE_COUNT)
        return fm_set_error(
            err, errlen,
            "matmul: unknown dtype %d (expected f32, f16, bf16, q8_0, q4_k, q5_k, q6_k, q4_0 or q5_0)",
            (int)w->dtype);
    if (w->rows <= 0 || w->cols <= 0)
        return fm_set_error(err, errlen, "matmul: shape %lldx%lld, expected positive rows and cols",
                            (long long)w->rows, (long long)w->cols);
    int be = fm_dtype_block_elems(w->dtype);
    if (w->cols % be)
        return fm_set_error(err, errlen, "matmul: %s matrix has %lld cols, expected a multiple of %d",
                            fm_dtype_name(w->dtype), (long long)w->cols, be);
    if (!w->data) return fm_set_error(err, errlen, "matmul: %s matrix has no data", fm_dtype_name(w->dtype));
    return 0;
}

/* ---- pre-packed weights ---- */

size_t fm_matrix_packed_bytes(const fm_matrix *w, int T) {
    fm_mm_table tab = current_table();
    const fm_mm_q8_family *q8 = q8_family(&tab, T);
    if (w->dtype != FM_DTYPE_Q8_0 || w->layout != FM_LAYOUT_ROWS || w->rows <= 0 || w->cols <= 0 || !q8 ||
        !q8->pack_bytes)
        return 0;
    return q8->pack_bytes(T, w->rows, w->cols);
}

int fm_matrix_wants_vnni4(const fm_matrix *w) {
    const fm_mm_table tab = current_table();
    const char *off = getenv("FLASHMAP_NO_REPACK");
    if (off && *off && strcmp(off, "0") != 0) return 0;
    return fm_q8_vnni4_shape_ok(w) && reads_vnni4(&tab) && !tab.q8_amx;
}

typedef struct {
    const fm_mm_q8_family *q8;
    const fm_matrix *w;
    void *dst;
} pack_job;

static void pack_task(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const pack_job *j = ctx;
    j->q8->pack_rows(j->w, begin, end, j->dst);
}

void fm_matrix_pack_q8_0(fm_pool *pool, fm_matrix *w, int T, void *dst) {
    if (!fm_matrix_packed_bytes(w, T)) return;
    fm_mm_table tab = current_table();
    pack_job j = {q8_family(&tab, T), w, dst};
    fm_pool_for(pool, w->rows, 64, pack_task, &j);
    w->packed = dst;
}

void fm_matrix_row_f32(const fm_matrix *w, int64_t row, float *out) {
    const int64_t K = w->cols;
    switch (w->dtype) {
    case FM_DTYPE_F32: {
        const float *p = (const float *)w->data + row * K;
        for (int64_t k = 0; k < K; k++) out[k] = p[k];
        break;
    }
    case FM_DTYPE_F16: {
        const uint16_t *p = (const uint16_t *)w->data + row * K;
        for (int64_t k = 0; k < K; k++) out[k] = fm_f16_to_f32(p[k]);
        break;
    }
    case FM_DTYPE_BF16: {
        const uint16_t *p = (const uint16_t *)w->data + row * K;
        for (int64_t k = 0; k < K; k++) out[k] = fm_bf16_to_f32(p[k]);
        break;
    }
    case FM_DTYPE_Q8_0: {
        const int64_t nb = K / FM_QK8_0;
        for (int64_t b = 0; b < nb; b++) {
            const fm_block_q8_0 q = fm_matrix_q8_0_block(w, row, b);
            const float d = fm_f16_to_f32(q.d);
            for (int j = 0; j < FM_QK8_0; j++) out[b * FM_QK8_0 + j] = d * (float)q.qs[j];
        }
        break;
    }
    case FM_DTYPE_Q4_K:
    case FM_DTYPE_Q5_K:
    case FM_DTYPE_Q6_K:
        fm_dequant_row_k(w->dtype, (const char *)w->data + (size_t)row * fm_dtype_row_bytes(w->dtype, K), out,
                         K);
        break;
    case FM_DTYPE_Q4_0:
    case FM_DTYPE_Q5_0:
        fm_dequant_row_legacy(w->dtype, (const char *)w->data + (size_t)row * fm_dtype_row_bytes(w->dtype, K),
                              out, K);
        break;
    case FM_DTYPE_COUNT:
        break;
    }
}
