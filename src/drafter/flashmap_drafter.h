/* flashmap_drafter.h: the FlashMap drafter (a small DiT) on the CPU. It drafts the `block` tokens after the
 * last verified token (the anchor) in one forward pass, from the target's captured hidden states (the
 * context) and the target's token table and lm_head. See shared/spec/NOTES.md for the math.
 *
 * Usage: load once for a target; extend_context with the target's feature rows as positions are verified
 * (rows of n_capture * target_dim floats: the captured layers' outputs, concatenated in target_layers
 * order); draft(anchor, pos) proposes the tokens after the anchor sitting at context position pos. */
#ifndef FM_DRAFTER_FLASHMAP_DRAFTER_H
#define FM_DRAFTER_FLASHMAP_DRAFTER_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"
#include "model/qwen3.h"

#define FM_DRAFTER_MAX_CAPTURE 16
#define FM_DRAFTER_MAX_BLOCK 64

/* Settings the caller (CLI flags) may force; zero / empty means "from config.json, else the default". */
typedef struct {
    int block;           /* draft tokens per round (default 16) */
    int n_target_layers; /* > 0: use target_layers[0..n) */
    int target_layers[FM_DRAFTER_MAX_CAPTURE];
    float rope_theta;              /* default 10000 */
    float time_scale;              /* default 1000 */
    float rms_eps, qk_eps, ln_eps; /* defaults 1e-6, 1e-5, 1e-6 */
} fm_drafter_overrides;

/* The drafter's shape, read from its tensors, and its settings. */
typedef struct {
    int dim;        /* DiT width (fc.weight rows) */
    int n_layers;   /* DiT blocks (highest layers.N index + 1) */
    int head_dim;   /* q_norm length */
    int n_heads;    /* dim / head_dim */
    int ffn;        /* layers.0.mlp.fc1 rows */
    int target_dim; /* anchor_proj.weight columns */
    int feat_width; /* fc.weight columns = n_capture * target_dim */
    int n_capture;
    int cond_dim; /* time_embed.linear_1 rows */
    int time_dim; /* time_embed.linear_1 columns (sinusoid size) */
    int block;
    int target_layers[FM_DRAFTER_MAX_CAPTURE];
    float rope_theta, time_scale, rms_eps, qk_eps, ln_eps;
} fm_drafter_hparams;

typedef struct fm_drafter fm_drafter;

/* path: a .safetensors file or a folder holding model.safetensors; a config.json in the same folder is read
 * when present. target: the loaded target (its token table and lm_head are used; they must outlive the
 * drafter). max_ctx: context positions the drafter can hold (its f16 K/V cache is sized by it). */
int fm_drafter_load(const char *path, const qwen3_model *target, const fm_drafter_overrides *ov, int max_ctx,
                    fm_drafter **out, char *err, size_t errlen);
void fm_drafter_free(fm_drafter *d);

const fm_drafter_hparams *fm_drafter_hp(const fm_drafter *d);
/* Which 0-based target layers to capture, in feature-row order. */
const int *fm_drafter_target_layers(const fm_drafter *d, int *n);
int fm_drafter_block(const fm_drafter *d);
int fm_drafter_max_ctx(const fm_drafter *d);
/* Context positions holding verified rows (the next extend starts here at the latest). */
int fm_drafter_length(const fm_drafter *d);
void fm_drafter_reset(fm_drafter *d);

/* Context rows start .. start+n-1 from the target's feature rows features[n][feat_width]; overwrites them and
 * sets the length to start + n. start must not exceed the current length, start + n <= max_ctx. */
int fm_drafter_extend_context(fm_drafter *d, fm_pool *pool, const float *features, int n, int start,
                              char *err, size_t errlen);
/* The first n_out (1..block) of the `block` tokens after `anchor` at context position pos (pos <= length,
 * pos < max_ctx): out[n_out]. Every slot still runs through the layers (they attend to each other), but only
 * the first n_out go through the head and the lm_head, the larger half of a draft's work: a loop that
 * verifies K drafts asks for K. Slot k's token does not depend on n_out. The anchor's embedding is written
 * into the context slot at pos (the next extend overwrites it). */
int fm_drafter_draft(fm_drafter *d, fm_pool *pool, int32_t anchor, int pos, int n_out, int32_t *out,
                     char *err, size_t errlen);
/* Replaces the drafter's matrices by a Q8_0 copy (quantised as ggml quantises weights), so drafts run on the
 * int8 kernels: faster on CPUs, slightly different drafts (never a different output: the target verifies).
 * Idempotent; matrices already Q8_0, or whose width is not a multiple of 32, stay. pool may be NULL. */
int fm_drafter_quantize_q8_0(fm_drafter *d, fm_pool *pool, char *err, size_t errlen);
/* After fm_drafter_quantize_q8_0, for drafts on the CPU: where the Q8_0 kernel is the AVX-512 VNNI one,
 * rearranges the Q8_0 copy's matrices in place for it (fm_matrix_repack_vnni4; not with
 * FLASHMAP_NO_REPACK=1); then keeps a pre-packed copy of the Q8_0 matrices a draft multiplies by all `block`
 * slots (fm_matrix_pack_q8_0), where the current ISA level's kernel for such batches would otherwise pack
 * them at every call (the AVX2 kernel: about twice their bytes more, ~0.75 GB for FlashMap-Qwen3-4B);
 * elsewhere nothing. Same drafts bit for bit. Idempotent. */
int fm_drafter_pack_q8_0(fm_drafter *d, fm_pool *pool, char *err, size_t errlen);
/* The bytes fm_drafter_pack_q8_0 allocated (0: none). */
size_t fm_drafter_packed_bytes(const fm_drafter *d);
/* The type of the drafter's largest matrices (the MLP's), which drafts spend most of their time on. */
fm_dtype fm_drafter_matrix_type(const fm_drafter *d);

/* The last draft's head outputs [block][target_dim] (before the lm_head), for tests. */
const float *fm_drafter_last_head(const fm_drafter *d);
/* The last draft's logits [block][vocab]. */
const float *fm_drafter_last_logits(const fm_drafter *d);

/* Default target layer ids for n captures of an L-layer target: round(1 + i*(L-4)/(n-1)), halves up
 * (L/2 for n = 1). -1 and an error when they would not be distinct valid layers. */
int fm_drafter_default_layers(int n_target_layers, int n, int *ids, char *err, size_t errlen);

/* ---- synthetic drafters (flashmap synth drafter) ---- */
typedef struct {
    int dim, n_layers, n_heads, head_dim, ffn, block;
    int cond_dim, time_dim; /* time conditioning widths (256, 256 in the real drafter) */
    int n_capture;          /* used when n_target_layers == 0 */
    int n_target_layers;
    int target_layers[FM_DRAFTER_MAX_CAPTURE];
    uint64_t seed;
    fm_dtype dtype; /* F32, F16 or BF16 */
} fm_drafter_synth_params;

/* The shape of the released FlashMap-Qwen3-4B drafter (dim 2048, 6 layers, 16 heads of 128, FFN 8192, block
 * 16, 5 captures, time widths 256), BF16, seed 1. */
void fm_drafter_synth_flashmap_4b(fm_drafter_synth_params *p);

/* Random drafter for a target of dim target_dim and target_layers layers (for default layer ids), written to
 * path (temp + rename), plus config.json in the same folder (with vocab_size when target_vocab > 0).
 * Deterministic in the params. Initialised so that activations stay O(1) and the block's slots draft
 * different tokens (q/k norm weights ~2 make attention position-sensitive; AdaLN gates ~1). */
int fm_drafter_synth(const fm_drafter_synth_params *p, int target_dim, int target_layers, int target_vocab,
                     const char *path, char *err, size_t errlen);

#endif
