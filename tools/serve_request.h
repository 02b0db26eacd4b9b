/* serve_request.h: the body of POST /v1/completions or /v1/chat/completions, parsed and checked. Sampling
 * (temperature, top_k, top_p, min_p, seed) maps onto the engine's fm_sampling; a field left out takes the
 * server's default (serve --temp ...; greedy without one). Anything the engine cannot honour exactly
 * (penalties, several choices, logprobs, tools) is refused rather than ignored: silently ignored settings
 * would look like decoding that went wrong. Unknown fields are ignored, as vLLM does. JSON null counts as
 * absent. */
#ifndef FM_TOOLS_SERVE_REQUEST_H
#define FM_TOOLS_SERVE_REQUEST_H

#include <stddef.h>

#include "serve_openai.h"

#define SERVE_MAX_STOP 16 /* stop strings per request */

/* The server's sampling settings from its command line: what a request's absent fields take. */
typedef struct {
    fm_sampling sampling; /* serve --temp ... (else greedy: temperature 0, top_k 0, top_p 1, min_p 0) */
    int seed_given;       /* serve --seed: requests without a seed use it; else each draws a fresh one */
} serve_sampling_defaults;

typedef struct {
    serve_kind kind;
    char *prompt;   /* the text to tokenize: the prompt, or the chat rendered with the Qwen3 template */
    int max_tokens; /* 0: until a stop token or the end of the context */
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    int stream;
    int include_usage;    /* stream_options.include_usage */
    int ignore_eos;       /* run past the model's stop tokens (llama.cpp's server field; benchmarks, tests) */
    fm_sampling sampling; /* greedy unless temperature > 0; then seed is the one used (drawn if none given) */
} serve_request;

/* 0, or -1 with a 400 error naming the field (err). def: the server's sampling defaults (NULL: greedy). On
 * success free r with serve_request_free. */
int serve_request_parse(serve_kind kind, const char *body, size_t len, const serve_sampling_defaults *def,
                        serve_request *r, serve_error *err);
void serve_request_free(serve_request *r);

#endif
