/* tokenizer.c: loading from GGUF metadata, encoding and decoding (see tokenizer.h). The loaded tokenizer
 * owns copies of every token's bytes; the GGUF may be closed after loading. */
#include "tokenizer/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/bpe.h"
#include "tokenizer/byte_map.h"
#include "tokenizer/pretokenize.h"
#include "tokenizer/utf8.h"

struct fm_tokenizer {
    int32_t n_tokens;
    char *bytes;    /* every token's bytes, concatenated */
    uint64_t *offs; /* [n_tokens + 1] token i is bytes[offs[i], offs[i+1]) */
    uint8_t *types; /* [n_tokens] FM_TOKEN_* */
    fm_bpe *bpe;
    fm_pretok *pretok;
    /* Added tokens (control and user-defined) matched in text, grouped by first byte, longest first. */
    int32_t *added;        /* [n_added] ids */
    int32_t added_at[257]; /* added[added_at[c] .. added_at[c+1]) start with byte c */
    int32_t eos, bos;
    int32_t stop[4];
    int n_stop;
};

/* ---- loading ---- */

typedef struct {
    gguf_str *text; /* [n] GGUF spelling of each token, pointing into the file */
    int32_t *slots; /* [mask + 1] open addressing on text, -1 = empty */
    uint64_t mask;
    const gguf_file *f;
    char *err;
    size_t errlen;
} load_ctx;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ULL;
    return h;
}

static int32_t load_lookup(void *vctx, const char *s, size_t n) {
    load_ctx *c = vctx;
    for (uint64_t i = hash_bytes(s, n) & c->mask;; i = (i + 1) & c->mask) {
        int32_t id = c->slots[i];
        if (id < 0) return -1;
        if (c->text[id].len == n && memcmp(c->text[id].ptr, s, n) == 0) return id;
    }
}

static int load_merge_at(void *vctx, uint64_t i, const char **s, size_t *n) {
    load_ctx *c = vctx;
    gguf_str m;
    if (gguf_get_arr_str(c->f, "tokenizer.ggml.merges", i, &m, c->err, c->errlen) != 0) return -1;
    *s = m.ptr;
    *n = (size_t)m.len;
    return 0;
}

static void added_sort(fm_tokenizer *t) {
    /* Insertion sort by (first byte, length desc): there are few added tokens. */
    for (int32_t i = 1; i < t->added_at[256]; i++) {
        int32_t id = t->added[i], j = i - 1;
        uint8_t c = (uint8_t)t->bytes[t->offs[id]];
        uint64_t len = t->offs[id + 1] - t->offs[id];
        while (j >= 0) {
            int32_t o = t->added[j];
            uint8_t oc = (uint8_t)t->bytes[t->offs[o]];
            uint64_t olen = t->offs[o + 1] - t->offs[o];
            if (oc < c || (oc == c && olen >= len)) break;
            t->added[j + 1] = o;
            j--;
        }
        t->added[j + 1] = id;
    }
}

static int32_t find_bytes(const fm_tokenizer *t, const char *s, size_t n) {
    for (int32_t i = t->n_tokens - 1; i >= 0; i--) /* special tokens sit at the end */
        if (t->offs[i + 1] - t->offs[i] == n && memcmp(t->bytes + t->offs[i], s, n) == 0) return i;
    return -1;
}

static int32_t get_id_opt(const gguf_file *f, const char *key, int32_t n_tokens) {
    uint32_t v;
    if (gguf_find_key(f, key) < 0 || gguf_get_u32(f, key, &v, NULL, 0) != 0) return -1;
    return v < (uint32_t)n_tokens ? (int32_t)v : -1;
}

static void stop_add(fm_tokenizer *t, int32_t id) {
    if (id < 0) return;
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop[i] == id) return;
    t->stop[t->n_stop++] = id;
}

int fm_tokenizer_load_gguf(const gguf_file *f, fm_tokenizer **out, char *err, size_t errlen) {
    *out = NULL;
    const char *name = gguf_path(f);
    gguf_str model, pre;
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, err, errlen) != 0) return -1;
    if (!gguf_str_eq(model, "gpt2"))
        return fm_set_error(err, errlen,
                            "%s: tokenizer.ggml.model is \"%.*s\", expected \"gpt2\" (byte-level BPE)", name,
                            (int)(model.len > 40 ? 40 : model.len), model.ptr);
    if (gguf_find_key(f, "tokenizer.ggml.pre") < 0)
        return fm_set_error(
            err, errlen,
            "%s: tokenizer.ggml.pre is missing, expected \"qwen2\" (without it llama.cpp would use "
            "the GPT-2 split, which is not Qwen's)",
            name);
    if (gguf_get_str(f, "tokenizer.ggml.pre", &pre, err, errlen) != 0) return -1;
    if (!gguf_str_eq(pre, "qwen2"))
        return fm_set_error(err, errlen, "%s: tokenizer.ggml.pre is \"%.*s\", expected \"qwen2\"", name,
                            (int)(pre.len > 40 ? 40 : pre.len), pre.ptr);
    uint64_t n, n_merges;
    if (gguf_get_arr_len(f, "tokenizer.ggml.tokens", &n, err, errlen) != 0) return -1;
    if (gguf_get_arr_len(f, "tokenizer.ggml.merges", &n_merges, err, errlen) != 0) return -1;
    if (n < 256 || n > INT32_MAX / 4)
        return fm_set_error(err, errlen, "%s: tokenizer.ggml.tokens has %llu tokens, expected 256 .. %d",
                            name, (unsigned long long)n, INT32_MAX / 4);
    const int32_t *types_in = NULL;
    if (gguf_find_key(f, "tokenizer.ggml.token_type") >= 0) {
        const void *data;
        uint64_t nt;
        if (gguf_get_arr_data(f, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, &data, &nt, err, errlen) != 0)
            return -1;
        if (nt != n)
            return fm_set_error(err, errlen,
                                "%s: tokenizer.ggml.token_type has %llu entries, tokens has %llu", name,
                                (unsigned long long)nt, (unsigned long long)n);
        types_in = data; /* may be unaligned: read with memcpy */
    }

    fm_tokenizer *t = calloc(1, sizeof *t);
    load_ctx c = {0};
    c.f = f;
    c.err = err;
    c.errlen = errlen;
    uint64_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    c.mask = cap - 1;
    c.text = malloc(n * sizeof *c.text);
    c.slots = malloc(cap * sizeof *c.slots);
    if (t) {
        t->n_tokens = (int32_t)n;
        t->offs = malloc((n + 1) * sizeof *t->offs);
        t->types = malloc(n);
    }
    if (!t || !c.text || !c.slots || !t->offs || !t->types) goto oom;
    memset(c.slots, 0xff, cap * sizeof *c.slots);
    uint64_t total = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (gguf_get_arr_str(f, "tokenizer.ggml.tokens", i, &c.text[i], err, errlen) != 0) goto fail;
        int32_t ty = FM_TOKEN_NORMAL;
        if (types_in) memcpy(&ty, types_in + i, sizeof ty);
        if (ty < FM_TOKEN_NORMAL || ty > FM_TOKEN_BYTE) {
            fm_set_error(err, errlen, "%s: tokenizer.ggml.token_type[%llu] = %d, expected 1..6", name,
                         (unsigned long long)i, (int)ty);
            goto fail;
        }
        t->types[i] = (uint8_t)ty;
        total += c.text[i].len;
        uint64_t h = hash_bytes(c.text[i].ptr, (size_t)c.text[i].len) & c.mask;
        for (;; h = (h + 1) & c.mask) {
            int32_t o = c.slots[h];
            if (o < 0) {
                c.slots[h] = (int32_t)i;
                break;
            }
            if (c.text[o].len == c.text[i].len && memcmp(c.text[o].ptr, c.text[i].ptr, c.text[i].len) == 0)
                break; /* a duplicate spelling: the first id keeps it, as in llama.cpp */
        }
    }
    /* Token bytes: normal tokens undo the GPT-2 spelling (which only shrinks); added and other tokens keep
     * their text, as do the rare normal tokens whose spelling is not byte-level. */
    t->bytes = malloc(total + 1);
    if (!t->bytes) goto oom;
    uint64_t o = 0;
    for (uint64_t i = 0; i < n; i++) {
        t->offs[i] = o;
        long k = -1;
        if (t->types[i] == FM_TOKEN_NORMAL)
            k = fm_gpt2_to_bytes(c.text[i].ptr, (size_t)c.text[i].len, (uint8_t *)t->bytes + o);
        if (k < 0) {
            memcpy(t->bytes + o, c.text[i].ptr, (size_t)c.text[i].len);
            k = (long)c.text[i].len;
        }
        o += (uint64_t)k;
    }
    t->offs[n] = o;

    t->bpe = fm_bpe_create(n_merges, load_merge_at, load_lookup, &c, err, errlen);
    if (!t->bpe) goto fail;
    t->pretok = fm_pretok_create(err, errlen);
    if (!t->pretok) goto fail;

    int32_t n_added = 0;
    for (uint64_t i = 0; i < n; i++)
        if ((t->types[i] == FM_TOKEN_CONTROL || t->types[i] == FM_TOKEN_USER_DEFINED) &&
            t->offs[i + 1] > t->offs[i])
            n_added++;
    t->added = malloc(((size_t)n_added + 1) * sizeof *t->added);
    if (!t->added) goto oom;
    int32_t k = 0;
    for (uint64_t i = 0; i < n; i++)
        if ((t->types[i] == FM_TOKEN_CONTROL || t->types[i] == FM_TOKEN_USER_DEFINED) &&
            t->offs[i + 1] > t->offs[i])
            t->added[k++] = (int32_t)i;
    t->added_at[256] = n_added;
    added_sort(t);
    for (int ch = 255, j = n_added; ch >= 0; ch--) {
        while (j > 0 && (uint8_t)t->bytes[t->offs[t->added[j - 1]]] >= ch) j--;
        t->added_at[ch] = j;
    }

    t->eos = get_id_opt(f, "tokenizer.ggml.eos_token_id", t->n_tokens);
    t->bos = get_id_opt(f, "tokenizer.ggml.bos_token_id", t->n_tokens);
    stop_add(t, t->eos);
    stop_add(t, get_id_opt(f, "tokenizer.ggml.eot_token_id", t->n_tokens));
    stop_add(t, find_bytes(t, "<|im_end|>", 10));
    stop_add(t, find_bytes(t, "<|endoftext|>", 13));

    free(c.text);
    free(c.slots);
    *out = t;
    return 0;
oom:
    fm_set_error(err, errlen, "%s: out of memory loading the tokenizer", name);
fail:
    free(c.text);
    free(c.slots);
    fm_tokenizer_free(t);
    return -1;
}

void fm_tokenizer_free(fm_tokenizer *t) {
    if (!t) return;
    fm_bpe_free(t->bpe);
    fm_pretok_free(t->pretok);
    free(t->bytes);
    free(t->offs);
    free(t->types);
    free(t->added);
    free(t);
}

/* ---- queries ---- */

int32_t fm_tokenizer_n_tokens(const fm_tokenizer *t) {
    return t->n_tokens;
}

int fm_tokenizer_token_type(const fm_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_tokens ? t->types[id] : 0;
}

const char *fm_tokenizer_token_bytes(const fm_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_tokens) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = (size_t)(t->offs[id + 1] - t->offs[id]);
    return t->bytes + t->offs[id];
}

int32_t fm_tokenizer_find(const fm_tokenizer *t, const char *text) {
    return find_bytes(t, text, strlen(text));
}
int32_t fm_tokenizer_eos(const fm_tokenizer *t) {
    return t->eos;
}
int32_t fm_tokenizer_bos(const fm_tokenizer *t) {
    return t->bos;
}

int fm_tokenizer_stop_ids(const fm_tokenizer *t, const int32_t **ids) {
    *ids = t->stop;
    return t->n_stop;
}

int fm_tokenizer_is_stop(const fm_tokenizer *t, int32_t id) {
    for (int i = 0; i < t->n_stop; i++)
        if (t->stop[i] == id) return 1;
    return 0;
}

/* ---- encoding ---- */

/* A per-call cache of short pieces' ids (text repeats its words): direct-mapped on a hash of the bytes. */
#define CACHE_SLOTS 8192
#define CACHE_KEY 24 /* longest cached piece, bytes */
#define CACHE_IDS 8  /* most ids a cached piece may have */
typedef struct {
    uint8_t len, n_ids; /* len 0 = empty slot */
    char key[CACHE_KEY];
    int32_t ids[CACHE_IDS];
} cache_slot;

typedef struct {
    const fm_tokenizer *tok;
    fm_bpe_scratch scr;
    fm_idvec out;
    cache_slot *cache; /* [CACHE_SLOTS] or NULL (short texts) */
} encode_ctx;

static int encode_piece(void *vctx, const char *s, size_t start, size_t end) {
    encode_ctx *c = vctx;
    size_t n = end - start;
    cache_slot *slot = NULL;
    if (c->cache && n <= CACHE_KEY) {
        slot = &c->cache[hash_bytes(s + start, n) & (CACHE_SLOTS - 1)];
        if (slot->len == n && memcmp(slot->key, s + start, n) == 0) {
            for (int i = 0; i < slot->n_ids; i++)
                if (fm_idvec_push(&c->out, slot->ids[i]) != 0) return 1;
            return 0;
        }
    }
    size_t before = c->out.n;
    if (fm_bpe_encode_piece(c->tok->bpe, (const uint8_t *)s + start, n, &c->scr, &c->out) != 0) return 1;
    if (slot && c->out.n - before <= CACHE_IDS) {
        slot->len = (uint8_t)n;
        slot->n_ids = (uint8_t)(c->out.n - before);
        memcpy(slot->key, s + start, n);
        memcpy(slot->ids, c->out.v + before, slot->n_ids * sizeof(int32_t));
    }
    return 0;
}

/* Normalises and splits one segment of plain text (no added tokens inside). */
static int encode_segment(encode_ctx *c, const char *s, size_t n, char *err, size_t errlen) {
    int ascii = 1;
    for (size_t i = 0; i < n && ascii; i++) ascii = (uint8_t)s[i] < 0x80;
    char *nfc = NULL;
    size_t nn = n;
    if (!ascii) {
        if (fm_nfc(s, n, &nfc, &nn, err, errlen) != 0) return -1;
        s = nfc;
    }
    int rc = fm_pretok_split(c->tok->pretok, s, nn, encode_piece, c, err, errlen);
    free(nfc);
    if (rc > 0) return fm_set_error(err, errlen, "tokenizer: out of memory while encoding");
    return rc;
}

/* The longest allowed added token at s[0..n), or -1. */
static int32_t added_match(const fm_tokenizer *t, const char *s, size_t n, int parse_special) {
    uint8_t c = (uint8_t)s[0];
    for (int32_t j = t->added_at[c]; j < t->added_at[c + 1]; j++) {
        int32_t id = t->added[j];
        if (!parse_special && t->types[id] == FM_TOKEN_CONTROL) continue;
        uint64_t len = t->offs[id + 1] - t->offs[id];
        if (len <= n && memcmp(s, t->bytes + t->offs[id], (size_t)len) == 0) return id;
    }
    return -1;
}

int fm_tokenizer_encode(const fm_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **ids,
                        size_t *n, char *err, size_t errlen) {
    *ids = NULL;
    *n = 0;
    char *fixed = NULL;
    if (!fm_utf8_valid((const uint8_t *)text, len)) {
        if (len > SIZE_MAX / 3) return fm_set_error(err, errlen, "tokenizer: input too large");
        fixed = malloc(3 * len + 1);
        if (!fixed) return fm_set_error(err, errlen, "tokenizer: out of memory");
        len = fm_utf8_lossy((const uint8_t *)text, len, fixed);
        text = fixed;
    }
    encode_ctx c = {.tok = t};
    if (len > 4096) c.cache = calloc(CACHE_SLOTS, sizeof *c.cache); /* NULL is fine: no cache */
    int rc = 0;
    size_t seg = 0;
    for (size_t i = 0; i < len && rc == 0;) {
        int32_t id = t->added_at[(uint8_t)text[i]] < t->added_at[(uint8_t)text[i] + 1]
                         ? added_match(t, text + i, len - i, parse_special)
                         : -1;
        if (id < 0) {
            i++;
            continue;
        }
        if (i > seg) rc = encode_segment(&c, text + seg, i - seg, err, errlen);
        if (rc == 0 && fm_idvec_push(&c.out, id) != 0)
            rc = fm_set_error(err, errlen, "tokenizer: out of memory");
        i += (size_t)(t->offs[id + 1] - t->offs[id]);
        seg = i;
    }
    if (rc == 0 && seg < len) rc = encode_segment(&c, text + seg, len - seg, err, errlen);
    fm_bpe_scratch_free(&c.scr);
    free(c.cache);
    free(fixed);
    if (rc != 0) {
        free(c.out.v);
        return -1;
    }
    *ids = c.out.v;
    *n = c.out.n;
    return 0;
}

int fm_tokenizer_decode(const fm_tokenizer *t, const int32_t *ids, size_t n, char **out, size_t *len,
                        char *err, size_t errlen) {
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_tokens)
            return fm_set_error(err, errlen, "tokenizer: id %d at position %zu is outside [0, %d)",
                                (int)ids[i], i, (int)t->n_tokens);
        total += (size_t)(t->offs[ids[i] + 1] - t->offs[ids[i]]);
    }
    char *s = malloc(total + 1);
    if (!s) return fm_set_error(err, errlen, "tokenizer: out of memory");
    size_t o = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = (size_t)(t->offs[ids[i] + 1] - t->offs[ids[i]]);
        memcpy(s + o, t->bytes + t->offs[ids[i]], k);
        o += k;
    }
    s[o] = 0;
    *out = s;
    if (len) *len = o;
    return 0;
}
