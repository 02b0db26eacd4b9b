/* drafter_config.h: config.json and override handling for the drafter loader (private to src/drafter). */
#ifndef FM_DRAFTER_CONFIG_H
#define FM_DRAFTER_CONFIG_H

#include "drafter/flashmap_drafter.h"

/* Reads the authors' config.json keys (target_layer_ids, block_size, rope_theta, time_scale, rms_norm_eps,
 * qk_norm_eps, layer_norm_eps) into hp, and checks its shape keys (hidden_size, num_hidden_layers,
 * num_attention_heads, intermediate_size, target_hidden_size, cond_dim, time_embed_dim, vocab_size against
 * target_vocab) against hp. A missing file is not an error. hp's shape fields must be set already. */
int fmd_config_read(const char *path, fm_drafter_hparams *hp, int target_vocab, char *err, size_t errlen);
int fmd_config_apply_overrides(fm_drafter_hparams *hp, const fm_drafter_overrides *ov, char *err,
                               size_t errlen);

#endif
