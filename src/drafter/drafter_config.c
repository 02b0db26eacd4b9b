/* drafter_config.c: the drafter's non-shape settings. Order of precedence: caller overrides (CLI flags) >
 * config.json beside the weights (the authors' FlashMapConfig keys) > defaults (NOTES.md). config.json's
 * shape keys, when present, must agree with the tensor shapes. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "drafter/drafter_config.h"

int fm_drafter_default_layers(int L, int n, int *ids, char *err, size_t errlen) {
    if (n < 1 || n > FM_DRAFTER_MAX_CAPTURE)
        return fm_set_error(err, errlen, "drafter: %d captured layers, expected 1..%d", n,
                            FM_DRAFTER_MAX_CAPTURE);
    if (n == 1) {
        ids[0] = L / 2;
    } else {
        if (L < 4)
            return fm_set_error(
                err, errlen,
                "drafter: no default target layers for %d captures of a %d-layer target (the rule "
                "round(1 + i*(L-4)/(n-1)) needs L >= 4); give target_layer_ids in config.json or "
                "--target-layers",
                n, L);
        /* round half up of 1 + i*(L-4)/(n-1), in integers: floor((2*i*(L-4) + (n-1)) / (2*(n-1))) + 1 */
        for (int i = 0; i < n; i++) ids[i] = 1 + (2 * i * (L - 4) + (n - 1)) / (2 * (n - 1));
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= L || (i && ids[i] <= ids[i - 1]))
            return fm_set_error(
                err, errlen,
                "drafter: default target layers for %d captures of a %d-layer target are not "
                "distinct valid layers; give target_layer_ids in config.json or --target-layers",
                n, L);
    return 0;
}

/* Reads path into a NUL-terminated buffer (at most 1 MB); NULL with *missing = 1 when the file is absent. */
static char *read_text(const char *path, int *missing, char *err, size_t errlen) {
    *missing = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        if (errno == ENOENT)
            *missing = 1;
        else
            fm_set_error(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    enum { LIMIT = 1 << 20 };
    char *buf = malloc(LIMIT + 1);
    size_t n = buf ? fread(buf, 1, LIMIT + 1, fp) : 0;
    fclose(fp);
    if (!buf || n > LIMIT) {
        free(buf);
        fm_set_error(err, errlen, "%s: larger than 1 MB (or out of memory)", path);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

static int json_num(const cJSON *root, const char *key, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v)) return 0;
    *out = v->valuedouble;
    return 1;
}

/* Shape keys that config.json may state; each must match what the tensors say. */
static int check_shape_key(const char *path, const cJSON *root, const char *key, int have, char *err,
                           size_t errlen) {
    double v;
    if (json_num(root, key, &v) && v != have)
        return fm_set_error(err, errlen, "%s: %s is %g but the weights say %d", path, key, v, have);
    return 0;
}

int fmd_config_read(const char *path, fm_drafter_hparams *hp, int target_vocab, char *err, size_t errlen) {
    int missing = 0;
    char *text = read_text(path, &missing, err, errlen);
    if (!text) return missing ? 0 : -1;
    cJSON *root = cJSON_Parse(text);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return fm_set_error(err, errlen, "%s: not a JSON object", path);
    }
    int rc = 0;
    rc = rc ? rc : check_shape_key(path, root, "hidden_size", hp->dim, err, errlen);
    rc = rc ? rc : check_shape_key(path, root, "num_hidden_layers", hp->n_layers, err, errlen);
    rc = rc ? rc : check_shape_key(path, root, "num_attention_heads", hp->n_heads, err, errlen);
    rc = rc ? rc : check_shape_key(path, root, "intermediate_size", hp->ffn, err, errlen);
    rc = rc ? rc : check_shape_key(path, root, "target_hidden_size", hp->target_dim, err, errlen);
    rc = rc ? rc : check_shape_key(path, root, "cond_dim", hp->cond_dim, err, errlen);
    rc = rc ? rc : check_shape_key(path, root, "time_embed_dim", hp->time_dim, err, errlen);
    double v;
    if (!rc && target_vocab > 0 && json_num(root, "vocab_size", &v) && v != target_vocab)
        rc = fm_set_error(err, errlen, "%s: vocab_size is %g but the target's vocabulary has %d tokens", path,
                          v, target_vocab);
    if (!rc && json_num(root, "block_size", &v)) {
        if (v < 1 || v > FM_DRAFTER_MAX_BLOCK || v != (int)v)
            rc =
                fm_set_error(err, errlen, "%s: block_size %g, expected 1..%d", path, v, FM_DRAFTER_MAX_BLOCK);
        hp->block = (int)v;
    }
    if (!rc && json_num(root, "rope_theta", &v)) hp->rope_theta = (float)v;
    if (!rc && json_num(root, "time_scale", &v)) hp->time_scale = (float)v;
    if (!rc && json_num(root, "rms_norm_eps", &v)) hp->rms_eps = (float)v;
    if (!rc && json_num(root, "qk_norm_eps", &v)) hp->qk_eps = (float)v;
    if (!rc && json_num(root, "layer_norm_eps", &v)) hp->ln_eps = (float)v;
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(root, "target_layer_ids");
    if (!rc && ids) {
        int n = cJSON_IsArray(ids) ? cJSON_GetArraySize(ids) : -1;
        if (n < 1 || n > FM_DRAFTER_MAX_CAPTURE)
            rc = fm_set_error(err, errlen, "%s: target_layer_ids must be an array of 1..%d layer numbers",
                              path, FM_DRAFTER_MAX_CAPTURE);
        int i = 0;
        for (const cJSON *e = ids->child; !rc && e; e = e->next, i++) {
            if (!cJSON_IsNumber(e) || e->valuedouble != (int)e->valuedouble)
                rc = fm_set_error(err, errlen, "%s: target_layer_ids[%d] is not an integer", path, i);
            else
                hp->target_layers[i] = (int)e->valuedouble;
        }
        if (!rc && n != hp->n_capture)
            rc = fm_set_error(
                err, errlen,
                "%s: target_layer_ids has %d layers but fc.weight takes %d features of %d (%d layers)", path,
                n, hp->feat_width, hp->target_dim, hp->n_capture);
    }
    cJSON_Delete(root);
    return rc;
}

int fmd_config_apply_overrides(fm_drafter_hparams *hp, const fm_drafter_overrides *ov, char *err,
                               size_t errlen) {
    if (!ov) return 0;
    if (ov->block) {
        if (ov->block < 1 || ov->block > FM_DRAFTER_MAX_BLOCK)
            return fm_set_error(err, errlen, "drafter: block %d, expected 1..%d", ov->block,
                                FM_DRAFTER_MAX_BLOCK);
        hp->block = ov->block;
    }
    if (ov->n_target_layers) {
        if (ov->n_target_layers != hp->n_capture)
            return fm_set_error(err, errlen, "drafter: %d target layers given, but the drafter takes %d",
                                ov->n_target_layers, hp->n_capture);
        memcpy(hp->target_layers, ov->target_layers, sizeof(int) * (size_t)hp->n_capture);
    }
    if (ov->rope_theta > 0) hp->rope_theta = ov->rope_theta;
    if (ov->time_scale > 0) hp->time_scale = ov->time_scale;
    if (ov->rms_eps > 0) hp->rms_eps = ov->rms_eps;
    if (ov->qk_eps > 0) hp->qk_eps = ov->qk_eps;
    if (ov->ln_eps > 0) hp->ln_eps = ov->ln_eps;
    return 0;
}
