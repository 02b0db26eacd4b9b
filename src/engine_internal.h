/* engine_internal.h: what fm_engine and fm_session hold (private to src/). */
#ifndef FM_ENGINE_INTERNAL_H
#define FM_ENGINE_INTERNAL_H

#include "flashmap.h"
#include "core/threadpool.h"
#include "decode/cpu_backend.h"
#include "decode/speculative.h"
#include "drafter/flashmap_drafter.h"
#include "model/qwen3.h"

typedef struct fm_tokenizer fm_tokenizer;

struct fm_engine {
    qwen3_model *model;
    fm_tokenizer *tok; /* NULL when the GGUF carries no usable tokenizer (ids-only use) */
    char tok_error[256];
    fm_drafter *drafter;
    fm_pool *pool;
    int n_ctx, prefill_chunk;
    int capture[FM_DRAFTER_MAX_CAPTURE], n_capture;
    int use_cuda;          /* sessions run on the GPU backend */
    char weight_types[48]; /* qwen3_model_weight_types, for fm_engine_info and messages */
    char device_note[128]; /* fm_engine_info.device_note; empty when there is nothing to say */
    int weights_resident;  /* the target's weights were moved into huge pages (qwen3_model_make_resident) */
};

struct fm_session {
    fm_engine *e;
    fm_cpu_backend *cpu; /* one of cpu / cuda is set */
    void *cuda;          /* fm_cuda_backend, when the engine runs on the GPU */
    fm_decode_backend backend;
    fm_decode_averages avg;
    int has_next; /* the last generated token is not in the cache yet */
    int32_t next;
    /* The conversation: the fm_session_pos tokens fed and generated so far (the repetition penalty reads
     * them). */
    int32_t *tokens;
    int n_tokens, cap_tokens;
};

/* engine_text.c: loads the tokenizer of the engine's GGUF (a missing one is remembered, not fatal). */
void fm_engine_load_tokenizer(fm_engine *e);
void fm_engine_free_tokenizer(fm_engine *e);

#endif
