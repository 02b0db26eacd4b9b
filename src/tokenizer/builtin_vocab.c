/* builtin_vocab.c: learns the builtin vocabulary's merges from a short fixed English text with plain BPE
 * training (count adjacent symbol pairs over word types weighted by frequency, merge the most frequent pair,
 * ties broken by the smaller (left, right) id pair). Words are " ?[A-Za-z]+" runs; any other byte is a
 * word of its own, which keeps merges inside what the Qwen2 pre-tokenizer would emit as one piece. */
#include "tokenizer/builtin_vocab.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/byte_map.h"

#define BUILTIN_MAX_MERGES 320

static const char builtin_text[] =
    "The quick brown fox jumps over the lazy dog. This is a small model that was made for tests, and it "
    "should still be able to read and write some common English words. When the people of the town went "
    "out in the morning, they saw that the water in the river had risen during the night. There were many "
    "houses near the river, and the people who lived in them were afraid that their homes would be lost. "
    "One of the men said that he had seen this happen before, when he was a young boy, and that the water "
    "would go down again in a few days. Some of the others did not believe him, but they had no other "
    "choice than to wait and see what would happen. In the afternoon the sun came out, and the children "
    "played in the streets while their parents talked about the weather and the work that had to be done. "
    "The teacher asked the students to write about what they had learned this year. Many of them wrote "
    "about their friends, their families, and the things they liked to do after school. One student wrote "
    "about the time she went to the city with her mother and father to see a play at the theater. Another "
    "wrote about how he learned to make bread with his grandmother, and how the kitchen smelled when the "
    "bread was in the oven. The teacher said that these were good stories, and that everyone should keep "
    "writing, because writing is one of the best ways to think about the world and to share it with other "
    "people. The computer program reads the input, splits it into tokens, and then runs the model to "
    "predict the next token. If the answer is correct, the system will return it to the user; otherwise "
    "it will try again with a different question. There is nothing more important than being able to "
    "explain your work clearly, so that other people can understand what you have done and why.";

typedef struct {
    int32_t *sym; /* symbol ids of the word */
    int len;
    int freq;
} word;

typedef struct {
    int32_t a, b;
    int freq;
} pair_count;

static int pair_cmp(const void *x, const void *y) {
    const pair_count *p = x, *q = y;
    if (p->a != q->a) return p->a < q->a ? -1 : 1;
    if (p->b != q->b) return p->b < q->b ? -1 : 1;
    return 0;
}

static int is_alpha(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

/* Splits builtin_text into word types with frequencies. Returns the count, or -1 on allocation failure. */
static int words_collect(word **out) {
    size_t n = sizeof builtin_text - 1, cap = 64;
    int nw = 0;
    word *w = malloc(cap * sizeof *w);
    if (!w) return -1;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        if (builtin_text[j] == ' ' && j + 1 < n && is_alpha(builtin_text[j + 1])) j++;
        if (is_alpha(builtin_text[j])) {
            while (j < n && is_alpha(builtin_text[j])) j++;
        } else {
            j = i + 1;
        }
        int len = (int)(j - i), found = -1;
        for (int k = 0; k < nw && found < 0; k++) {
            if (w[k].len != len) continue;
            int same = 1;
            for (int c = 0; c < len && same; c++) same = w[k].sym[c] == (uint8_t)builtin_text[i + (size_t)c];
            if (same) found = k;
        }
        if (found >= 0) {
            w[found].freq++;
        } else {
            if ((size_t)nw == cap) {
                word *g = realloc(w, 2 * cap * sizeof *w);
                if (!g) break;
                w = g;
                cap *= 2;
            }
            w[nw].sym = malloc((size_t)len * sizeof(int32_t));
            if (!w[nw].sym) break;
            for (int c = 0; c < len; c++) w[nw].sym[c] = (uint8_t)builtin_text[i + (size_t)c];
            w[nw].len = len;
            w[nw].freq = 1;
            nw++;
        }
        i = j;
    }
    *out = w;
    return nw;
}

void fm_builtin_vocab_free(fm_builtin_vocab *v) {
    if (!v) return;
    if (v->tokens)
        for (int i = 0; i < v->n_tokens; i++) free(v->tokens[i]);
    if (v->merges)
        for (int i = 0; i < v->n_merges; i++) free(v->merges[i]);
    free(v->tokens);
    free(v->types);
    free(v->merges);
    memset(v, 0, sizeof *v);
}

static char *str_join(const char *a, const char *sep, const char *b) {
    size_t la = strlen(a), ls = strlen(sep), lb = strlen(b);
    char *s = malloc(la + ls + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, sep, ls);
    memcpy(s + la + ls, b, lb + 1);
    return s;
}

int fm_builtin_vocab_build(fm_builtin_vocab *v, char *err, size_t errlen) {
    static const char *const specials[5] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>",
                                            "</think>"};
    memset(v, 0, sizeof *v);
    int cap = 256 + BUILTIN_MAX_MERGES + 5;
    v->tokens = calloc((size_t)cap, sizeof(char *));
    v->types = calloc((size_t)cap, sizeof(int32_t));
    v->merges = calloc(BUILTIN_MAX_MERGES, sizeof(char *));
    word *w = NULL;
    int nw = words_collect(&w);
    size_t total = 0;
    for (int i = 0; i < nw; i++) total += (size_t)w[i].len;
    pair_count *pc = malloc((total + 1) * sizeof *pc);
    int ok = v->tokens && v->types && v->merges && nw > 0 && pc;
    for (int b = 0; ok && b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        char s[3];
        size_t n = fm_bytes_to_gpt2(&byte, 1, s);
        s[n] = 0;
        v->tokens[b] = strdup(s);
        v->types[b] = 1;
        ok = v->tokens[b] != NULL;
        v->n_tokens = b + 1;
    }
    while (ok && v->n_merges < BUILTIN_MAX_MERGES) {
        size_t np = 0;
        for (int i = 0; i < nw; i++)
            for (int c = 0; c + 1 < w[i].len; c++)
                pc[np++] = (pair_count){w[i].sym[c], w[i].sym[c + 1], w[i].freq};
        if (np == 0) break;
        qsort(pc, np, sizeof *pc, pair_cmp);
        pair_count best = {0, 0, 0};
        for (size_t i = 0; i < np;) {
            pair_count cur = pc[i++];
            while (i < np && pc[i].a == cur.a && pc[i].b == cur.b) cur.freq += pc[i++].freq;
            if (cur.freq > best.freq) best = cur; /* strict: the first (smallest) pair wins ties */
        }
        if (best.freq < 2) break;
        char *tok = str_join(v->tokens[best.a], "", v->tokens[best.b]);
        char *mrg = str_join(v->tokens[best.a], " ", v->tokens[best.b]);
        if (!tok || !mrg) {
            free(tok);
            free(mrg);
            ok = 0;
            break;
        }
        int32_t id = v->n_tokens;
        v->tokens[id] = tok;
        v->types[id] = 1;
        v->n_tokens++;
        v->merges[v->n_merges++] = mrg;
        for (int i = 0; i < nw; i++) {
            int o = 0;
            for (int c = 0; c < w[i].len; c++) {
                if (c + 1 < w[i].len && w[i].sym[c] == best.a && w[i].sym[c + 1] == best.b) {
                    w[i].sym[o++] = id;
                    c++;
                } else {
                    w[i].sym[o++] = w[i].sym[c];
                }
            }
            w[i].len = o;
        }
    }
    for (int s = 0; ok && s < 5; s++) {
        int32_t id = v->n_tokens;
        v->tokens[id] = strdup(specials[s]);
        v->types[id] = s < 3 ? 3 : 4; /* <think> tags are non-special added tokens in Qwen3 */
        ok = v->tokens[id] != NULL;
        v->n_tokens++;
    }
    for (int i = 0; i < nw; i++) free(w[i].sym);
    free(w);
    free(pc);
    if (!ok) {
        fm_builtin_vocab_free(v);
        return fm_set_error(err, errlen, "builtin tokenizer vocabulary: out of memory");
    }
    int base = v->n_tokens - 5;
    v->endoftext_id = base;
    v->im_start_id = base + 1;
    v->im_end_id = base + 2;
    v->think_id = base + 3;
    v->think_end_id = base + 4;
    return 0;
}
