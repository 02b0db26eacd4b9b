/* serve_request.h: the body of POST /v1/completions or /v1/chat/completions, parsed and checked. Anything the
 * engine cannot honour exactly (sampling, several choices, logprobs, tools) is refused rather than ignored:
 * the engine decodes greedily, and silently greedy output would look like sampling that went wrong. Unknown
 * fields are ignored, as vLLM does. JSON null counts as absent. */
#ifndef FM_TOOLS_SERVE_REQUEST_H
#define FM_TOOLS_SERVE_REQUEST_H

#include <stddef.h>

#include "serve_openai.h"

#define SERVE_MAX_STOP 16 /* stop strings per request */

typedef struct {
    serve_kind kind;
    char *prompt;   /* the text to tokenize: the prompt, or the chat rendered with the Qwen3 template */
    int max_tokens; /* 0: until a stop token or the end of the context */
    char *stop[SERVE_MAX_STOP];
    int n_stop;
    int stream;
    int include_usage; /* stream_options.include_usage */
    int ignore_eos;    /* run past the model's stop tokens (llama.cpp's server field; benchmarks, tests) */
} serve_request;

/* 0, or -1 with a 400 error naming the field (err). On success free r with serve_request_free. */
int serve_request_parse(serve_kind kind, const char *body, size_t len, serve_request *r, serve_error *err);
void serve_request_free(serve_request *r);

#endif
