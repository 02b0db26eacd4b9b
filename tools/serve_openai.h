/* serve_openai.h: the JSON bodies of `flashmap serve` in OpenAI's shapes: error objects, completions and chat
 * completions (whole or as Server-Sent-Event chunks), usage, the model list. Every builder returns a
 * malloc'd, NUL-terminated string, or NULL when out of memory. Generated text may hold any byte (a NUL
 * included), so it is passed with its length and escaped here rather than through cJSON's C strings. */
#ifndef FM_TOOLS_SERVE_OPENAI_H
#define FM_TOOLS_SERVE_OPENAI_H

#include <stddef.h>

#include "flashmap.h"

typedef enum { SERVE_COMPLETION, SERVE_CHAT } serve_kind;

/* One error for the client: the HTTP status and OpenAI's {"error": {message, type, param, code}}. */
typedef struct {
    int status;       /* 0: no error */
    const char *type; /* "invalid_request_error", "server_error", ... */
    const char *code; /* NULL, or a short machine-readable reason ("context_length_exceeded") */
    char param[64];   /* the request field at fault, "" when none */
    char message[512];
} serve_error;

/* Fills e and returns -1 (so parsers can `return serve_error_set(...)`). param may be NULL. */
int serve_error_set(serve_error *e, int status, const char *type, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
char *serve_openai_error(const serve_error *e);

/* What every reply of one request repeats. */
typedef struct {
    serve_kind kind;
    char id[48]; /* "cmpl-..." or "chatcmpl-..." */
    long created;
    const char *model;
} serve_reply_head;

/* How a request ended, for finish_reason, usage and the "flashmap" extension object. */
typedef struct {
    const char *finish_reason; /* "stop" or "length" */
    const char *stop;          /* finer: "stop token", "stop string", "length", "context full" */
    int speculative;
    double queue_s;       /* waiting for the requests before it */
    int prompt_tokens;    /* the whole prompt */
    int cached_tokens;    /* of which the prompt cache held (st.n_prompt were prefilled) */
    fm_sampling sampling; /* the settings used (greedy unless temperature > 0) */
    fm_generate_stats st;
} serve_reply_end;

/* The whole (non-streaming) reply. */
char *serve_openai_reply(const serve_reply_head *h, const char *text, size_t len, const serve_reply_end *end);
/* One SSE event ("data: {...}\n\n") carrying text; role_delta adds the chat's {"role": "assistant"};
 * end != NULL makes it the last chunk (finish_reason and the flashmap object). */
char *serve_openai_chunk(const serve_reply_head *h, const char *text, size_t len, int role_delta,
                         const serve_reply_end *end);
/* The SSE event with usage and no choices (stream_options.include_usage). */
char *serve_openai_usage_chunk(const serve_reply_head *h, const serve_reply_end *end);
/* An SSE event carrying an error object (a stream cannot change its status once started). */
char *serve_openai_error_chunk(const serve_error *e);
char *serve_openai_models(const char *model, long created, int n_ctx);

#endif
