/* qwen3_synth.h: writes random-weight Qwen3 dense models as GGUF, with the tensor names, shapes and metadata
 * keys of llama.cpp's Qwen3 GGUFs (so llama.cpp can run them too), and tokenizer metadata from a Hugging Face
 * tokenizer.json or a small builtin byte-level vocabulary.
 * Weights are a pure function of (seed, tensor name, element index) through a counter-based hash, so a model
 * is identical whatever the thread count, and multi-GB models are generated tensor by tensor while writing.
 */
#ifndef FM_MODEL_QWEN3_SYNTH_H
#define FM_MODEL_QWEN3_SYNTH_H

#include <stddef.h>
#include <stdint.h>

#include "core/dtype.h"

/* How the matrices' types are chosen. */
typedef enum {
    QWEN3_SYNTH_PURE = 0, /* every matrix (token table and lm_head included) is wtype */
    QWEN3_SYNTH_K_M,      /* llama.cpp's Q4_K_M / Q5_K_M mix of wtype Q4_K / Q5_K: qwen3_synth_tensor_dtype */
} qwen3_synth_mix;

typedef struct {
    int n_layers;        /* qwen3.block_count */
    int dim;             /* qwen3.embedding_length */
    int n_heads;         /* qwen3.attention.head_count */
    int n_kv_heads;      /* qwen3.attention.head_count_kv; divides n_heads */
    int head_dim;        /* qwen3.attention.key_length = value_length; even (RoPE pairs) */
    int ffn;             /* qwen3.feed_forward_length */
    int vocab;           /* rows of token_embd; 0 = qwen3_synth_default_vocab(tokenizer's token count) */
    fm_dtype wtype;      /* matrices (token_embd and output included); norms are always f32 */
    qwen3_synth_mix mix; /* QWEN3_SYNTH_K_M: some matrices Q6_K instead (wtype Q4_K or Q5_K) */
    int tied;            /* 1: no output.weight, the token table is the lm_head (as Qwen3-4B) */
    uint64_t seed;
    float rope_theta;           /* qwen3.rope.freq_base */
    float rms_eps;              /* qwen3.attention.layer_norm_rms_epsilon */
    int context_length;         /* qwen3.context_length */
    float qk_norm;              /* q/k norm weights (sharpness of attention); 0: the default 3 */
    const char *tokenizer_json; /* HF tokenizer.json, or NULL for the builtin byte-level vocabulary */
    int n_threads;              /* generation threads; <= 0: one per core */
    /* Optional progress report, called after each tensor from the writing thread. */
    void (*progress)(void *ctx, int tensor, int n_tensors, uint64_t bytes_done, uint64_t bytes_total);
    void *progress_ctx;
} qwen3_synth_params;

/* Presets: "tiny" (2 layers, dim 64, 4/2 heads of 16, ffn 128, f32, untied, builtin vocab) and "qwen3-4b"
 * (36 layers, 2560, 32/8 heads of 128, ffn 9728, vocab 151936, q8_0, tied). -1 for an unknown name. */
int qwen3_synth_preset(const char *name, qwen3_synth_params *p);

/* Checks the shape: positive sizes, n_heads % n_kv_heads, even head_dim, input dimensions (dim,
 * n_heads*head_dim, ffn) multiples of the type's block (32 for Q8_0, 256 for the K-quants), sizes that fit.
 * One line naming the first bad field. */
int qwen3_synth_validate(const qwen3_synth_params *p, char *err, size_t errlen);

/* Tokens of the tokenizer (largest id + 1 over model.vocab and added_tokens; the builtin vocabulary when
 * tokenizer_json is NULL). */
int qwen3_synth_tokenizer_size(const char *tokenizer_json, int *n_tokens, char *err, size_t errlen);

/* The embedding row count Qwen would use for n_tokens: 151936 for the Qwen2/Qwen3 tokenizers (151643..151936
 * tokens), else n_tokens rounded up to a multiple of 128. */
int qwen3_synth_default_vocab(int n_tokens);

/* Writes the model to path (temporary file + rename). p->vocab == 0 picks the default vocab. */
int qwen3_synth_write(const qwen3_synth_params *p, const char *path, char *err, size_t errlen);

/* --type names: f32, f16, bf16, q8_0, q4_k, q5_k, q6_k, q4_0, q5_0 (every matrix of that type), q4_k_m,
 * q5_k_m (llama.cpp's mixes), case-insensitive. Sets p->wtype and p->mix; -1 when unknown (p unchanged). */
int qwen3_synth_parse_type(const char *name, qwen3_synth_params *p);
/* The --type name of p's weights ("q4_k_m", "q8_0", ...). */
const char *qwen3_synth_type_name(const qwen3_synth_params *p);
/* The type the writer gives a tensor: f32 for the norms (names ending in "_norm.weight"), else wtype, except
 * in a K_M mix (see the recipe in qwen3_synth.c): Q6_K for the lm_head and for attn_v / ffn_down of some
 * layers. */
fm_dtype qwen3_synth_tensor_dtype(const qwen3_synth_params *p, const char *tensor);
/* general.file_type: llama.cpp's llama_ftype for p's weights (ALL_F32 0, MOSTLY_F16 1, MOSTLY_Q8_0 7,
 * MOSTLY_Q4_K_S 14, MOSTLY_Q4_K_M 15, MOSTLY_Q5_K_S 16, MOSTLY_Q5_K_M 17, MOSTLY_Q6_K 18, MOSTLY_BF16 32,
 * MOSTLY_Q4_0 2, MOSTLY_Q5_0 8). */
uint32_t qwen3_synth_file_type(const qwen3_synth_params *p);

/* The generator, exposed for tests: element i of the named tensor as the f32 value before any rounding to the
 * tensor's type, and a whole row quantised as ggml's quantize_row_q8_0_ref does (n % 32 == 0). */
float qwen3_synth_value(const qwen3_synth_params *p, const char *tensor, int64_t row, int64_t col);
/* Row `row` of the named tensor, those f32 values, into out (as many as the tensor's columns); returns the
 * column count, 0 for an unknown tensor or a negative row. */
int64_t qwen3_synth_row(const qwen3_synth_params *p, const char *tensor, int64_t row, float *out);
void qwen3_synth_quantize_q8_0(const float *x, fm_block_q8_0 *y, int64_t n);
/* A row of n floats (n % 256 == 0, finite, |x| < 1e4) as n / 256 blocks of K-quant type t (Q4_K, Q5_K or
 * Q6_K). Not ggml's search for the best scales: per sub-block, the step that covers its range [min(0, min x),
 * max x] (Q4_K, Q5_K: 15 or 31 steps above an offset) or [-max|x|, max|x|] (Q6_K: 31 steps each side), the
 * 6-bit (Q4_K, Q5_K) or int8 (Q6_K) multiples of the super-block's f16 scales rounded up so that they cover
 * it, and each weight rounded to the nearest level: every weight dequantises (fm_dequant_row_k) to within
 * half its sub-block's step, a step at most one scale unit above range / steps. */
void qwen3_synth_quantize_k(fm_dtype t, const float *x, void *y, int64_t n);

#endif
