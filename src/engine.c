/* engine.c: implements flashmap.h: loads the target (and drafter), owns the worker threads, and runs sessions
 * through the decoding loop (decode/speculative.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/id_list.h"
#include "cpu/cpu_features.h"
#include "drafter/flashmap_drafter.h"
#include "engine_internal.h"
#ifdef FLASHMAP_HAVE_CUDA
#include "cuda/cuda_backend.h"
#endif

/* Prefill chunks: 256 tokens on the CPU; 512 on CUDA, whose wide kernels fill the GPU better with more rows
 * (H200, bench_cuda, 256 -> 512: 512 prompt tokens 31.7 -> 27.1 ms, 1536 tokens 104.9 -> 94.8 ms, measured
 * with an earlier one-pass attention of the same speed; 27.2 ms at 512 with the current one). */
enum { DEFAULT_CTX = 4096, DEFAULT_PREFILL_CHUNK = 256, DEFAULT_PREFILL_CHUNK_CUDA = 512 };

void fm_engine_params_init(fm_engine_params *p) {
    memset(p, 0, sizeof *p);
    p->device = FM_DEVICE_AUTO;
}

void fm_generate_params_init(fm_generate_params *p) {
    memset(p, 0, sizeof *p);
    p->max_new_tokens = 256;
    p->fallback = 1;
    p->sampling.top_p = 1;
}

/* AUTO picks the GPU when the build has CUDA, a device is present and every matrix of the target is Q8_0
 * (what the CUDA kernels read; K-quant files run on the CPU); CUDA asked for explicitly must be usable. */
static int choose_device(fm_engine *e, fm_device device, char *err, size_t errlen) {
    e->use_cuda = 0;
#ifdef FLASHMAP_HAVE_CUDA
    if (device == FM_DEVICE_CPU) return 0;
    const int gpu = fm_cuda_available(), q8 = qwen3_model_all_matrices(e->model, FM_DTYPE_Q8_0);
    if (device == FM_DEVICE_CUDA && !gpu)
        return fm_set_error(err, errlen, "--device cuda: no usable CUDA device");
    if (device == FM_DEVICE_CUDA && !q8)
        return fm_set_error(err, errlen, "--device cuda: the CUDA backend runs Q8_0 targets; this one is %s",
                            e->weight_types);
    e->use_cuda = gpu && q8;
    if (gpu && !q8)
        snprintf(e->device_note, sizeof e->device_note,
                 "the CUDA backend runs Q8_0 targets and this one is %s: decoding on the CPU",
                 e->weight_types);
#else
    (void)e;
    (void)device;
    (void)err;
    (void)errlen;
#endif
    return 0;
}

/* Both backends draft on a Q8_0 copy unless told to keep the stored type (the CUDA backend uploads whichever
 * the matrices hold; on the H200 the Q8_0 draft is ~14 % faster, bench/RESULTS.md). The CPU's also keeps
 * the draft matrices pre-packed where its batch kernel would widen them at every draft. */
static int prepare_drafter_weights(fm_engine *e, fm_draft_weights w, char *err, size_t errlen) {
    if (w == FM_DRAFT_WEIGHTS_STORED) return 0;
    if (fm_drafter_quantize_q8_0(e->drafter, e->pool, err, errlen)) return -1;
    return e->use_cuda ? 0 : fm_drafter_pack_q8_0(e->drafter, e->pool, err, errlen);
}

int fm_engine_load(const fm_engine_params *p, fm_engine **out, char *err, size_t errlen) {
    *out = NULL;
    if (!p->model_path) return fm_set_error(err, errlen, "no target model given (-m MODEL.gguf)");
#ifndef FLASHMAP_HAVE_CUDA
    if (p->device == FM_DEVICE_CUDA)
        return fm_set_error(err, errlen,
                            "--device cuda: this build has no CUDA backend (rebuild with nvcc present)");
#endif
    fm_engine *e = calloc(1, sizeof *e);
    if (!e) return fm_set_error(err, errlen, "out of memory");
    if (qwen3_model_load(p->model_path, &e->model, err, errlen)) goto fail;
    qwen3_model_weight_types(e->model, e->weight_types, sizeof e->weight_types);
    const qwen3_hparams *hp = &e->model->hp;
    e->n_ctx = p->n_ctx > 0 ? p->n_ctx : DEFAULT_CTX;
    if (e->n_ctx > hp->ctx_train) e->n_ctx = hp->ctx_train;
    e->prefill_chunk = p->prefill_chunk > 0 ? p->prefill_chunk : DEFAULT_PREFILL_CHUNK;
    e->pool = fm_pool_create(p->n_threads);
    if (!e->pool) {
        fm_set_error(err, errlen, "cannot start worker threads");
        goto fail;
    }
    if (p->drafter_path) {
        fm_drafter_overrides ov;
        memset(&ov, 0, sizeof ov);
        ov.block = p->drafter_block;
        if (p->drafter_n_target_layers > FM_DRAFTER_MAX_CAPTURE) {
            fm_set_error(err, errlen, "%d target layers given; at most %d are supported",
                         p->drafter_n_target_layers, FM_DRAFTER_MAX_CAPTURE);
            goto fail;
        }
        ov.n_target_layers = p->drafter_n_target_layers;
        for (int i = 0; i < ov.n_target_layers; i++) ov.target_layers[i] = p->drafter_target_layers[i];
        /* The drafter's context covers the cache plus one block of slots. */
        if (fm_drafter_load(p->drafter_path, e->model, &ov, e->n_ctx + FM_MAX_BLOCK + 1, &e->drafter, err,
                            errlen))
            goto fail;
        int n = 0;
        const int *layers = fm_drafter_target_layers(e->drafter, &n);
        if (n > (int)(sizeof e->capture / sizeof e->capture[0])) {
            fm_set_error(err, errlen, "the drafter reads %d target layers; at most 16 are supported", n);
            goto fail;
        }
        memcpy(e->capture, layers, (size_t)n * sizeof *layers);
        e->n_capture = n;
        if (fm_drafter_block(e->drafter) > FM_MAX_BLOCK) {
            fm_set_error(err, errlen, "drafter block %d exceeds the supported %d",
                         fm_drafter_block(e->drafter), FM_MAX_BLOCK);
            goto fail;
        }
    }
    if (choose_device(e, p->device, err, errlen)) goto fail;
    if (e->use_cuda && p->prefill_chunk <= 0) e->prefill_chunk = DEFAULT_PREFILL_CHUNK_CUDA;
    if (e->drafter && prepare_drafter_weights(e, p->drafter_weights, err, errlen)) goto fail;
    /* The CPU streams every weight per step: keep them in huge pages, never paged out between steps (and in
     * the layout its kernel reads fastest, qwen3.h). */
    if (!e->use_cuda && !p->keep_mmap) e->weights_resident = qwen3_model_make_resident(e->model, e->pool);
    fm_engine_load_tokenizer(e);
    *out = e;
    return 0;
fail:
    fm_engine_free(e);
    return -1;
}

void fm_engine_free(fm_engine *e) {
    if (!e) return;
    fm_engine_free_tokenizer(e);
    fm_drafter_free(e->drafter);
    fm_pool_free(e->pool);
    qwen3_model_free(e->model);
    free(e);
}

void fm_engine_get_info(const fm_engine *e, fm_engine_info *info) {
    const qwen3_hparams *hp = &e->model->hp;
    memset(info, 0, sizeof *info);
    info->n_layers = hp->n_layers;
    info->dim = hp->dim;
    info->n_heads = hp->n_heads;
    info->n_kv_heads = hp->n_kv_heads;
    info->head_dim = hp->head_dim;
    info->ffn = hp->ffn;
    info->vocab = hp->vocab;
    info->n_ctx = e->n_ctx;
    info->n_threads = fm_pool_size(e->pool);
    info->weight_type = e->weight_types;
    info->weight_bytes = qwen3_model_weight_bytes(e->model);
    info->has_drafter = e->drafter != NULL;
    if (e->drafter) {
        info->drafter_block = fm_drafter_block(e->drafter);
        info->drafter_n_capture = e->n_capture;
        info->drafter_layers = fm_drafter_hp(e->drafter)->n_layers;
        info->drafter_dim = fm_drafter_hp(e->drafter)->dim;
        info->drafter_weight_type = fm_dtype_name(fm_drafter_matrix_type(e->drafter));
    }
    info->device = e->use_cuda ? "cuda" : "cpu";
    info->device_note = e->device_note[0] ? e->device_note : NULL;
    info->isa = fm_isa_name(fm_cpu_isa());
    info->huge_pages = e->weights_resident;
    info->repacked = qwen3_model_repacked(e->model);
}

int fm_session_create(fm_engine *e, fm_session **out, char *err, size_t errlen) {
    *out = NULL;
    fm_session *s = calloc(1, sizeof *s);
    if (!s) return fm_set_error(err, errlen, "out of memory");
    /* One eval takes a prefill chunk or a verify block, whichever is larger. */
    const int max_eval = e->prefill_chunk > FM_MAX_BLOCK + 1 ? e->prefill_chunk : FM_MAX_BLOCK + 1;
#ifdef FLASHMAP_HAVE_CUDA
    if (e->use_cuda) {
        fm_cuda_backend *gpu = NULL;
        if (fm_cuda_backend_create(e->model, e->drafter, e->n_ctx, max_eval, e->capture, e->n_capture, &gpu,
                                   err, errlen)) {
            free(s);
            return -1;
        }
        s->cuda = gpu;
        s->backend = fm_cuda_backend_ops(gpu);
    }
#endif
    if (!s->cuda) {
        if (fm_cpu_backend_create(e->model, e->drafter, e->pool, e->n_ctx, max_eval, e->capture, e->n_capture,
                                  &s->cpu, err, errlen)) {
            free(s);
            return -1;
        }
        s->backend = fm_cpu_backend_ops(s->cpu);
    }
    s->e = e;
    fm_session_reset(s);
    *out = s;
    return 0;
}

void fm_session_free(fm_session *s) {
    if (!s) return;
    fm_cpu_backend_free(s->cpu);
#ifdef FLASHMAP_HAVE_CUDA
    fm_cuda_backend_free(s->cuda);
#endif
    free(s->tokens);
    free(s);
}

void fm_session_reset(fm_session *s) {
    s->backend.reset(s->backend.ctx);
    fm_decode_averages_reset(&s->avg);
    s->has_next = 0;
    s->n_tokens = 0;
}

int fm_session_pos(const fm_session *s) {
    return s->backend.pos(s->backend.ctx) + s->has_next;
}

int fm_session_truncate(fm_session *s, int n, char *err, size_t errlen) {
    const int held = fm_session_pos(s);
    if (n < 0 || n > held)
        return fm_set_error(err, errlen, "cannot keep %d tokens of a conversation of %d", n, held);
    if (n == held) return 0;
    /* n < held: the pending last token (never fed) goes, and the cache keeps positions 0 .. n-1; the
     * drafter's context rows from n on are rewritten by the next prefill before any draft reads them. */
    s->backend.rewind(s->backend.ctx, n);
    s->has_next = 0;
    s->n_tokens = n;
    return 0;
}

/* Appends ids to the conversation's tokens. */
static int remember(fm_session *s, const int32_t *ids, int n) {
    return fm_ids_append(&s->tokens, &s->n_tokens, &s->cap_tokens, ids, n);
}

static int is_stop_token(const void *ctx, int32_t id) {
    return fm_token_is_stop((const fm_engine *)ctx, id);
}

int fm_session_generate(fm_session *s, const int32_t *ids, int n_ids, const fm_generate_params *p,
                        int32_t **out, int *n_out, fm_generate_stats *stats, char *err, size_t errlen) {
    fm_generate_stats local;
    if (!stats) stats = &local;
    if (n_ids < 0 || (n_ids > 0 && !ids)) return fm_set_error(err, errlen, "bad input ids");
    /* The previous call's last token was produced but never fed: it goes first. */
    int32_t *all = malloc((size_t)(n_ids + 1) * sizeof *all);
    if (!all) return fm_set_error(err, errlen, "out of memory");
    int n = 0;
    if (s->has_next) all[n++] = s->next;
    if (n_ids) memcpy(all + n, ids, (size_t)n_ids * sizeof *ids);
    n += n_ids;
    for (int i = 0; i < n; i++)
        if (all[i] < 0 || all[i] >= s->e->model->hp.vocab) {
            int bad = all[i];
            free(all);
            return fm_set_error(err, errlen, "prompt token id %d is out of range (vocabulary %d)", bad,
                                s->e->model->hp.vocab);
        }
    int32_t *gen = NULL;
    int n_gen = 0;
    /* The tokens in the cache (the pending one, last of the conversation, goes first in `all`). */
    const int n_before = s->n_tokens - s->has_next, pos0 = s->backend.pos(s->backend.ctx);
    int rc = fm_decode_run(&s->backend, &s->avg, s->tokens, n_before, all, n, p, is_stop_token, s->e, &gen,
                           &n_gen, stats, err, errlen);
    if (rc && s->backend.pos(s->backend.ctx) == pos0) { /* refused before anything was fed: as it was */
        free(all);
        free(gen);
        return rc;
    }
    s->n_tokens = n_before;
    if (rc || remember(s, all, n) || remember(s, gen, n_gen)) {
        free(all);
        free(gen);
        /* Part of the input went into the cache: start the conversation over rather than guess. */
        fm_session_reset(s);
        return rc ? rc : fm_set_error(err, errlen, "out of memory for the conversation's tokens");
    }
    free(all);
    if (n_gen > 0) {
        s->has_next = 1;
        s->next = gen[n_gen - 1];
    }
    if (out)
        *out = gen;
    else
        free(gen);
    if (n_out) *n_out = n_gen;
    return 0;
}
