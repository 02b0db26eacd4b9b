/* serve_request.c: parses and checks a completions / chat completions request body (see serve_request.h).
 * Every refusal names the field, what was expected and what was found. */
#include "serve_request.h"

#include "cli_engine.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_STOP_BYTES 256

/* cJSON's parser writes a global error record on every call: parse one body at a time. */
static pthread_mutex_t parse_mu = PTHREAD_MUTEX_INITIALIZER;

/* A field's value; NULL when absent or JSON null. */
static const cJSON *field(const cJSON *o, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(o, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

static const char *type_name(const cJSON *v) {
    if (cJSON_IsBool(v)) return "a boolean";
    if (cJSON_IsNumber(v)) return "a number";
    if (cJSON_IsString(v)) return "a string";
    if (cJSON_IsArray(v)) return "an array";
    if (cJSON_IsObject(v)) return "an object";
    return "null";
}

static int bad_type(serve_error *err, const char *name, const char *expected, const cJSON *v) {
    return serve_error_set(err, 400, "invalid_request_error", name, "'%s' must be %s, got %s", name, expected,
                           type_name(v));
}

/* *present = 0 when absent; else *v holds the number. */
static int get_number(const cJSON *o, const char *name, double *v, int *present, serve_error *err) {
    const cJSON *f = field(o, name);
    *present = f != NULL;
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return bad_type(err, name, "a number", f);
    *v = f->valuedouble;
    return 0;
}

static int get_int(const cJSON *o, const char *name, long lo, long hi, long *v, int *present,
                   serve_error *err) {
    const cJSON *f = field(o, name);
    *present = f != NULL;
    if (!f) return 0;
    if (!cJSON_IsNumber(f)) return bad_type(err, name, "a whole number", f);
    const double d = f->valuedouble;
    if (d != floor(d))
        return serve_error_set(err, 400, "invalid_request_error", name, "'%s' must be a whole number, got %g",
                               name, d);
    if (d < (double)lo || d > (double)hi)
        return serve_error_set(err, 400, "invalid_request_error", name,
                               "'%s' must be from %ld to %ld, got %.0f", name, lo, hi, d);
    *v = (long)d;
    return 0;
}

static int get_bool(const cJSON *o, const char *name, int *v, serve_error *err) {
    const cJSON *f = field(o, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return bad_type(err, name, "true or false", f);
    *v = cJSON_IsTrue(f);
    return 0;
}

/* A numeric setting the engine does not have: refused unless absent or its "off" value (ok1 or ok2). */
static int check_off_number(const cJSON *o, const char *name, double ok1, double ok2, const char *want,
                            const char *why, serve_error *err) {
    double v = 0;
    int present = 0;
    if (get_number(o, name, &v, &present, err)) return -1;
    if (present && v != ok1 && v != ok2)
        return serve_error_set(err, 400, "invalid_request_error", name,
                               "'%s' must be %s or absent (%s), got %g", name, want, why, v);
    return 0;
}

/* Features the engine does not have: refused when set to anything but their "off" value. */
static int check_unsupported(const cJSON *o, serve_error *err) {
    static const char *one = "flashmap serve returns one choice per request";
    if (check_off_number(o, "n", 1, 1, "1", one, err) || check_off_number(o, "best_of", 1, 1, "1", one, err))
        return -1;
    static const char *off[] = {"logprobs", "top_logprobs", "echo", "suffix", "logit_bias", "tools"};
    for (size_t i = 0; i < sizeof off / sizeof off[0]; i++) {
        const cJSON *f = field(o, off[i]);
        if (!f || cJSON_IsFalse(f) || (cJSON_IsNumber(f) && f->valuedouble == 0) ||
            (cJSON_IsString(f) && !f->valuestring[0]) ||
            ((cJSON_IsArray(f) || cJSON_IsObject(f)) && !f->child))
            continue;
        return serve_error_set(err, 400, "invalid_request_error", off[i],
                               "'%s' is not supported by flashmap serve", off[i]);
    }
    const cJSON *rf = field(o, "response_format"), *t = rf ? field(rf, "type") : NULL;
    if (rf && !(cJSON_IsObject(rf) && (!t || (cJSON_IsString(t) && !strcmp(t->valuestring, "text")))))
        return serve_error_set(err, 400, "invalid_request_error", "response_format",
                               "'response_format' other than {\"type\": \"text\"} is not supported");
    const cJSON *model = field(o, "model");
    if (model && !cJSON_IsString(model)) return bad_type(err, "model", "a string", model);
    return 0;
}

/* A sampling probability or temperature as the engine's float, checked on the float (so 0.9999999999 does
 * not round to a 1 that min_p refuses): in [lo, hi], lo excluded when lo_open, hi when hi_open. *v is left
 * alone when the field is absent. */
static int get_float(const cJSON *o, const char *name, double lo, int lo_open, double hi, int hi_open,
                     const char *range, float *v, serve_error *err) {
    double d = 0;
    int present = 0;
    if (get_number(o, name, &d, &present, err)) return -1;
    if (!present) return 0;
    const float f = (float)d;
    if (!(lo_open ? f > lo : f >= lo) || !(hi_open ? f < hi : f <= hi))
        return serve_error_set(err, 400, "invalid_request_error", name, "'%s' must be %s, got %.15g", name,
                               range, d);
    *v = f;
    return 0;
}

/* temperature, top_k, top_p, min_p, the penalties and seed, over the server's defaults. A sampled request
 * without a seed uses serve --seed, else a fresh random one (reported in the reply, to be given back). */
static int parse_sampling(const cJSON *o, const serve_sampling_defaults *def, serve_request *r,
                          serve_error *err) {
    fm_sampling *s = &r->sampling;
    if (def) {
        *s = def->sampling;
    } else {
        memset(s, 0, sizeof *s);
        s->top_p = 1;
    }
    if (get_float(o, "temperature", 0, 0, 2, 0, "from 0 (greedy) to 2", &s->temperature, err) ||
        get_float(o, "top_p", 0, 1, 1, 0, "more than 0 and at most 1", &s->top_p, err) ||
        get_float(o, "min_p", 0, 0, 1, 1, "at least 0 and less than 1", &s->min_p, err) ||
        get_float(o, "presence_penalty", -2, 0, 2, 0, "from -2 to 2", &s->presence_penalty, err) ||
        get_float(o, "frequency_penalty", -2, 0, 2, 0, "from -2 to 2", &s->frequency_penalty, err) ||
        get_float(o, "repeat_penalty", 0, 1, 10, 0, "more than 0 and at most 10 (1: off)",
                  &s->repetition_penalty, err) ||
        get_float(o, "repetition_penalty", 0, 1, 10, 0, "more than 0 and at most 10 (1: off)",
                  &s->repetition_penalty, err))
        return -1;
    /* llama.cpp's repeat_last_n: -1 the whole sequence, 0 no repetition penalty, n the last n tokens */
    long last_n = 0;
    int has_last_n = 0;
    if (get_int(o, "repeat_last_n", -1, 1L << 30, &last_n, &has_last_n, err)) return -1;
    if (has_last_n) s->repeat_last_n = last_n < 0 ? 0 : (int)last_n;
    if (has_last_n && last_n == 0) s->repetition_penalty = 0;
    long k = 0;
    int present = 0;
    if (get_int(o, "top_k", -(1L << 53), 1L << 53, &k, &present, err)) return -1;
    if (present && (k < -1 || k > (1L << 30)))
        return serve_error_set(err, 400, "invalid_request_error", "top_k",
                               "'top_k' must be a whole number from 0 to %ld (0 or -1: no limit), got %ld",
                               1L << 30, k);
    if (present) s->top_k = k < 0 ? 0 : (int)k;
    const long max_seed = (1L << 53) - 1; /* exact in a JSON number (a double) */
    const cJSON *seed = field(o, "seed");
    if (seed && !cJSON_IsNumber(seed)) return bad_type(err, "seed", "a whole number", seed);
    if (seed && seed->valuedouble < 0)
        return serve_error_set(err, 400, "invalid_request_error", "seed",
                               "'seed' must not be negative: a whole number from 0 to %ld, got %.15g",
                               max_seed, seed->valuedouble);
    long v = 0;
    if (get_int(o, "seed", 0, max_seed, &v, &present, err)) return -1;
    if (present)
        s->seed = (uint64_t)v;
    else if (s->temperature > 0 && !(def && def->seed_given))
        s->seed = cli_random_seed();
    return 0;
}

static int valid_utf8(const unsigned char *s) {
    while (*s) {
        int n = *s < 0x80             ? 0
                : (*s & 0xe0) == 0xc0 ? 1
                : (*s & 0xf0) == 0xe0 ? 2
                : (*s & 0xf8) == 0xf0 ? 3
                                      : -1;
        if (n < 0 || (n == 1 && *s < 0xc2)) return 0;
        s++;
        for (int i = 0; i < n; i++, s++)
            if ((*s & 0xc0) != 0x80) return 0;
    }
    return 1;
}

static int add_stop(serve_request *r, const cJSON *s, const char *where, serve_error *err) {
    if (!cJSON_IsString(s)) return bad_type(err, "stop", "a string or an array of strings", s);
    const size_t n = strlen(s->valuestring);
    if (n == 0 || n > MAX_STOP_BYTES || !valid_utf8((const unsigned char *)s->valuestring))
        return serve_error_set(err, 400, "invalid_request_error", "stop",
                               "%s must be UTF-8 text of 1 to %d bytes", where, MAX_STOP_BYTES);
    if (!(r->stop[r->n_stop++] = strdup(s->valuestring)))
        return serve_error_set(err, 500, "server_error", NULL, "out of memory");
    return 0;
}

static int parse_stop(const cJSON *o, serve_request *r, serve_error *err) {
    const cJSON *stop = field(o, "stop");
    if (!stop) return 0;
    if (!cJSON_IsArray(stop)) return add_stop(r, stop, "'stop'", err);
    const int n = cJSON_GetArraySize(stop);
    if (n > SERVE_MAX_STOP)
        return serve_error_set(err, 400, "invalid_request_error", "stop",
                               "'stop' holds %d strings, at most %d", n, SERVE_MAX_STOP);
    char where[32];
    for (int i = 0; i < n; i++) {
        snprintf(where, sizeof where, "stop[%d]", i);
        if (add_stop(r, cJSON_GetArrayItem(stop, i), where, err)) return -1;
    }
    return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts joined by newlines. */
static char *message_content(const cJSON *content, int i, serve_error *err) {
    if (!content) return strdup("");
    if (cJSON_IsString(content)) return strdup(content->valuestring);
    char name[48];
    snprintf(name, sizeof name, "messages[%d].content", i);
    if (!cJSON_IsArray(content)) {
        bad_type(err, name, "a string or an array of text parts", content);
        return NULL;
    }
    size_t total = 1;
    const cJSON *part;
    int k = 0;
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_IsObject(part) ? field(part, "type") : NULL;
        const cJSON *text = cJSON_IsObject(part) ? field(part, "text") : NULL;
        if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
            serve_error_set(err, 400, "invalid_request_error", name,
                            "%s[%d] must be {\"type\": \"text\", \"text\": STRING} (only text is supported)",
                            name, k);
            return NULL;
        }
        total += strlen(text->valuestring) + 1;
        k++;
    }
    char *out = calloc(1, total);
    if (!out) return NULL;
    k = 0;
    cJSON_ArrayForEach(part, content) {
        if (k++) strcat(out, "\n");
        strcat(out, field(part, "text")->valuestring);
    }
    return out;
}

static int parse_chat(const cJSON *o, serve_request *r, serve_error *err) {
    const cJSON *msgs = field(o, "messages");
    if (!msgs)
        return serve_error_set(err, 400, "invalid_request_error", "messages", "'messages' is required");
    if (!cJSON_IsArray(msgs)) return bad_type(err, "messages", "an array of messages", msgs);
    const int n = cJSON_GetArraySize(msgs);
    if (n == 0) return serve_error_set(err, 400, "invalid_request_error", "messages", "'messages' is empty");
    int think = 1;
    const cJSON *kw = field(o, "chat_template_kwargs");
    if (kw && !cJSON_IsObject(kw)) return bad_type(err, "chat_template_kwargs", "an object", kw);
    if (kw && get_bool(kw, "enable_thinking", &think, err)) {
        snprintf(err->param, sizeof err->param, "chat_template_kwargs.enable_thinking");
        return -1;
    }
    fm_message *m = calloc((size_t)n, sizeof *m);
    char **contents = calloc((size_t)n, sizeof *contents);
    int rc = -1, i = 0;
    if (!m || !contents) {
        serve_error_set(err, 500, "server_error", NULL, "out of memory");
        goto done;
    }
    const cJSON *msg;
    cJSON_ArrayForEach(msg, msgs) {
        char name[48];
        snprintf(name, sizeof name, "messages[%d]", i);
        if (!cJSON_IsObject(msg)) {
            bad_type(err, name, "an object with 'role' and 'content'", msg);
            goto done;
        }
        const cJSON *role = field(msg, "role");
        snprintf(name, sizeof name, "messages[%d].role", i);
        if (!role) {
            serve_error_set(err, 400, "invalid_request_error", name, "'%s' is required", name);
            goto done;
        }
        if (!cJSON_IsString(role)) {
            bad_type(err, name, "a string", role);
            goto done;
        }
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant")) {
            serve_error_set(err, 400, "invalid_request_error", name,
                            "'%s' must be \"system\", \"user\" or \"assistant\", got \"%.64s\"", name,
                            role->valuestring);
            goto done;
        }
        if (!(contents[i] = message_content(field(msg, "content"), i, err))) {
            if (!err->status) serve_error_set(err, 500, "server_error", NULL, "out of memory");
            goto done;
        }
        m[i] = (fm_message){role->valuestring, contents[i]};
        i++;
    }
    char msg_err[FM_ERRBUF_SIZE];
    if (fm_format_chat(m, n, think, &r->prompt, msg_err, sizeof msg_err)) {
        serve_error_set(err, 400, "invalid_request_error", "messages", "%s", msg_err);
        goto done;
    }
    rc = 0;
done:
    for (int j = 0; contents && j < n; j++) free(contents[j]);
    free(contents);
    free(m);
    return rc;
}

static int parse_fields(const cJSON *o, const serve_sampling_defaults *def, serve_request *r,
                        serve_error *err) {
    if (check_unsupported(o, err) || parse_sampling(o, def, r, err)) return -1;
    if (r->kind == SERVE_CHAT) {
        if (parse_chat(o, r, err)) return -1;
    } else {
        const cJSON *p = field(o, "prompt");
        if (!p) return serve_error_set(err, 400, "invalid_request_error", "prompt", "'prompt' is required");
        if (!cJSON_IsString(p))
            return serve_error_set(err, 400, "invalid_request_error", "prompt",
                                   "'prompt' must be a string, got %s (batches and token-id prompts are not "
                                   "supported)",
                                   type_name(p));
        if (!p->valuestring[0])
            return serve_error_set(err, 400, "invalid_request_error", "prompt", "'prompt' is empty");
        if (!(r->prompt = strdup(p->valuestring)))
            return serve_error_set(err, 500, "server_error", NULL, "out of memory");
    }
    /* OpenAI's defaults: 16 new tokens for completions, the rest of the context for chat. */
    long max_tokens = r->kind == SERVE_CHAT ? 0 : 16;
    int present = 0;
    if (r->kind == SERVE_CHAT && get_int(o, "max_completion_tokens", 1, 1L << 30, &max_tokens, &present, err))
        return -1;
    if (!present && get_int(o, "max_tokens", 1, 1L << 30, &max_tokens, &present, err)) return -1;
    r->max_tokens = (int)max_tokens;
    if (get_bool(o, "stream", &r->stream, err) || get_bool(o, "ignore_eos", &r->ignore_eos, err) ||
        parse_stop(o, r, err))
        return -1;
    const cJSON *so = field(o, "stream_options");
    if (so && !cJSON_IsObject(so)) return bad_type(err, "stream_options", "an object", so);
    if (so && get_bool(so, "include_usage", &r->include_usage, err)) {
        snprintf(err->param, sizeof err->param, "stream_options.include_usage");
        return -1;
    }
    return 0;
}

int serve_request_parse(serve_kind kind, const char *body, size_t len, const serve_sampling_defaults *def,
                        serve_request *r, serve_error *err) {
    memset(r, 0, sizeof *r);
    memset(err, 0, sizeof *err);
    r->kind = kind;
    if (len == 0)
        return serve_error_set(err, 400, "invalid_request_error", NULL,
                               "the request body is empty: send a JSON object");
    const char *end = NULL;
    pthread_mutex_lock(&parse_mu);
    cJSON *root = cJSON_ParseWithLengthOpts(body, len, &end, 0);
    pthread_mutex_unlock(&parse_mu);
    if (!root) {
        const size_t at = end && end >= body && end <= body + len ? (size_t)(end - body) : 0;
        return serve_error_set(err, 400, "invalid_request_error", NULL,
                               "the request body is not valid JSON (error at byte %zu of %zu)", at, len);
    }
    while (end && end < body + len && strchr(" \t\r\n", *end)) end++;
    int rc;
    if (end && end < body + len)
        rc = serve_error_set(err, 400, "invalid_request_error", NULL,
                             "the request body has data after its JSON value (at byte %zu)",
                             (size_t)(end - body));
    else if (!cJSON_IsObject(root))
        rc = serve_error_set(err, 400, "invalid_request_error", NULL,
                             "the request body must be a JSON object, got %s", type_name(root));
    else
        rc = parse_fields(root, def, r, err);
    cJSON_Delete(root);
    if (rc) serve_request_free(r);
    return rc;
}

void serve_request_free(serve_request *r) {
    free(r->prompt);
    for (int i = 0; i < r->n_stop; i++) free(r->stop[i]);
    memset(r, 0, sizeof *r);
    r->kind = SERVE_COMPLETION;
}
