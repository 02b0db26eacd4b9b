/* q8_layout.c: the Q8_0 matrices' in-place VNNI layout (FM_LAYOUT_Q8_VNNI4, matmul.h): the repacking and
 * the reading of single blocks back out of it (token-table lookups, the slow paths of other ISA levels).
 * Plain C: the layout must be the same bytes whichever CPU wrote it. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/matmul.h"
#include "cpu/q8_layout.h"

/* The byte offset of row r's quant byte k (0..31) of block l (0..15) inside a unit-group, and of its scale.
 */
static size_t quant_at(int r, int l, int k) {
    return (size_t)(k / 4) * 256 + (size_t)r * 64 + (size_t)l * 4 + (size_t)(k % 4);
}

static size_t scale_at(int r, int l) {
    return 4 * FM_VNNI4_QUANTS + (size_t)r * FM_VNNI4_BLOCKS * 2 + (size_t)l * 2;
}

fm_block_q8_0 fm_matrix_q8_0_block(const fm_matrix *w, int64_t row, int64_t b) {
    const int64_t nb = w->cols / FM_QK8_0;
    if (w->layout != FM_LAYOUT_Q8_VNNI4) return ((const fm_block_q8_0 *)w->data)[row * nb + b];
    const int64_t ng = w->cols / FM_VNNI4_COLS, g = b / FM_VNNI4_BLOCKS;
    const int r = (int)(row % 4), l = (int)(b % FM_VNNI4_BLOCKS);
    const unsigned char *grp = (const unsigned char *)w->data + (size_t)((row / 4) * ng + g) * FM_VNNI4_GROUP;
    fm_block_q8_0 out;
    memcpy(&out.d, grp + scale_at(r, l), sizeof out.d);
    for (int k = 0; k < FM_QK8_0; k++) out.qs[k] = (int8_t)(grp[quant_at(r, l, k)] ^ 0x80);
    return out;
}

typedef struct {
    const fm_matrix *w;
    unsigned char *bytes;
    fm_block_q8_0 **tmp; /* one unit's rows per worker */
    int n_tmp;
} repack_job;

/* Units [begin, end): each is copied out (4 rows in the file's layout) and written back rearranged. */
static void repack_units(void *p, int64_t begin, int64_t end, int thread) {
    const repack_job *j = p;
    const int64_t nb = j->w->cols / FM_QK8_0, ng = j->w->cols / FM_VNNI4_COLS;
    const size_t unit = (size_t)ng * FM_VNNI4_GROUP; /* = 4 rows of nb blocks */
    /* A serial run (nested call, busy pool) may carry any worker index; it is alone on the buffers. */
    fm_block_q8_0 *rows = j->tmp[thread < j->n_tmp ? thread : 0];
    for (int64_t u = begin; u < end; u++) {
        unsigned char *dst = j->bytes + (size_t)u * unit;
        memcpy(rows, dst, unit);
        for (int64_t g = 0; g < ng; g++, dst += FM_VNNI4_GROUP)
            for (int r = 0; r < 4; r++)
                for (int l = 0; l < FM_VNNI4_BLOCKS; l++) {
                    const fm_block_q8_0 *blk = &rows[r * nb + g * FM_VNNI4_BLOCKS + l];
                    memcpy(dst + scale_at(r, l), &blk->d, sizeof blk->d);
                    for (int k = 0; k < FM_QK8_0; k += 4) { /* 4 bytes a lane */
                        uint32_t word;
                        memcpy(&word, blk->qs + k, 4);
                        word ^= 0x80808080u;
                        memcpy(dst + quant_at(r, l, k), &word, 4);
                    }
                }
    }
}

int fm_q8_vnni4_shape_ok(const fm_matrix *w) {
    return w->dtype == FM_DTYPE_Q8_0 && w->layout == FM_LAYOUT_ROWS && w->rows > 0 && w->rows % 4 == 0 &&
           w->cols > 0 && w->cols % FM_VNNI4_COLS == 0;
}

int fm_matrix_repack_vnni4(fm_pool *pool, fm_matrix *w, void *bytes) {
    if (!fm_q8_vnni4_shape_ok(w) || bytes != w->data) return -1;
    enum { MAX_WORKERS = 256 };
    fm_block_q8_0 *tmp[MAX_WORKERS] = {0};
    const int n = pool && fm_pool_size(pool) <= MAX_WORKERS ? fm_pool_size(pool) : 1; /* else serially */
    int ok = 1;
    /* Every buffer before any byte moves: a failure leaves the matrix as it was. */
    for (int i = 0; i < n && ok; i++)
        ok = (tmp[i] = malloc((size_t)(w->cols / FM_VNNI4_COLS) * FM_VNNI4_GROUP)) != NULL;
    if (ok) {
        repack_job j = {w, bytes, tmp, n};
        fm_pool_for(n > 1 ? pool : NULL, w->rows / 4, 16, repack_units, &j);
        w->layout = FM_LAYOUT_Q8_VNNI4;
    }
    for (int i = 0; i < n; i++) free(tmp[i]);
    return ok ? 0 : -1;
}
