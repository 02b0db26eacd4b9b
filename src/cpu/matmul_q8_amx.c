/* matmul_q8_amx.c: the AMX-INT8 Q8_0 kernel for batches (AVX-512 F/BW/VL/DQ + AMX-TILE/INT8; matmul.c calls
 * it only when fm_cpu_amx() says the CPU has the tiles and Linux granted them, and only for the batch sizes
 * of amx_batch there: decode steps and batches up to 8 keep the AVX-512 VNNI direct path).
 *
 * Bit identity with the AVX-512 VNNI kernel (matmul_q8_avx512.c) for every (row, token): that kernel takes
 * the exact int32 dot of each 32-value block, then per (row, token, group of 16 blocks) one convert, one
 * multiply of the block's two f16 scales (as f32) and one FMA into lane l (the block's place in its group) of
 * a 16-lane accumulator, groups in order, and at the end _mm512_reduce_add_ps. This kernel computes the same
 * int32 block dots with tdpbssd (signed x signed, exact), one block per tile op (K = 32 bytes) so that a C
 * tile holds one block's dots for 16 rows x 16 tokens, and keeps the accumulator of every (row, token, lane
 * l) in a vector over tokens instead: the same convert, multiply (commutative) and FMA per element, groups in
 * the same order, then the same pairwise tree as _mm512_reduce_add_ps (lanes l and l + 8, then + 4, + 2,
 * + 1), one vector add per level over 16 tokens.
 *
 * Layout. Weights are read as they are (GGUF blocks of 34 bytes): an A tile is block b of 16 rows, 32 bytes
 * each at a row stride, so there is no packing pass; the f16 scales of a panel of 16 rows are converted once
 * into the worker's scratch. Activations are quantised once per call into B tiles (8 rows of 16 tokens x 4
 * bytes per block, the layout tdpbssd wants) with their f32 scales per block and token. A panel visits its
 * blocks lane by lane (l = 0..15, then the groups in order), so that the 16 accumulators of one lane stay in
 * registers; that order skips around the rows, so the next panel is prefetched into L2 meanwhile.
 *
 * Tiles: tmm0/1 C, tmm2/3 A, tmm4/5 B (two blocks in flight). Tile operations are inline asm with memory
 * clobbers: gcc 12's _tile_loadconfig lets the compiler drop the stores that build the configuration, and its
 * _tile_stored does not tell the compiler that memory changed. */
#include <immintrin.h>
#include <string.h>

#include "cpu/matmul_kernels.h"
#include "cpu/simd_avx.h"

enum {
    AMX_ROWS = 16,   /* rows per panel (A and C tile rows) */
    AMX_TOK = 16,    /* tokens per B / C tile */
    AMX_G = 16,      /* blocks per group of the VNNI kernel: accumulator lanes */
    AMX_BTILE = 512, /* bytes of one block's B tile: 8 rows x 16 tokens x 4 bytes */
    AMX_BLOCK = 34,  /* bytes of a GGUF Q8_0 block: f16 d + 32 int8 */
};

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;

#define AMX_LOAD(t, p, s)                                                                                    \
    __asm__ volatile("tileloadd (%0,%1,1), %%tmm" #t ::"r"(p), "r"((long)(s)) : "memory")
#define AMX_STORE(t, p, s)                                                                                   \
    __asm__ volatile("tilestored %%tmm" #t ", (%0,%1,1)" ::"r"(p), "r"((long)(s)) : "memory")
/* (no operands: basic asm, where % is written as it is) */
#define AMX_ZERO(t) __asm__ volatile("tilezero %tmm" #t)
#define AMX_DP(c, a, b) __asm__ volatile("tdpbssd %tmm" #b ", %tmm" #a ", %tmm" #c)

/* Tiles for panels of n rows (1..16). */
static void amx_config(int n) {
    amx_cfg c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 2; t++) {
        c.rows[t] = (uint8_t)n; /* C: n rows x 16 int32 */
        c.colsb[t] = 64;
        c.rows[2 + t] = (uint8_t)n; /* A: n rows x one block */
        c.colsb[2 + t] = 32;
        c.rows[4 + t] = 8; /* B: 8 rows of 16 tokens x 4 bytes */
        c.colsb[4 + t] = 64;
    }
    __asm__ volatile("ldtilecfg %0" ::"m"(c) : "memory");
}

static size_t align64(size_t n) {
    return (n + 63) & ~(size_t)63;
}

static int64_t amx_tiles(int T) {
    return (T + AMX_TOK - 1) / AMX_TOK;
}

static size_t amx_act_bytes(int T, int64_t cols) {
    const size_t nb = (size_t)(cols / FM_QK8_0), n = (size_t)amx_tiles(T) * nb;
    return align64(n * AMX_BTILE) + align64(n * AMX_TOK * sizeof(float)) +
           align64(nb * sizeof(fm_block_q8_0)) + align64(nb * sizeof(float));
}

/* Quantises each token (the same quantiser as the VNNI kernel: bit-identical to the scalar one) and scatters
 * its blocks into the B tiles: xr [tile][block][8][16 tokens][4], xs [tile][block][16 tokens]; the tokens
 * past T are zeros. */
static void amx_act_prep(const float *x, int T, int64_t cols, void *ws, fm_mm_act *a) {
    const int64_t nb = cols / FM_QK8_0, n = amx_tiles(T) * nb;
    int8_t *xr = ws;
    float *xs = (float *)((char *)ws + align64((size_t)n * AMX_BTILE));
    fm_block_q8_0 *blk = (fm_block_q8_0 *)((char *)xs + align64((size_t)n * AMX_TOK * sizeof(float)));
    float *d = (float *)((char *)blk + align64((size_t)nb * sizeof(fm_block_q8_0)));
    if (T % AMX_TOK) {
        const int64_t last = (amx_tiles(T) - 1) * nb;
        memset(xr + last * AMX_BTILE, 0, (size_t)nb * AMX_BTILE);
        memset(xs + last * AMX_TOK, 0, (size_t)nb * AMX_TOK * sizeof(float));
    }
    for (int t = 0; t < T; t++) {
        fm_quant_q8_0_avx2(x + (int64_t)t * cols, blk, d, cols, 1);
        const int64_t tile = t / AMX_TOK, col = t % AMX_TOK;
        for (int64_t b = 0; b < nb; b++) {
            int8_t *bt = xr + (tile * nb + b) * AMX_BTILE + 4 * col;
            for (int k = 0; k < 8; k++) memcpy(bt + 64 * k, blk[b].qs + 4 * k, 4);
            xs[(tile * nb + b) * AMX_TOK + col] = d[b];
        }
    }
    a->ng = nb; /* this kernel's unit is the block */
    a->xr = xr;
    a->xs = xs;
    a->xc = NULL;
}

static size_t amx_tls_bytes(int T, int64_t cols) {
    (void)T;
    const size_t nb = (size_t)(cols / FM_QK8_0);
    return align64(AMX_ROWS * nb * sizeof(float)) + 2 * AMX_ROWS * AMX_TOK * sizeof(int32_t) +
           (size_t)AMX_G * AMX_ROWS * AMX_TOK * sizeof(float);
}

/* The f32 scales of the panel's blocks, dw [nb][16 rows] (the same vcvtph2ps as the VNNI kernel); 0 for the
 * rows past n, which give no output. */
static void amx_panel_scales(const char *pb, int64_t row_bytes, int n, int64_t nb, float *dw) {
    const __m512i idx =
        _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                           _mm512_set1_epi32((int)row_bytes));
    const __mmask16 rows = (__mmask16)((1u << n) - 1);
    for (int64_t b = 0; b < nb; b++) {
        /* d and the 2 bytes after it, in each row */
        const __m512i v =
            _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), rows, idx, pb + b * AMX_BLOCK, 1);
        _mm512_store_ps(dw + b * AMX_ROWS, _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)));
    }
}

/* One block's f32 step for the 16 rows of a panel: c [16 rows][16 tokens] int32 dots, dw [16 rows] weight
 * scales and xs [16 tokens] activation scales of the block. Per element: convert, scale product, FMA. */
FM_INLINE void amx_block_f32(__m512 acc[AMX_ROWS], const int32_t *c, const float *dw, const float *xs) {
    const __m512 xv = _mm512_load_ps(xs);
#pragma GCC unroll 16
    for (int m = 0; m < AMX_ROWS; m++) {
        const __m512 s = _mm512_mul_ps(_mm512_set1_ps(dw[m]), xv);
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_load_si512(c + AMX_TOK * m)), s, acc[m]);
    }
}

/* A prefetch stream into L2: a few lines per block op. */
typedef struct {
    const char *p, *end;
    int per_op;
} amx_prefetch;

FM_INLINE void amx_prefetch_some(amx_prefetch *pf) {
    for (int i = 0; i < pf->per_op && pf->p < pf->end; i++, pf->p += 64) _mm_prefetch(pf->p, _MM_HINT_T1);
}

/* One panel (rows pb.., n of them: the tile configuration's) x one token tile: every lane l's 16 accumulators
 * run over groups g = 0, 1, ... (block 16 g + l) in registers, two blocks in flight, then wait in accb
 * [lane][row][token]; blocks past nb are the VNNI kernel's zero padding, whose FMA (0 x 0 + acc) leaves acc
 * as it is, so they are skipped. */
static void amx_panel_tile(const char *pb, int64_t row_bytes, int64_t nb, const int8_t *xb, const float *xs,
                           const float *dw, int32_t *cb, float *accb, amx_prefetch *pf) {
    for (int l = 0; l < AMX_G; l++) {
        __m512 acc[AMX_ROWS];
#pragma GCC unroll 16
        for (int m = 0; m < AMX_ROWS; m++) acc[m] = _mm512_setzero_ps();
        int64_t b = l;
        for (; b + AMX_G < nb; b += 2 * AMX_G) {
            const int64_t b1 = b + AMX_G;
            AMX_ZERO(0);
            AMX_LOAD(2, pb + b * AMX_BLOCK + 2, row_bytes);
            AMX_LOAD(4, xb + b * AMX_BTILE, 64);
            AMX_DP(0, 2, 4);
            AMX_ZERO(1);
            AMX_LOAD(3, pb + b1 * AMX_BLOCK + 2, row_bytes);
            AMX_LOAD(5, xb + b1 * AMX_BTILE, 64);
            AMX_DP(1, 3, 5);
            AMX_STORE(0, cb, 64);
            AMX_STORE(1, cb + AMX_ROWS * AMX_TOK, 64);
            amx_prefetch_some(pf);
            amx_block_f32(acc, cb, dw + b * AMX_ROWS, xs + b * AMX_TOK);
            amx_block_f32(acc, cb + AMX_ROWS * AMX_TOK, dw + b1 * AMX_ROWS, xs + b1 * AMX_TOK);
        }
        if (b < nb) {
            AMX_ZERO(0);
            AMX_LOAD(2, pb + b * AMX_BLOCK + 2, row_bytes);
            AMX_LOAD(4, xb + b * AMX_BTILE, 64);
            AMX_DP(0, 2, 4);
            AMX_STORE(0, cb, 64);
            amx_prefetch_some(pf);
            amx_block_f32(acc, cb, dw + b * AMX_ROWS, xs + b * AMX_TOK);
        }
#pragma GCC unroll 16
        for (int m = 0; m < AMX_ROWS; m++) _mm512_store_ps(accb + (l * AMX_ROWS + m) * AMX_TOK, acc[m]);
    }
}

/* Row m's 16 lane accumulators (over tokens) summed as _mm512_reduce_add_ps sums the lanes of one. */
FM_INLINE __m512 amx_reduce(const float *accb, int m) {
    __m512 v[AMX_G];
#pragma GCC unroll 16
    for (int l = 0; l < AMX_G; l++) v[l] = _mm512_load_ps(accb + (l * AMX_ROWS + m) * AMX_TOK);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) v[i] = _mm512_add_ps(v[i + 8], v[i]);
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) v[i] = _mm512_add_ps(v[i + 4], v[i]);
    v[0] = _mm512_add_ps(v[0], v[2]);
    v[1] = _mm512_add_ps(v[1], v[3]);
    return _mm512_add_ps(v[0], v[1]);
}

/* Rows [r0, r1) in panels of 16 for all token tiles. */
static void amx_kernel(const fm_matrix *w, const fm_mm_act *a, float *y, const float *bias, int64_t r0,
                       int64_t r1, void *tls) {
    const int64_t nb = w->cols / FM_QK8_0, row_bytes = nb * AMX_BLOCK, nt = amx_tiles(a->T);
    const char *wbase = w->data;
    float *dw = tls;
    int32_t *cb = (int32_t *)((char *)tls + align64(AMX_ROWS * (size_t)nb * sizeof(float)));
    float *accb = (float *)(cb + 2 * AMX_ROWS * AMX_TOK);
    int cfg_n = 0;
    /* The first panel up front; each panel then prefetches the next (past r1 too: likely this worker's next
     * chunk) spread over its first token tile's block ops. */
    const int64_t first_end = r0 + AMX_ROWS < r1 ? r0 + AMX_ROWS : r1;
    for (const char *p = wbase + r0 * row_bytes; p < wbase + first_end * row_bytes; p += 64)
        _mm_prefetch(p, _MM_HINT_T1);
    for (int64_t p0 = r0; p0 < r1; p0 += AMX_ROWS) {
        const int n = r1 - p0 < AMX_ROWS ? (int)(r1 - p0) : AMX_ROWS;
        if (n != cfg_n) {
            amx_config(n);
            cfg_n = n;
        }
        const char *pb = wbase + p0 * row_bytes;
        amx_panel_scales(pb, row_bytes, n, nb, dw);
        const int64_t next_end = p0 + n + AMX_ROWS < w->rows ? p0 + n + AMX_ROWS : w->rows;
        amx_prefetch pf = {pb + n * row_bytes, wbase + next_end * row_bytes, 0};
        /* about nb / 2 + 16 prefetch calls per token tile (one per pair of blocks) */
        if (pf.end > pf.p) pf.per_op = (int)(2 * ((pf.end - pf.p) / 64) / nb) + 1;
        for (int64_t tile = 0; tile < nt; tile++) {
            amx_panel_tile(pb, row_bytes, nb, a->xr + tile * nb * AMX_BTILE, a->xs + tile * nb * AMX_TOK, dw,
                           cb, accb, &pf);
            const int tt = a->T - tile * AMX_TOK < AMX_TOK ? (int)(a->T - tile * AMX_TOK) : AMX_TOK;
            for (int m = 0; m < n; m++) {
                float out[AMX_TOK];
                _mm512_storeu_ps(out, amx_reduce(accb, m));
                for (int t = 0; t < tt; t++)
                    fm_mm_store(w, y, bias, p0 + m, (int)(tile * AMX_TOK) + t, out[t]);
            }
        }
    }
    __asm__ volatile("tilerelease" ::: "memory");
}

const fm_mm_q8_family fm_q8_family_amx = {
    .act_bytes = amx_act_bytes,
    .act_prep = amx_act_prep,
    .tls_bytes = amx_tls_bytes,
    .kern = amx_kernel,
};
