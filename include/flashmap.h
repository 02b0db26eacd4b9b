/* flashmap.h: the public C API of flashmap, a Qwen3 engine with lossless FlashMap speculative decoding.
 *
 * An fm_engine holds the target model (a Qwen3 dense GGUF), its tokenizer, an optional FlashMap drafter and
 * the worker threads. An fm_session holds one conversation: the target's KV cache and the drafter's context;
 * text generated in a session continues where the last call left off (chat keeps its cache across turns).
 *
 * Errors: every call that can fail returns 0 on success and -1 on failure, writing one line naming what was
 * wrong into the caller's buffer (err, errlen). Nothing here prints or exits. */
#ifndef FLASHMAP_H
#define FLASHMAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FM_MAX_BLOCK 32    /* largest drafter block the loop supports */
#define FM_ERRBUF_SIZE 512 /* a good size for the err buffers the calls take */

typedef struct fm_engine fm_engine;
typedef struct fm_session fm_session;

typedef enum {
    FM_DEVICE_AUTO = 0, /* CUDA when built with it and a GPU is present, else the CPU */
    FM_DEVICE_CPU,
    FM_DEVICE_CUDA,
} fm_device;

typedef enum {
    FM_DRAFT_WEIGHTS_AUTO = 0, /* Q8_0 (CPU and CUDA) */
    FM_DRAFT_WEIGHTS_Q8_0,
    FM_DRAFT_WEIGHTS_STORED,
} fm_draft_weights;

typedef struct {
    const char *model_path;   /* target GGUF (required) */
    const char *drafter_path; /* drafter .safetensors or a folder holding model.safetensors; NULL: none */
    int n_threads;            /* <= 0: one per core */
    int n_ctx;                /* KV cache positions; <= 0: 4096, capped by the model's context length */
    int prefill_chunk;        /* tokens per prefill forward; <= 0: 256 (CPU), 512 (CUDA) */
    fm_device device;
    /* Drafter settings that override its config.json (0 / NULL: keep). */
    int drafter_block;
    const int *drafter_target_layers;
    int drafter_n_target_layers;
    /* The drafter's matrices: FM_DRAFT_WEIGHTS_AUTO makes a Q8_0 copy at load (drafts on the int8 kernels,
     * ~2x faster than BF16 on the CPU, ~14 % on CUDA; drafts may differ slightly, the output never does);
     * STORED keeps the file's type (the CUDA backend runs BF16 or Q8_0 matrices). */
    fm_draft_weights drafter_weights;
    /* 1: the CPU reads the target's weights from the file mapping (starts in ~1 s). 0 (default): they are
     * read into transparent huge pages at load (a few seconds more; steps ~8 % faster, never paged out). */
    int keep_mmap;
} fm_engine_params;

void fm_engine_params_init(fm_engine_params *p);
int fm_engine_load(const fm_engine_params *p, fm_engine **out, char *err, size_t errlen);
void fm_engine_free(fm_engine *e);

typedef struct {
    int n_layers, dim, n_heads, n_kv_heads, head_dim, ffn, vocab, n_ctx, n_threads;
    const char *weight_type; /* of the matrices, most bytes first: "q8_0", "q4_k+q6_k" */
    uint64_t weight_bytes;   /* bytes one decode step reads */
    int has_drafter;
    int drafter_layers, drafter_dim, drafter_block, drafter_n_capture;
    const char *drafter_weight_type; /* the type drafts multiply by: "q8_0", "bf16", ... */
    const char *device;              /* "cpu" or "cuda" */
    const char *device_note;         /* why a GPU that is present is not used (auto), or NULL */
    const char *isa;                 /* CPU kernel level in use */
    int huge_pages;                  /* the CPU reads the target's weights from transparent huge pages */
    int repacked;                    /* target matrices rearranged for the AVX-512 VNNI kernel (0: none) */
} fm_engine_info;
void fm_engine_get_info(const fm_engine *e, fm_engine_info *info);

/* ---- Tokens and text ---- */

/* ids: a malloc'd array the caller frees. Special tokens written in the text (<|im_start|>, ...) are
 * recognised when parse_special != 0. */
int fm_tokenize(const fm_engine *e, const char *text, size_t len, int parse_special, int32_t **ids,
                size_t *n_ids, char *err, size_t errlen);
/* The bytes of one token (not NUL-terminated, may be part of a UTF-8 character); NULL for a bad id. */
const char *fm_token_bytes(const fm_engine *e, int32_t id, size_t *len);
/* 1 when id ends generation (eos, <|im_end|>, <|endoftext|>). */
int fm_token_is_stop(const fm_engine *e, int32_t id);
/* Decodes ids to text (invalid UTF-8 becomes U+FFFD, as Hugging Face decodes); *out is malloc'd. */
int fm_detokenize(const fm_engine *e, const int32_t *ids, size_t n, char **out, size_t *len, char *err,
                  size_t errlen);

/* Streaming text: push ids as they come, print what it returns; never ends inside a UTF-8 character. */
typedef struct fm_text_stream fm_text_stream;
fm_text_stream *fm_text_stream_create(const fm_engine *e);
void fm_text_stream_free(fm_text_stream *s);
/* The newly printable text (valid until the next call), or NULL for a bad id. */
const char *fm_text_stream_push(fm_text_stream *s, int32_t id, size_t *len);
/* End of the stream: an incomplete character becomes U+FFFD. */
const char *fm_text_stream_flush(fm_text_stream *s, size_t *len);

typedef struct {
    const char *role; /* "system", "user" or "assistant" */
    const char *content;
} fm_message;
/* Renders messages with the Qwen3 chat template and the assistant prompt (enable_thinking = 0 adds the empty
 * think block, as HF's enable_thinking=False); *out is malloc'd. */
int fm_format_chat(const fm_message *msgs, int n, int enable_thinking, char **out, char *err, size_t errlen);

/* ---- Generation ---- */

typedef enum {
    FM_STOP_NONE = 0,
    FM_STOP_LENGTH,  /* max_new_tokens reached */
    FM_STOP_TOKEN,   /* a stop token was produced (it is the last token of the output) */
    FM_STOP_CONTEXT, /* the KV cache is full */
} fm_stop_reason;

typedef struct {
    int pos;    /* target position of the anchor */
    int anchor; /* the last verified token, fed first in the verify block */
    int32_t drafted[FM_MAX_BLOCK];
    int n_drafted; /* drafts the round asked the drafter for: the verified ones (it computes no others) */
    int verified;  /* K: drafts checked in the verify block */
    int accepted;  /* drafts accepted */
} fm_round_trace;

typedef struct {
    int n_prompt;     /* tokens prefilled by this call */
    int n_generated;  /* new tokens */
    double prefill_s; /* wall time of the prefill */
    double decode_s;  /* wall time after the prefill */
    int rounds;       /* speculative rounds */
    int accepted;     /* drafts accepted over all rounds */
    int plain_steps;  /* single-token target steps */
    double draft_s;   /* time in the drafter (context + drafts) */
    double verify_s;  /* time in verify blocks */
    fm_stop_reason stop;
    int simulated; /* 1 when drafts were replaced by simulated acceptance */
} fm_generate_stats;

/* Sampling. Off by default (temperature 0: greedy, the argmax of each row). Otherwise as Hugging Face
 * transformers samples: logits / temperature, then top-k, then top-p, then min-p, then a draw from what is
 * left; tokens less likely than e^-30 times the most likely one are never drawn. The token after position i
 * is drawn with random numbers made from (seed, i, token) alone, and a round accepts a draft when it equals
 * the token the target draws at that row, so speculative decoding gives the very text plain decoding gives
 * for the same seed. The drafter draws each slot with the same numbers as the row it will be checked
 * against, so where its distribution agrees with the target's the two draws agree. */
typedef struct {
    float temperature; /* <= 0: greedy */
    int top_k;         /* 0: no limit */
    float top_p;       /* (0, 1): keep that share of the probability; 0 or 1: no limit */
    float min_p;       /* 0: off; [0, 1) */
    uint64_t seed;
    /* OpenAI's penalties over the tokens generated so far in this call (greedy or sampled): a token's logit
     * loses presence_penalty once it has appeared and frequency_penalty per appearance. [-2, 2]; 0: off. */
    float presence_penalty, frequency_penalty;
    /* Hugging Face's and vLLM's repetition penalty over the whole sequence before the row (the prompt, a
     * session's earlier turns and the tokens generated so far), or its last repeat_last_n tokens (llama.cpp's
     * window; 0: all): a token that appeared there has its logit divided by repetition_penalty when positive,
     * multiplied by it otherwise, before the presence and frequency penalties. (0, 10]; 0 or 1: off. */
    float repetition_penalty;
    int repeat_last_n;
} fm_sampling;

/* Called with the new tokens as they are produced; return non-zero to stop early. */
typedef int (*fm_token_callback)(void *user, const int32_t *ids, int n);

typedef struct {
    int max_new_tokens;      /* <= 0: until a stop token or the context is full */
    int speculative;         /* use the drafter (needs one) */
    int verify;              /* drafts per verify block: 0 adaptive (7 or all), else 1 .. block */
    int fallback;            /* fall back to plain steps while drafting loses (timing based) */
    fm_sampling sampling;    /* greedy unless sampling.temperature > 0 */
    int ignore_stop;         /* do not stop at the model's stop tokens (benchmarks) */
    const int32_t *stop_ids; /* extra token ids that end generation (also with ignore_stop) */
    int n_stop_ids;
    fm_token_callback on_tokens;
    void *user;
    /* Tracing: when trace != NULL, up to trace_cap rounds are recorded and *n_trace set. */
    fm_round_trace *trace;
    int trace_cap;
    int *n_trace;
    /* Simulated acceptance (benchmarks): when sim_future != NULL, each round's drafts are replaced by
     * sim_future (the target's own greedy continuation, indexed from the first generated token) for the first
     * k drafts and a wrong token after; k ~ Binomial(block, sim_mean / block), seeded by sim_seed. The
     * drafter still runs in full. */
    const int32_t *sim_future;
    int sim_future_len;
    double sim_mean;
    uint64_t sim_seed;
} fm_generate_params;

void fm_generate_params_init(fm_generate_params *p);

int fm_session_create(fm_engine *e, fm_session **out, char *err, size_t errlen);
void fm_session_free(fm_session *s);
/* Forgets the conversation (position 0). */
void fm_session_reset(fm_session *s);
/* Tokens in the conversation: everything fed and generated so far. */
int fm_session_pos(const fm_session *s);
/* Keeps the first n (0 .. fm_session_pos) tokens of the conversation and forgets the rest, so that a prompt
 * sharing a prefix with it prefills only what follows the prefix (a server's prompt cache). The reply is
 * the one a fresh session would give the whole prompt: the kept rows are the same bits whatever batch
 * computed them. */
int fm_session_truncate(fm_session *s, int n, char *err, size_t errlen);

/* Appends ids to the session (prefill), then generates. *out (malloc'd, may be NULL) receives the new tokens.
 */
int fm_session_generate(fm_session *s, const int32_t *ids, int n_ids, const fm_generate_params *p,
                        int32_t **out, int *n_out, fm_generate_stats *stats, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
