/* drafter_quantize.c: a one-time Q8_0 copy of the drafter's matrices for the CPU.
 *
 * A draft multiplies 16 slots by every drafter matrix; in BF16 that runs on the float FMA kernels at about a
 * third of the int8 kernels' speed, and reads twice the bytes. Drafts only steer speculation (the target
 * checks every token), so rounding the drafter's weights changes how many drafts are accepted, never the
 * output: bench/RESULTS.md records how often Q8_0 drafts equal BF16 drafts. Rows are quantised as ggml
 * quantises weights (per 32 values: d = amax / 127, q = round(x / d)), which is what fm_quantize_row_q8_0
 * does. fm_drafter_pack_q8_0 then keeps the rows a draft's batches read also pre-packed for the CPU kernel
 * that would otherwise widen them at every call (matmul.h, fm_matrix_pack_q8_0). */
#include <stdlib.h>
#include <sys/mman.h>

#include "core/error.h"
#include "drafter/drafter_internal.h"

typedef struct {
    const fm_matrix *src;
    fm_block_q8_0 *dst;
    float *row; /* [threads][cols] */
} quant_ctx;

static void quant_rows(void *p, int64_t begin, int64_t end, int thread) {
    quant_ctx *c = p;
    const int64_t cols = c->src->cols, nb = cols / FM_QK8_0;
    float *row = c->row + (size_t)thread * cols;
    for (int64_t r = begin; r < end; r++) {
        fm_matrix_row_f32(c->src, r, row);
        fm_quantize_row_q8_0(row, c->dst + r * nb, cols);
    }
}

/* Every matrix a draft or a context extension multiplies by. */
static int list_matrices(fm_drafter *d, fm_matrix **m) {
    int n = 0;
    m[n++] = &d->fc;
    m[n++] = &d->anchor_proj;
    m[n++] = &d->head;
    for (int l = 0; l < d->hp.n_layers; l++) {
        fmd_layer *L = &d->layers[l];
        fm_matrix *per[] = {&L->self.q,  &L->self.k,  &L->self.v,  &L->self.o, &L->cross.q,
                            &L->cross.k, &L->cross.v, &L->cross.o, &L->fc1,    &L->fc2};
        for (size_t i = 0; i < sizeof per / sizeof per[0]; i++) m[n++] = per[i];
    }
    return n;
}

/* Rows must split into whole 32-value blocks; narrower tiny test shapes keep their type. */
static int wants_q8_0(const fm_matrix *m) {
    return m->dtype != FM_DTYPE_Q8_0 && m->cols % FM_QK8_0 == 0;
}

int fm_drafter_quantize_q8_0(fm_drafter *d, fm_pool *pool, char *err, size_t errlen) {
    if (d->q8_data) return 0;
    int cap = 3 + 10 * d->hp.n_layers;
    fm_matrix **m = malloc((size_t)cap * sizeof *m);
    if (!m) return fm_set_error(err, errlen, "drafter: out of memory");
    int n = list_matrices(d, m);
    size_t total = 0;
    int64_t max_cols = 0;
    for (int i = 0; i < n; i++) {
        if (!wants_q8_0(m[i])) continue;
        total += fm_dtype_row_bytes(FM_DTYPE_Q8_0, m[i]->cols) * (size_t)m[i]->rows;
        if (m[i]->cols > max_cols) max_cols = m[i]->cols;
    }
    int nt = pool ? fm_pool_size(pool) : 1;
    /* 2 MiB-aligned and advised into huge pages: a draft streams all of it, as a step streams the target's
     * weights (io/mmap_file.c). The matrices follow each other: where their sizes are multiples of 64 bytes
     * (the VNNI layout's shapes), each starts 64-byte aligned for its vector loads. */
    const size_t bytes = (total + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    char *buf = total ? aligned_alloc((size_t)2 << 20, bytes) : NULL;
    if (buf) (void)madvise(buf, bytes, MADV_HUGEPAGE); /* advisory: failure is harmless */
    float *rows = malloc((size_t)nt * (size_t)(max_cols > 0 ? max_cols : 1) * sizeof(float));
    if ((total && !buf) || !rows) {
        free(m);
        free(buf);
        free(rows);
        return fm_set_error(err, errlen, "drafter: out of memory for a %.0f MB Q8_0 copy", total / 1e6);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        if (!wants_q8_0(m[i])) continue;
        quant_ctx c = {m[i], (fm_block_q8_0 *)(buf + off), rows};
        fm_pool_for(pool, m[i]->rows, 16, quant_rows, &c);
        off += fm_dtype_row_bytes(FM_DTYPE_Q8_0, m[i]->cols) * (size_t)m[i]->rows;
        m[i]->data = c.dst;
        m[i]->dtype = FM_DTYPE_Q8_0;
    }
    free(rows);
    free(m);
    d->q8_data = buf;
    d->q8_bytes = total;
    return 0;
}

/* The matrices a draft multiplies by all `block` slots (the context's fc, cross k/v and anchor_proj take
 * other batch sizes; the head takes n_out slots, packed for the full block). */
static int list_draft_matrices(fm_drafter *d, fm_matrix **m) {
    int n = 0;
    m[n++] = &d->head;
    for (int l = 0; l < d->hp.n_layers; l++) {
        fmd_layer *L = &d->layers[l];
        fm_matrix *per[] = {&L->self.q,  &L->self.k,  &L->self.v, &L->self.o,
                            &L->cross.q, &L->cross.o, &L->fc1,    &L->fc2};
        for (size_t i = 0; i < sizeof per / sizeof per[0]; i++) m[n++] = per[i];
    }
    return n;
}

/* The matrices of the Q8_0 copy (writable, unlike a file's) that the VNNI kernel reads faster rearranged:
 * rearranged in place (fm_matrix_repack_vnni4). */
static int repack_copy(fm_drafter *d, fm_pool *pool) {
    fm_matrix **m = malloc((size_t)(3 + 10 * d->hp.n_layers) * sizeof *m);
    if (!m) return -1;
    const int n = list_matrices(d, m);
    const char *lo = d->q8_data, *hi = lo + d->q8_bytes;
    for (int i = 0; i < n; i++) {
        const char *p = m[i]->data;
        if (lo && p >= lo && p < hi && fm_matrix_wants_vnni4(m[i]))
            fm_matrix_repack_vnni4(pool, m[i], (void *)p);
    }
    free(m);
    return 0;
}

int fm_drafter_pack_q8_0(fm_drafter *d, fm_pool *pool, char *err, size_t errlen) {
    if (d->q8_packed) return 0;
    if (repack_copy(d, pool)) return fm_set_error(err, errlen, "drafter: out of memory");
    fm_matrix **m = malloc((size_t)(1 + 8 * d->hp.n_layers) * sizeof *m);
    if (!m) return fm_set_error(err, errlen, "drafter: out of memory");
    const int n = list_draft_matrices(d, m), T = d->hp.block;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += (fm_matrix_packed_bytes(m[i], T) + 63) & ~(size_t)63;
    char *buf = total ? aligned_alloc(64, total) : NULL;
    if (total && !buf) {
        free(m);
        return fm_set_error(err, errlen, "drafter: out of memory for %.0f MB of pre-packed Q8_0 rows",
                            total / 1e6);
    }
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        const size_t bytes = fm_matrix_packed_bytes(m[i], T);
        if (!bytes) continue;
        fm_matrix_pack_q8_0(pool, m[i], T, buf + off);
        off += (bytes + 63) & ~(size_t)63;
    }
    free(m);
    d->q8_packed = buf;
    d->q8_packed_bytes = total;
    return 0;
}

size_t fm_drafter_packed_bytes(const fm_drafter *d) {
    return d->q8_packed_bytes;
}

fm_dtype fm_drafter_matrix_type(const fm_drafter *d) {
    return d->layers[0].fc1.dtype;
}
