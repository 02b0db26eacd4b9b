/* qwen3_synth.c: random-weight Qwen3 models (see qwen3_synth.h).
 *
 * Tensors, as llama.cpp names and shapes them (ggml order: ne[0] = columns = input dimension):
 *   token_embd.weight [dim, vocab]        output.weight [dim, vocab] (untied only)   output_norm.weight [dim]
 *   blk.N.attn_norm [dim]  attn_q [dim, H*hd]  attn_k, attn_v [dim, KV*hd]  attn_output [H*hd, dim]
 *   blk.N.attn_q_norm, attn_k_norm [hd]  ffn_norm [dim]  ffn_gate, ffn_up [dim, ffn]  ffn_down [ffn, dim]
 *
 * Initialisation (x below has mean 0, std 1: a sum of two 16-bit uniforms, triangular, range +-2.45):
 *   - projections reading the residual stream (q, k, v, gate, up): x / sqrt(fan_in), so their outputs have
 *     about unit RMS (their inputs are RMS-normalised);
 *   - projections writing to it (attn_output, ffn_down): the same divided by sqrt(2 * n_layers), so the
 *     stream grows to O(1) RMS over all layers instead of exploding (activations stay finite at 36 layers);
 *   - norm weights: c (1 + 0.05 x), c = 1 for attn_norm / ffn_norm, 3 for attn_q_norm / attn_k_norm
 *     (attention scores of std ~3: each position attends to a few others instead of a context average,
 *     which would give every position the same hidden state and a greedy output of one repeated token);
 *   - token table and output rows: 0.25 x / sqrt(dim) times a per-row factor exp(0.5 z), z a four-uniform
 *     sum of std 1, and output_norm c = 4, so logits have std ~ the row factor. A token table small next
 *     to the block outputs keeps a tied model from predicting its input token again; rows of distinct norms
 *     widen the gap between the best and second-best token (with random hidden states: a median top-2 gap
 *     of 0.9 logit std instead of 0.19 with equal norms), so greedy decisions are rarely near-ties that
 *     rounding differences between kernels could flip.
 *   These constants were chosen with a numpy forward pass of 36-layer models (tests/test_synth_gguf_py.py
 *   checks the same properties): hidden RMS stays O(1), greedy continuations vary, top-2 gaps are wide.
 * Every value is hash(seed, tensor name, element index): a pure function, so any split over threads gives the
 * same file. Q8_0 tensors are those f32 values quantised per 32-block as ggml's quantize_row_q8_0_ref,
 * K-quant tensors by qwen3_synth_quantize_k (below; the Q4_K_M / Q5_K_M per-tensor types follow llama.cpp).
 */
#include "model/qwen3_synth.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"
#include "core/threadpool.h"
#include "cpu/quant_legacy.h"
#include "io/gguf.h"
#include "tokenizer/tokenizer_meta.h"

#define SYNTH_MAX_SIZE (1 << 24) /* any single dimension */
#define SYNTH_MAX_LAYERS 4096
#define SYNTH_NORM_JITTER 0.05f
#define SYNTH_ROW_SPREAD 0.5    /* log-std of the token-row norm factors */
#define SYNTH_TOKEN_SCALE 0.25f /* token rows: SYNTH_TOKEN_SCALE / sqrt(dim) */
#define SYNTH_QK_NORM 3.0f      /* q/k norm weights by default: sharper attention */
#define SYNTH_OUT_NORM 4.0f     /* output_norm weights: 1 / SYNTH_TOKEN_SCALE, logits of std ~1 */
/* Qwen2/Qwen3 tokenizers have 151643 base tokens plus up to a few hundred specials; their models use this. */
#define QWEN_VOCAB_BASE 151643
#define QWEN_VOCAB_PADDED 151936

int qwen3_synth_preset(const char *name, qwen3_synth_params *p) {
    memset(p, 0, sizeof *p);
    p->seed = 1234;
    p->rope_theta = 1000000.0f;
    p->rms_eps = 1e-6f;
    if (!strcmp(name, "tiny")) {
        p->n_layers = 2, p->dim = 64, p->n_heads = 4, p->n_kv_heads = 2, p->head_dim = 16, p->ffn = 128;
        p->vocab = 0, p->wtype = FM_DTYPE_F32, p->tied = 0, p->context_length = 2048;
        return 0;
    }
    if (!strcmp(name, "qwen3-4b")) { /* Qwen/Qwen3-4B config.json */
        p->n_layers = 36, p->dim = 2560, p->n_heads = 32, p->n_kv_heads = 8, p->head_dim = 128, p->ffn = 9728;
        p->vocab = QWEN_VOCAB_PADDED, p->wtype = FM_DTYPE_Q8_0, p->tied = 1, p->context_length = 40960;
        return 0;
    }
    return -1;
}

int qwen3_synth_default_vocab(int n_tokens) {
    if (n_tokens >= QWEN_VOCAB_BASE && n_tokens <= QWEN_VOCAB_PADDED) return QWEN_VOCAB_PADDED;
    return (n_tokens + 127) / 128 * 128;
}

/* ---- weight types ----
 * The K_M mixes follow llama.cpp's llama-quantize for Q4_K_M and Q5_K_M (llama_tensor_get_type in
 * src/llama-quant.cpp, read for its rules; a dense, non-Falcon model without an imatrix or overrides):
 *   - the lm_head, i.e. output.weight, or token_embd.weight when the model is tied, is Q6_K; an untied
 *     token_embd.weight keeps the base type;
 *   - attn_v.weight and ffn_down.weight of layer i are Q6_K when "more bits" holds for (i, n_layers): i <
 *     n / 8, or i >= 7 n / 8, or (i - n / 8) % 3 == 2 (integer division): about half the layers, the first
 *     and last eighth and every third one between;
 *   - every other matrix is the base type (Q4_K or Q5_K); norms stay f32.
 * (llama.cpp falls back to other types for rows that are not a multiple of 256; we refuse such shapes.)
 * The pure K types, and q4_0 / q5_0, are what `llama-quantize --pure` writes: every matrix in that type
 * (Q4_0 / Q5_0 by round to nearest per block of 32, fm_quant_legacy_rtn in cpu/quant_legacy.h). */

static const struct {
    const char *name;
    fm_dtype wtype;
    qwen3_synth_mix mix;
    uint32_t file_type; /* llama_ftype */
} synth_types[] = {
    {"f32", FM_DTYPE_F32, QWEN3_SYNTH_PURE, 0},     {"f16", FM_DTYPE_F16, QWEN3_SYNTH_PURE, 1},
    {"bf16", FM_DTYPE_BF16, QWEN3_SYNTH_PURE, 32},  {"q8_0", FM_DTYPE_Q8_0, QWEN3_SYNTH_PURE, 7},
    {"q4_k", FM_DTYPE_Q4_K, QWEN3_SYNTH_PURE, 14},  /* MOSTLY_Q4_K_S, as llama-quantize --pure Q4_K_S */
    {"q5_k", FM_DTYPE_Q5_K, QWEN3_SYNTH_PURE, 16},  /* MOSTLY_Q5_K_S, as llama-quantize --pure Q5_K_S */
    {"q6_k", FM_DTYPE_Q6_K, QWEN3_SYNTH_PURE, 18},  /* MOSTLY_Q6_K (llama-quantize Q6_K: all Q6_K) */
    {"q4_k_m", FM_DTYPE_Q4_K, QWEN3_SYNTH_K_M, 15}, /* MOSTLY_Q4_K_M */
    {"q5_k_m", FM_DTYPE_Q5_K, QWEN3_SYNTH_K_M, 17}, /* MOSTLY_Q5_K_M */
    {"q4_0", FM_DTYPE_Q4_0, QWEN3_SYNTH_PURE, 2},   /* MOSTLY_Q4_0, as llama-quantize --pure Q4_0 */
    {"q5_0", FM_DTYPE_Q5_0, QWEN3_SYNTH_PURE, 8},   /* MOSTLY_Q5_0, as llama-quantize --pure Q5_0 */
};
#define N_SYNTH_TYPES (int)(sizeof synth_types / sizeof synth_types[0])

static int synth_type_index(const qwen3_synth_params *p) {
    for (int i = 0; i < N_SYNTH_TYPES; i++)
        if (synth_types[i].wtype == p->wtype && synth_types[i].mix == p->mix) return i;
    return -1;
}

int qwen3_synth_parse_type(const char *name, qwen3_synth_params *p) {
    for (int i = 0; i < N_SYNTH_TYPES; i++)
        if (!strcasecmp(name, synth_types[i].name)) {
            p->wtype = synth_types[i].wtype;
            p->mix = synth_types[i].mix;
            return 0;
        }
    return -1;
}

const char *qwen3_synth_type_name(const qwen3_synth_params *p) {
    const int i = synth_type_index(p);
    return i < 0 ? "?" : synth_types[i].name;
}

uint32_t qwen3_synth_file_type(const qwen3_synth_params *p) {
    const int i = synth_type_index(p);
    return i < 0 ? 0 : synth_types[i].file_type;
}

static int more_bits(int i, int n) {
    return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

fm_dtype qwen3_synth_tensor_dtype(const qwen3_synth_params *p, const char *tensor) {
    const size_t len = strlen(tensor), nl = strlen("_norm.weight");
    if (len >= nl && !strcmp(tensor + len - nl, "_norm.weight")) return FM_DTYPE_F32;
    if (p->mix != QWEN3_SYNTH_K_M) return p->wtype;
    if (!strcmp(tensor, "output.weight") || (p->tied && !strcmp(tensor, "token_embd.weight")))
        return FM_DTYPE_Q6_K;
    int layer = -1, at = 0;
    if (sscanf(tensor, "blk.%d.%n", &layer, &at) == 1 && at > 0 &&
        (!strcmp(tensor + at, "attn_v.weight") || !strcmp(tensor + at, "ffn_down.weight")) &&
        more_bits(layer, p->n_layers))
        return FM_DTYPE_Q6_K;
    return p->wtype;
}

static int check_size(const char *what, int v, int max, char *err, size_t errlen) {
    if (v < 1 || v > max)
        return fm_set_error(err, errlen, "synth: %s = %d is out of range (1..%d)", what, v, max);
    return 0;
}

int qwen3_synth_validate(const qwen3_synth_params *p, char *err, size_t errlen) {
    if (check_size("layers", p->n_layers, SYNTH_MAX_LAYERS, err, errlen) ||
        check_size("dim", p->dim, SYNTH_MAX_SIZE, err, errlen) ||
        check_size("heads", p->n_heads, SYNTH_MAX_SIZE, err, errlen) ||
        check_size("kv-heads", p->n_kv_heads, SYNTH_MAX_SIZE, err, errlen) ||
        check_size("head-dim", p->head_dim, SYNTH_MAX_SIZE, err, errlen) ||
        check_size("ffn", p->ffn, SYNTH_MAX_SIZE, err, errlen) ||
        check_size("ctx", p->context_length, INT32_MAX, err, errlen))
        return -1;
    if (p->vocab != 0 && check_size("vocab", p->vocab, SYNTH_MAX_SIZE, err, errlen)) return -1;
    if (synth_type_index(p) < 0) return fm_set_error(err, errlen, "synth: invalid weight type");
    if (p->n_heads % p->n_kv_heads)
        return fm_set_error(err, errlen, "synth: heads (%d) must be a multiple of kv-heads (%d)", p->n_heads,
                            p->n_kv_heads);
    if (p->head_dim % 2)
        return fm_set_error(err, errlen, "synth: head-dim %d must be even (RoPE rotates pairs)", p->head_dim);
    if ((int64_t)p->n_heads * p->head_dim > SYNTH_MAX_SIZE)
        return fm_set_error(err, errlen, "synth: heads * head-dim = %lld is too large",
                            (long long)p->n_heads * p->head_dim);
    int be = fm_dtype_block_elems(p->wtype);
    const struct {
        const char *what;
        int64_t n;
    } inputs[] = {{"dim", p->dim}, {"heads * head-dim", (int64_t)p->n_heads * p->head_dim}, {"ffn", p->ffn}};
    for (int i = 0; i < 3; i++)
        if (inputs[i].n % be)
            return fm_set_error(err, errlen, "synth: %s = %lld must be a multiple of %d for %s weights",
                                inputs[i].what, (long long)inputs[i].n, be, qwen3_synth_type_name(p));
    if (!(p->rope_theta > 0) || !(p->rms_eps > 0))
        return fm_set_error(err, errlen, "synth: rope theta and rms eps must be positive");
    return 0;
}

int qwen3_synth_tokenizer_size(const char *tokenizer_json, int *n_tokens, char *err, size_t errlen) {
    if (!tokenizer_json) {
        *n_tokens = fm_tokenizer_builtin_n_tokens();
        return *n_tokens > 0 ? 0 : fm_set_error(err, errlen, "synth: builtin tokenizer: out of memory");
    }
    if (fm_tokenizer_json_n_tokens(tokenizer_json, n_tokens, err, errlen)) return -1;
    if (*n_tokens > SYNTH_MAX_SIZE)
        return fm_set_error(err, errlen, "%s: %d tokens is more than a synthetic model takes", tokenizer_json,
                            *n_tokens);
    return 0;
}

/* ---- the generator ---- */

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

#define GOLDEN 0x9e3779b97f4a7c15ull

/* Mean 0, std 1: the sum of the four 16-bit lanes of h (exact in float: at most 262140). */
static inline float irwin_hall4(uint64_t h) {
    uint32_t s = (uint32_t)(h & 0xffff) + (uint32_t)((h >> 16) & 0xffff) + (uint32_t)((h >> 32) & 0xffff) +
                 (uint32_t)(h >> 48);
    return ((float)s - 131070.0f) * (1.0f / 37837.23f); /* 37837.23 = 65536 / sqrt(3) */
}

static uint64_t name_key(uint64_t seed, const char *name) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a of the name, mixed with the seed */
    for (const char *c = name; *c; c++) h = (h ^ (unsigned char)*c) * 1099511628211ull;
    return mix64(seed ^ mix64(h));
}

typedef enum { KIND_MATRIX, KIND_TOKENS, KIND_NORM } synth_kind;

typedef struct synth_shared synth_shared;

typedef struct {
    char name[64];
    synth_kind kind;
    int64_t rows, cols; /* ne[1] (rows) x ne[0] (cols) */
    float scale;        /* KIND_MATRIX / KIND_TOKENS */
    uint64_t key;
    fm_dtype dtype;
    synth_shared *sh;
    int index;
} synth_tensor;

struct synth_shared {
    fm_pool *pool;
    float *rows; /* [pool size][max_cols]: one row of f32 values per worker */
    int64_t max_cols;
    const qwen3_synth_params *p;
    int n_tensors;
    uint64_t bytes_done, bytes_total;
};

static float row_factor(const synth_tensor *t, int64_t row) {
    if (t->kind != KIND_TOKENS) return 1.0f;
    return (float)exp(SYNTH_ROW_SPREAD * irwin_hall4(mix64(t->key ^ GOLDEN ^ mix64((uint64_t)row))));
}

/* Mean 0, std 1: the sum of the two 16-bit halves of a 32-bit word (a triangular distribution, range
 * +-2.45; exact in float). */
static inline float triangular(uint32_t w) {
    return ((float)((w & 0xffff) + (w >> 16)) - 65535.0f) * (1.0f / 26754.9f); /* 26754.9 = 65536 / sqrt(6) */
}

/* Row `row` as f32 values [cols]. Element index i = row * cols + col draws on half of hash(key, i / 2), so
 * one 64-bit hash serves two values (generation is about twice as fast as one hash per value). */
static void gen_row(const synth_tensor *t, int64_t row, float *out) {
    const uint64_t first = (uint64_t)row * (uint64_t)t->cols;
    const float s = t->kind == KIND_NORM ? SYNTH_NORM_JITTER * t->scale : t->scale * row_factor(t, row);
    const float add = t->kind == KIND_NORM ? t->scale : 0.0f; /* norms: scale * (1 + jitter x) */
    uint64_t h = mix64(t->key + (first >> 1) * GOLDEN);
    for (int64_t c = 0; c < t->cols; c++) {
        const uint64_t i = first + (uint64_t)c;
        if (!(i & 1) && c) h = mix64(t->key + (i >> 1) * GOLDEN);
        out[c] = add + s * triangular((i & 1) ? (uint32_t)(h >> 32) : (uint32_t)h);
    }
}

/* roundf (halves away from zero) for |x| < 2^23, without the libm call that made Q8_0 generation 3x slower:
 * x minus its truncation is exact in that range, so the comparison with 0.5 decides as roundf does. */
static inline int round_half_away(float x) {
    int q = (int)x;
    float f = x - (float)q;
    return q + (f >= 0.5f) - (f <= -0.5f);
}

void qwen3_synth_quantize_q8_0(const float *x, fm_block_q8_0 *y, int64_t n) {
    for (int64_t b = 0; b < n / FM_QK8_0; b++, x += FM_QK8_0) {
        float amax = 0.0f;
        for (int j = 0; j < FM_QK8_0; j++) {
            const float v = fabsf(x[j]);
            amax = amax > v ? amax : v; /* ggml's MAX(amax, fabsf(v)) */
        }
        const float d = amax / 127.0f;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        y[b].d = fm_f32_to_f16(d);
        for (int j = 0; j < FM_QK8_0; j++) y[b].qs[j] = (int8_t)round_half_away(x[j] * id);
    }
}

/* ---- K-quants ----
 * A simple quantiser, not ggml's (which searches for the scales that minimise a weighted error): the range of
 * each sub-block decides its step, the steps are stored as 6-bit (Q4_K, Q5_K) or int8 (Q6_K) multiples of an
 * f16 super-block scale, and each weight goes to the nearest level. Every stored scale is rounded *up* (the
 * f16 super-block scales to the next f16 not below them, the small multiples by ceil), so the levels always
 * cover the sub-block's range and no weight is clamped: each dequantises to within half its step. Rounding up
 * costs at most one scale unit per step (1/63 of the largest step of the block, 1/127 for Q6_K). */

/* The f16 nearest v (0 <= v, finite), stepped up once when it lies below v; the largest finite f16 at most.
 */
static uint16_t f16_at_least(float v) {
    uint16_t h = fm_f32_to_f16(v);
    if (h >= 0x7c00) return 0x7bff;
    if (fm_f16_to_f32(h) < v && h < 0x7bff) h++; /* positive f16s are ordered like their bit patterns */
    return h;
}

/* Smallest integer k in 0..kmax with k * unit >= v (v >= 0), kmax when none; 0 when unit is 0. */
static int scale_units(float v, float unit, int kmax) {
    if (!(unit > 0)) return 0;
    float k = ceilf(v / unit);
    return k < (float)kmax ? (int)k : kmax;
}

/* One Q4_K / Q5_K super-block (nmax = 15 or 31): sub-block j of 32 gets offset M_j = dmin * m_j >= -min(0,
 * min x) and step D_j = d * sc_j >= (max x + M_j) / nmax; q = nearest((x + M_j) / D_j) in 0..nmax, so that
 * d * sc_j * q - dmin * m_j (fm_dequant_row_k) is within D_j / 2 of x. */
static void quant_qx_K_block(const float *x, int nmax, uint16_t *d16, uint16_t *dmin16, uint8_t scales[12],
                             uint8_t q[FM_QK_K]) {
    float off[8], hi[8], max_off = 0.0f;
    for (int j = 0; j < 8; j++) {
        float lo = 0.0f, h = x[32 * j]; /* the offset is >= 0, as the format's mins are (m_j >= 0) */
        for (int k = 0; k < 32; k++) {
            const float v = x[32 * j + k];
            lo = v < lo ? v : lo;
            h = v > h ? v : h;
        }
        off[j] = -lo, hi[j] = h;
        max_off = off[j] > max_off ? off[j] : max_off;
    }
    *dmin16 = f16_at_least(max_off / 63.0f);
    const float dmin = fm_f16_to_f32(*dmin16);
    int m[8], sc[8];
    float need[8], max_need = 0.0f, M[8];
    for (int j = 0; j < 8; j++) {
        m[j] = scale_units(off[j], dmin, 63);
        M[j] = dmin * (float)m[j];
        const float r = hi[j] + M[j];
        need[j] = (r > 0.0f ? r : 0.0f) / (float)nmax;
        max_need = need[j] > max_need ? need[j] : max_need;
    }
    *d16 = f16_at_least(max_need / 63.0f);
    const float d = fm_f16_to_f32(*d16);
    memset(scales, 0, 12);
    for (int j = 0; j < 8; j++) {
        sc[j] = scale_units(need[j], d, 63);
        const float D = d * (float)sc[j];
        const float inv = D > 0.0f ? 1.0f / D : 0.0f;
        for (int k = 0; k < 32; k++) {
            const int v = round_half_away((x[32 * j + k] + M[j]) * inv);
            q[32 * j + k] = (uint8_t)(v < 0 ? 0 : v > nmax ? nmax : v);
        }
        /* the packing fm_k_scale_min reads: j < 4 in the low 6 bits of bytes j (scale) and j + 4 (min);
         * j >= 4: low nibbles in byte j + 4, top 2 bits in the top bits of bytes j - 4 (scale) and j (min) */
        if (j < 4) {
            scales[j] |= (uint8_t)sc[j];
            scales[j + 4] |= (uint8_t)m[j];
        } else {
            scales[j + 4] = (uint8_t)((sc[j] & 0xF) | ((m[j] & 0xF) << 4));
            scales[j - 4] |= (uint8_t)((sc[j] >> 4) << 6);
            scales[j] |= (uint8_t)((m[j] >> 4) << 6);
        }
    }
}

static void quant_q4_K(const float *x, fm_block_q4_K *y) {
    uint8_t q[FM_QK_K];
    quant_qx_K_block(x, 15, &y->d, &y->dmin, y->scales, q);
    for (int c = 0; c < 4; c++) /* chunk c of 64: weight 64c + l in the low nibble, 64c + 32 + l high */
        for (int l = 0; l < 32; l++) y->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}

static void quant_q5_K(const float *x, fm_block_q5_K *y) {
    uint8_t q[FM_QK_K];
    quant_qx_K_block(x, 31, &y->d, &y->dmin, y->scales, q);
    memset(y->qh, 0, sizeof y->qh);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++) {
            const uint8_t a = q[64 * c + l], b = q[64 * c + 32 + l];
            y->qs[32 * c + l] = (uint8_t)((a & 0xF) | ((b & 0xF) << 4));
            y->qh[l] |= (uint8_t)(((a >> 4) << (2 * c)) | ((b >> 4) << (2 * c + 1))); /* the fifth bits */
        }
}

/* Q6_K: sub-block j of 16 gets step D_j = d * sc_j >= max |x| / 31 (sc_j in 0..127); q = nearest(x / D_j)
 * in -32..31, stored as q + 32 (low 4 bits in ql, high 2 in qh, the layout fm_dequant_row_k reads). */
static void quant_q6_K(const float *x, fm_block_q6_K *y) {
    float need[16], max_need = 0.0f;
    for (int j = 0; j < 16; j++) {
        float a = 0.0f;
        for (int k = 0; k < 16; k++) {
            const float v = fabsf(x[16 * j + k]);
            a = v > a ? v : a;
        }
        need[j] = a / 31.0f;
        max_need = need[j] > max_need ? need[j] : max_need;
    }
    y->d = f16_at_least(max_need / 127.0f);
    const float d = fm_f16_to_f32(y->d);
    uint8_t u[FM_QK_K];
    for (int j = 0; j < 16; j++) {
        const int sc = scale_units(need[j], d, 127);
        y->scales[j] = (int8_t)sc;
        const float D = d * (float)sc;
        const float inv = D > 0.0f ? 1.0f / D : 0.0f;
        for (int k = 0; k < 16; k++) {
            const int v = round_half_away(x[16 * j + k] * inv);
            u[16 * j + k] = (uint8_t)((v < -32 ? -32 : v > 31 ? 31 : v) + 32);
        }
    }
    memset(y->ql, 0, sizeof y->ql);
    memset(y->qh, 0, sizeof y->qh);
    for (int h = 0; h < 2; h++) /* weight 128h + 32i + l: nibble of ql[64h + l + 32 (i & 1)], bits 2i of qh */
        for (int i = 0; i < 4; i++)
            for (int l = 0; l < 32; l++) {
                const uint8_t v = u[128 * h + 32 * i + l];
                y->ql[64 * h + l + 32 * (i & 1)] |= (uint8_t)((v & 0xF) << (i < 2 ? 0 : 4));
                y->qh[32 * h + l] |= (uint8_t)((v >> 4) << (2 * i));
            }
}

void qwen3_synth_quantize_k(fm_dtype t, const float *x, void *y, int64_t n) {
    for (int64_t b = 0; b < n / FM_QK_K; b++, x += FM_QK_K) {
        if (t == FM_DTYPE_Q4_K)
            quant_q4_K(x, (fm_block_q4_K *)y + b);
        else if (t == FM_DTYPE_Q5_K)
            quant_q5_K(x, (fm_block_q5_K *)y + b);
        else if (t == FM_DTYPE_Q6_K)
            quant_q6_K(x, (fm_block_q6_K *)y + b);
    }
}

typedef struct {
    const synth_tensor *t;
    uint8_t *dst;
    size_t row_bytes;
} fill_job;

static void fill_rows(void *ctx, int64_t begin, int64_t end, int thread) {
    const fill_job *j = ctx;
    const synth_tensor *t = j->t;
    float *row = t->sh->rows + (size_t)thread * (size_t)t->sh->max_cols; /* [cols] */
    for (int64_t r = begin; r < end; r++) {
        uint8_t *dst = j->dst + (size_t)r * j->row_bytes;
        gen_row(t, r, row);
        switch (t->dtype) {
        case FM_DTYPE_F32:
            memcpy(dst, row, (size_t)t->cols * 4);
            break;
        case FM_DTYPE_F16:
            for (int64_t c = 0; c < t->cols; c++) {
                uint16_t h = fm_f32_to_f16(row[c]);
                memcpy(dst + 2 * c, &h, 2);
            }
            break;
        case FM_DTYPE_BF16:
            for (int64_t c = 0; c < t->cols; c++) {
                uint16_t h = fm_f32_to_bf16(row[c]);
                memcpy(dst + 2 * c, &h, 2);
            }
            break;
        case FM_DTYPE_Q8_0:
            qwen3_synth_quantize_q8_0(row, (fm_block_q8_0 *)dst, t->cols);
            break;
        case FM_DTYPE_Q4_K:
        case FM_DTYPE_Q5_K:
        case FM_DTYPE_Q6_K:
            qwen3_synth_quantize_k(t->dtype, row, dst, t->cols);
            break;
        case FM_DTYPE_Q4_0:
        case FM_DTYPE_Q5_0:
            fm_quant_legacy_rtn(t->dtype, row, dst, t->cols);
            break;
        default:
            break;
        }
    }
}

static void fill_tensor(void *ctx, void *dst, size_t size) {
    const synth_tensor *t = ctx;
    synth_shared *sh = t->sh;
    fill_job j = {t, dst, fm_dtype_row_bytes(t->dtype, t->cols)};
    int64_t grain = 65536 / t->cols + 1; /* rows per task: at least ~64K values */
    fm_pool_for(sh->pool, t->rows, grain, fill_rows, &j);
    sh->bytes_done += size;
    if (sh->p->progress)
        sh->p->progress(sh->p->progress_ctx, t->index + 1, sh->n_tensors, sh->bytes_done, sh->bytes_total);
}

/* The spec of every tensor, in file order. Returns the count (<= cap). */
static int build_specs(const qwen3_synth_params *p, synth_tensor *ts, int cap) {
    int n = 0;
    const int64_t dim = p->dim, q_dim = (int64_t)p->n_heads * p->head_dim,
                  kv_dim = (int64_t)p->n_kv_heads * p->head_dim;
    const float resid = 1.0f / sqrtf(2.0f * (float)p->n_layers);
#define ADD(kind_, rows_, cols_, scale_, ...)                                                                \
    do {                                                                                                     \
        if (n < cap) {                                                                                       \
            synth_tensor *t = &ts[n];                                                                        \
            memset(t, 0, sizeof *t);                                                                         \
            snprintf(t->name, sizeof t->name, __VA_ARGS__);                                                  \
            t->kind = kind_, t->rows = rows_, t->cols = cols_, t->scale = scale_;                            \
            t->dtype = kind_ == KIND_NORM ? FM_DTYPE_F32 : qwen3_synth_tensor_dtype(p, t->name);             \
            t->key = name_key(p->seed, t->name);                                                             \
            t->index = n;                                                                                    \
        }                                                                                                    \
        n++;                                                                                                 \
    } while (0)
    const float tok = SYNTH_TOKEN_SCALE / sqrtf((float)dim);
    const float qk_norm = p->qk_norm > 0 ? p->qk_norm : SYNTH_QK_NORM;
    ADD(KIND_TOKENS, p->vocab, dim, tok, "token_embd.weight");
    for (int l = 0; l < p->n_layers; l++) {
        ADD(KIND_NORM, 1, dim, 1.0f, "blk.%d.attn_norm.weight", l);
        ADD(KIND_MATRIX, q_dim, dim, 1.0f / sqrtf((float)dim), "blk.%d.attn_q.weight", l);
        ADD(KIND_MATRIX, kv_dim, dim, 1.0f / sqrtf((float)dim), "blk.%d.attn_k.weight", l);
        ADD(KIND_MATRIX, kv_dim, dim, 1.0f / sqrtf((float)dim), "blk.%d.attn_v.weight", l);
        ADD(KIND_MATRIX, dim, q_dim, resid / sqrtf((float)q_dim), "blk.%d.attn_output.weight", l);
        ADD(KIND_NORM, 1, p->head_dim, qk_norm, "blk.%d.attn_q_norm.weight", l);
        ADD(KIND_NORM, 1, p->head_dim, qk_norm, "blk.%d.attn_k_norm.weight", l);
        ADD(KIND_NORM, 1, dim, 1.0f, "blk.%d.ffn_norm.weight", l);
        ADD(KIND_MATRIX, p->ffn, dim, 1.0f / sqrtf((float)dim), "blk.%d.ffn_gate.weight", l);
        ADD(KIND_MATRIX, p->ffn, dim, 1.0f / sqrtf((float)dim), "blk.%d.ffn_up.weight", l);
        ADD(KIND_MATRIX, dim, p->ffn, resid / sqrtf((float)p->ffn), "blk.%d.ffn_down.weight", l);
    }
    ADD(KIND_NORM, 1, dim, SYNTH_OUT_NORM, "output_norm.weight");
    if (!p->tied) ADD(KIND_TOKENS, p->vocab, dim, tok, "output.weight");
#undef ADD
    return n;
}

/* The spec of the named tensor of p's model; 0 when found. */
static int find_spec(const qwen3_synth_params *p, const char *tensor, synth_tensor *out) {
    qwen3_synth_params q = *p;
    if (q.vocab == 0) q.vocab = 1; /* shapes other than the row count do not depend on it */
    int cap = 11 * q.n_layers + 3, rc = -1;
    synth_tensor *ts = malloc((size_t)cap * sizeof *ts);
    if (!ts) return -1;
    int n = build_specs(&q, ts, cap);
    for (int i = 0; i < n && rc; i++)
        if (strcmp(ts[i].name, tensor) == 0) *out = ts[i], rc = 0;
    free(ts);
    return rc;
}

int64_t qwen3_synth_row(const qwen3_synth_params *p, const char *tensor, int64_t row, float *out) {
    synth_tensor t;
    if (row < 0 || find_spec(p, tensor, &t)) return 0;
    gen_row(&t, row, out);
    return t.cols;
}

float qwen3_synth_value(const qwen3_synth_params *p, const char *tensor, int64_t row, int64_t col) {
    synth_tensor t;
    float v = NAN;
    if (row < 0 || find_spec(p, tensor, &t) || col < 0 || col >= t.cols) return v;
    float *r = malloc((size_t)t.cols * sizeof *r);
    if (r) {
        gen_row(&t, row, r);
        v = r[col];
    }
    free(r);
    return v;
}

int qwen3_synth_write(const qwen3_synth_params *p_in, const char *path, char *err, size_t errlen) {
    qwen3_synth_params p = *p_in;
    if (qwen3_synth_validate(&p, err, errlen)) return -1;
    int n_tok;
    if (qwen3_synth_tokenizer_size(p.tokenizer_json, &n_tok, err, errlen)) return -1;
    if (p.vocab == 0) p.vocab = qwen3_synth_default_vocab(n_tok);
    if (p.vocab < n_tok)
        return fm_set_error(err, errlen, "synth: vocab %d is smaller than the tokenizer's %d tokens", p.vocab,
                            n_tok);

    gguf_writer *w = gguf_writer_create();
    int cap = 11 * p.n_layers + 3;
    synth_tensor *ts = calloc((size_t)cap, sizeof *ts);
    if (!w || !ts) {
        gguf_writer_free(w);
        free(ts);
        return fm_set_error(err, errlen, "%s: out of memory", path);
    }
    gguf_writer_set_str(w, "general.architecture", "qwen3");
    gguf_writer_set_str(w, "general.name", "flashmap synthetic qwen3");
    gguf_writer_set_u32(w, "general.file_type", qwen3_synth_file_type(&p));
    gguf_writer_set_u32(w, "general.quantization_version", 2);
    gguf_writer_set_u32(w, "qwen3.block_count", (uint32_t)p.n_layers);
    gguf_writer_set_u32(w, "qwen3.context_length", (uint32_t)p.context_length);
    gguf_writer_set_u32(w, "qwen3.embedding_length", (uint32_t)p.dim);
    gguf_writer_set_u32(w, "qwen3.feed_forward_length", (uint32_t)p.ffn);
    gguf_writer_set_u32(w, "qwen3.attention.head_count", (uint32_t)p.n_heads);
    gguf_writer_set_u32(w, "qwen3.attention.head_count_kv", (uint32_t)p.n_kv_heads);
    gguf_writer_set_u32(w, "qwen3.attention.key_length", (uint32_t)p.head_dim);
    gguf_writer_set_u32(w, "qwen3.attention.value_length", (uint32_t)p.head_dim);
    gguf_writer_set_f32(w, "qwen3.rope.freq_base", p.rope_theta);
    gguf_writer_set_f32(w, "qwen3.attention.layer_norm_rms_epsilon", p.rms_eps);
    gguf_writer_set_val(w, "flashmap.synth.seed", GGUF_TYPE_UINT64, &p.seed);
    int rc = fm_tokenizer_write_gguf_metadata(w, p.tokenizer_json, p.vocab, err, errlen);

    synth_shared sh = {0};
    sh.p = &p;
    int n = rc ? 0 : build_specs(&p, ts, cap);
    sh.n_tensors = n;
    for (int i = 0; i < n && rc == 0; i++) {
        synth_tensor *t = &ts[i];
        t->sh = &sh;
        int64_t ne[2] = {t->cols, t->rows};
        rc = gguf_writer_add_tensor_fn(w, t->name, t->kind == KIND_NORM ? 1 : 2, ne, t->dtype, fill_tensor, t,
                                       err, errlen);
        sh.bytes_total += (uint64_t)fm_dtype_row_bytes(t->dtype, t->cols) * (uint64_t)t->rows;
    }
    for (int i = 0; i < n; i++)
        if (ts[i].cols > sh.max_cols) sh.max_cols = ts[i].cols;
    if (rc == 0) {
        sh.pool = fm_pool_create(p.n_threads);
        int n_workers = sh.pool ? fm_pool_size(sh.pool) : 1;
        sh.rows = malloc((size_t)n_workers * (size_t)sh.max_cols * sizeof *sh.rows);
        rc = sh.rows ? gguf_writer_write(w, path, err, errlen)
                     : fm_set_error(err, errlen, "%s: out of memory", path);
        free(sh.rows);
        fm_pool_free(sh.pool);
    }
    gguf_writer_free(w);
    free(ts);
    return rc;
}
