/* serve_openai.c: OpenAI-shaped JSON for `flashmap serve` (see serve_openai.h). The objects are built with
 * cJSON; generated text goes in through cli_json_add_text, since cJSON strings stop at a NUL byte. */
#include "serve_openai.h"

#include "cli_common.h"
#include "cli_engine.h"

#include <cjson/cJSON.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int serve_error_set(serve_error *e, int status, const char *type, const char *param, const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = NULL;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return -1;
}

static char *print_and_free(cJSON *root) {
    char *s = root ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    return s;
}

char *serve_openai_error(const serve_error *e) {
    cJSON *root = cJSON_CreateObject(), *err = cJSON_AddObjectToObject(root, "error");
    cJSON_AddStringToObject(err, "message", e->message);
    cJSON_AddStringToObject(err, "type", e->type ? e->type : "invalid_request_error");
    if (e->param[0])
        cJSON_AddStringToObject(err, "param", e->param);
    else
        cJSON_AddNullToObject(err, "param");
    if (e->code)
        cJSON_AddStringToObject(err, "code", e->code);
    else
        cJSON_AddNullToObject(err, "code");
    return print_and_free(root);
}

static cJSON *head_object(const serve_reply_head *h, int chunk) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "id", h->id);
    cJSON_AddStringToObject(root, "object",
                            h->kind == SERVE_CHAT ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                  : "text_completion");
    cJSON_AddNumberToObject(root, "created", (double)h->created);
    cJSON_AddStringToObject(root, "model", h->model);
    return root;
}

static void add_usage(cJSON *root, const serve_reply_end *end) {
    cJSON *u = cJSON_AddObjectToObject(root, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", end->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", end->st.n_generated);
    cJSON_AddNumberToObject(u, "total_tokens", end->prompt_tokens + end->st.n_generated);
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens",
                            end->cached_tokens);
}

/* flashmap's extension: how the request was decoded (the same names as `generate --json` stats). "seed" is
 * the seed a sampled reply was drawn with (null when greedy); "sampling" the settings used, when sampled or
 * penalised (as `generate --json`). */
static void add_flashmap(cJSON *root, const serve_reply_end *end) {
    cJSON *f = cJSON_AddObjectToObject(root, "flashmap");
    cJSON_AddBoolToObject(f, "speculative", end->speculative);
    const fm_sampling *sp = &end->sampling;
    if (sp->temperature > 0) {
        char seed[24];
        snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed);
        cJSON_AddRawToObject(f, "seed", seed); /* digits: cJSON would print some as 1.2e+15 */
    } else {
        cJSON_AddNullToObject(f, "seed");
    }
    cli_json_add_sampling(f, sp);
    cli_json_add_decode_stats(f, &end->st);
    cJSON_AddNumberToObject(f, "queue_s", end->queue_s);
    cJSON_AddStringToObject(f, "stop", end->stop);
}

/* One choice: {"index": 0, "text" | "message" | "delta": ..., "logprobs": null, "finish_reason": ...}. */
static int add_choice(cJSON *root, const serve_reply_head *h, int chunk, const char *text, size_t len,
                      int role, const char *finish) {
    cJSON *c = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "choices"), c);
    cJSON_AddNumberToObject(c, "index", 0);
    int rc = 0;
    if (h->kind == SERVE_COMPLETION) {
        rc = cli_json_add_text(c, "text", text, len);
    } else {
        cJSON *m = cJSON_AddObjectToObject(c, chunk ? "delta" : "message");
        if (role) cJSON_AddStringToObject(m, "role", "assistant");
        if (!chunk || len > 0 || role) rc = cli_json_add_text(m, "content", text, len);
    }
    cJSON_AddNullToObject(c, "logprobs");
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    return rc;
}

char *serve_openai_reply(const serve_reply_head *h, const char *text, size_t len,
                         const serve_reply_end *end) {
    cJSON *root = head_object(h, 0);
    if (add_choice(root, h, 0, text, len, 1, end->finish_reason)) {
        cJSON_Delete(root);
        return NULL;
    }
    add_usage(root, end);
    add_flashmap(root, end);
    return print_and_free(root);
}

/* "data: <json>\n\n" around a printed object. */
static char *sse_event(char *json) {
    if (!json) return NULL;
    size_t n = strlen(json) + 9;
    char *ev = malloc(n);
    if (ev) snprintf(ev, n, "data: %s\n\n", json);
    free(json);
    return ev;
}

char *serve_openai_chunk(const serve_reply_head *h, const char *text, size_t len, int role_delta,
                         const serve_reply_end *end) {
    cJSON *root = head_object(h, 1);
    if (add_choice(root, h, 1, text, len, role_delta, end ? end->finish_reason : NULL)) {
        cJSON_Delete(root);
        return NULL;
    }
    if (end) add_flashmap(root, end);
    return sse_event(print_and_free(root));
}

char *serve_openai_usage_chunk(const serve_reply_head *h, const serve_reply_end *end) {
    cJSON *root = head_object(h, 1);
    cJSON_AddArrayToObject(root, "choices");
    add_usage(root, end);
    return sse_event(print_and_free(root));
}

char *serve_openai_error_chunk(const serve_error *e) {
    return sse_event(serve_openai_error(e));
}

char *serve_openai_models(const char *model, long created, int n_ctx) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddStringToObject(root, "object", "list");
    cJSON *m = cJSON_CreateObject();
    cJSON_AddItemToArray(cJSON_AddArrayToObject(root, "data"), m);
    cJSON_AddStringToObject(m, "id", model);
    cJSON_AddStringToObject(m, "object", "model");
    cJSON_AddNumberToObject(m, "created", (double)created);
    cJSON_AddStringToObject(m, "owned_by", "flashmap");
    cJSON_AddNumberToObject(m, "max_model_len", n_ctx);
    return print_and_free(root);
}
