/* chat.c: the Qwen3 chat template (tokenizer_config.json of the Qwen3 models) rendered in C; see chat.h.
 * Each step below names the template construct it reproduces. Python string semantics used by the template:
 * s.split(sep)[-1] is the text after the last sep, s.split(sep)[0] the text before the first; lstrip('\n'),
 * rstrip('\n') and strip('\n') remove newlines only. */
#include "tokenizer/chat.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

typedef struct {
    char *s;
    size_t n, cap;
    int oom;
} strbuf;

static void sb_add(strbuf *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *g = realloc(b->s, cap);
        if (!g) {
            b->oom = 1;
            return;
        }
        b->s = g;
        b->cap = cap;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}

static void sb_str(strbuf *b, const char *s) {
    sb_add(b, s, strlen(s));
}

/* A view of a string: [p, p + n). */
typedef struct {
    const char *p;
    size_t n;
} view;

static view view_of(const char *s) {
    return (view){s ? s : "", s ? strlen(s) : 0};
}

static const char *view_find(view v, const char *needle, int last) {
    size_t k = strlen(needle);
    const char *found = NULL;
    for (size_t i = 0; i + k <= v.n; i++) {
        if (memcmp(v.p + i, needle, k) == 0) {
            found = v.p + i;
            if (!last) break;
        }
    }
    return found;
}

static view lstrip_nl(view v) {
    while (v.n && v.p[0] == '\n') v.p++, v.n--;
    return v;
}

static view rstrip_nl(view v) {
    while (v.n && v.p[v.n - 1] == '\n') v.n--;
    return v;
}

static int starts_with(view v, const char *s) {
    size_t k = strlen(s);
    return v.n >= k && memcmp(v.p, s, k) == 0;
}

static int ends_with(view v, const char *s) {
    size_t k = strlen(s);
    return v.n >= k && memcmp(v.p + v.n - k, s, k) == 0;
}

static int role_is(const fm_chat_message *m, const char *r) {
    return m->role && strcmp(m->role, r) == 0;
}

static void render_assistant(strbuf *b, const fm_chat_message *m, int i, int n, int last_query) {
    view content = view_of(m->content), reasoning = {"", 0};
    if (m->reasoning_content) {
        reasoning = view_of(m->reasoning_content);
    } else if (view_find(content, "</think>", 0)) {
        /* content = content.split('</think>')[-1].lstrip('\n') */
        const char *lastc = view_find(content, "</think>", 1) + 8;
        view after = {lastc, (size_t)(content.p + content.n - lastc)};
        /* reasoning = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
        view before = {content.p, (size_t)(view_find(content, "</think>", 0) - content.p)};
        before = rstrip_nl(before);
        const char *open = view_find(before, "<think>", 1);
        if (open) before = (view){open + 7, (size_t)(before.p + before.n - open - 7)};
        reasoning = lstrip_nl(before);
        content = lstrip_nl(after);
    }
    sb_str(b, "<|im_start|>assistant\n");
    /* loop.index0 > ns.last_query_index and (loop.last or reasoning_content): keep the reasoning */
    if (i > last_query && (i == n - 1 || reasoning.n > 0)) {
        sb_str(b, "<think>\n");
        view r = rstrip_nl(lstrip_nl(reasoning));
        sb_add(b, r.p, r.n);
        sb_str(b, "\n</think>\n\n");
        content = lstrip_nl(content);
    }
    sb_add(b, content.p, content.n);
    sb_str(b, "<|im_end|>\n");
}

int fm_chat_render(const fm_chat_message *msgs, int n, int add_generation_prompt, int enable_thinking,
                   char **out, char *err, size_t errlen) {
    *out = NULL;
    if (n < 1) return fm_set_error(err, errlen, "chat template: need at least one message");
    for (int i = 0; i < n; i++)
        if (!msgs[i].role) return fm_set_error(err, errlen, "chat template: message %d has no role", i);
    strbuf b = {0};
    sb_add(&b, "", 0); /* an empty conversation still returns "" rather than NULL */
    if (role_is(&msgs[0], "system")) {
        sb_str(&b, "<|im_start|>system\n");
        sb_str(&b, msgs[0].content ? msgs[0].content : "");
        sb_str(&b, "<|im_end|>\n");
    }
    /* ns.last_query_index: the last user message that is not a wrapped tool response (n - 1 when none). */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        view c = view_of(msgs[i].content);
        if (role_is(&msgs[i], "user") &&
            !(starts_with(c, "<tool_response>") && ends_with(c, "</tool_response>"))) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const fm_chat_message *m = &msgs[i];
        if (role_is(m, "user") || (role_is(m, "system") && i > 0)) {
            sb_str(&b, "<|im_start|>");
            sb_str(&b, m->role);
            sb_str(&b, "\n");
            sb_str(&b, m->content ? m->content : "");
            sb_str(&b, "<|im_end|>\n");
        } else if (role_is(m, "assistant")) {
            render_assistant(&b, m, i, n, last_query);
        } else if (role_is(m, "tool")) {
            if (i == 0 || !role_is(&msgs[i - 1], "tool")) sb_str(&b, "<|im_start|>user");
            sb_str(&b, "\n<tool_response>\n");
            sb_str(&b, m->content ? m->content : "");
            sb_str(&b, "\n</tool_response>");
            if (i == n - 1 || !role_is(&msgs[i + 1], "tool")) sb_str(&b, "<|im_end|>\n");
        }
    }
    if (add_generation_prompt) {
        sb_str(&b, "<|im_start|>assistant\n");
        if (!enable_thinking) sb_str(&b, "<think>\n\n</think>\n\n");
    }
    if (b.oom) {
        free(b.s);
        return fm_set_error(err, errlen, "chat template: out of memory");
    }
    *out = b.s;
    return 0;
}
