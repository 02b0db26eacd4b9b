/* bpe.c: see bpe.h. Merges are kept in an open-addressing table keyed by the (left id, right id) pair, so
 * one probe answers "is there a merge, what rank, what result". */
#include "tokenizer/bpe.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/byte_map.h"

typedef struct {
    uint64_t key; /* (left << 32) | right; EMPTY_KEY when free */
    int32_t rank;
    int32_t id; /* the merged token */
} merge_slot;

#define EMPTY_KEY UINT64_MAX
#define SCAN_MAX 48 /* pieces up to this many bytes use the quadratic scan, longer ones the heap */

struct fm_bpe {
    merge_slot *slots; /* [mask + 1] */
    uint64_t mask;
    int32_t byte_id[256]; /* token of each single byte */
};

static uint64_t hash64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

static const merge_slot *merge_find(const fm_bpe *b, int32_t l, int32_t r) {
    uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
    for (uint64_t i = hash64(key) & b->mask;; i = (i + 1) & b->mask) {
        const merge_slot *s = &b->slots[i];
        if (s->key == key) return s;
        if (s->key == EMPTY_KEY) return NULL;
    }
}

void fm_bpe_free(fm_bpe *b) {
    if (!b) return;
    free(b->slots);
    free(b);
}

fm_bpe *fm_bpe_create(uint64_t n_merges, fm_bpe_merge_fn merge_at, fm_bpe_lookup_fn lookup, void *ctx,
                      char *err, size_t errlen) {
    if (n_merges > INT32_MAX / 2) {
        fm_set_error(err, errlen, "tokenizer.ggml.merges: %llu merges, at most %d supported",
                     (unsigned long long)n_merges, INT32_MAX / 2);
        return NULL;
    }
    fm_bpe *b = calloc(1, sizeof *b);
    uint64_t cap = 16;
    while (cap < 2 * n_merges + 16) cap *= 2;
    if (b) b->slots = malloc(cap * sizeof *b->slots);
    if (!b || !b->slots) {
        fm_bpe_free(b);
        fm_set_error(err, errlen, "tokenizer: out of memory for %llu merges", (unsigned long long)n_merges);
        return NULL;
    }
    b->mask = cap - 1;
    for (uint64_t i = 0; i < cap; i++) b->slots[i].key = EMPTY_KEY;
    for (int c = 0; c < 256; c++) {
        char sp[3];
        uint8_t byte = (uint8_t)c;
        size_t n = fm_bytes_to_gpt2(&byte, 1, sp);
        b->byte_id[c] = lookup(ctx, sp, n);
        if (b->byte_id[c] < 0) {
            fm_bpe_free(b);
            fm_set_error(err, errlen,
                         "tokenizer.ggml.tokens: no token for byte 0x%02x (GPT-2 spelling \"%.*s\")", c,
                         (int)n, sp);
            return NULL;
        }
    }
    char *joined = NULL;
    size_t joined_cap = 0;
    for (uint64_t i = 0; i < n_merges; i++) {
        const char *s;
        size_t n;
        if (merge_at(ctx, i, &s, &n) != 0) goto bad;
        const char *sp =
            n > 1 ? memchr(s + 1, ' ', n - 1) : NULL; /* a token may start with ' ' only in theory */
        if (!sp) {
            fm_set_error(err, errlen, "tokenizer.ggml.merges[%llu]: expected \"left right\", found \"%.*s\"",
                         (unsigned long long)i, (int)(n > 60 ? 60 : n), s);
            goto bad;
        }
        size_t ln = (size_t)(sp - s), rn = n - ln - 1;
        int32_t l = lookup(ctx, s, ln), r = lookup(ctx, sp + 1, rn);
        if (joined_cap < ln + rn) {
            free(joined);
            joined_cap = 2 * (ln + rn);
            joined = malloc(joined_cap);
            if (!joined) {
                fm_set_error(err, errlen, "tokenizer: out of memory");
                goto bad;
            }
        }
        memcpy(joined, s, ln);
        memcpy(joined + ln, sp + 1, rn);
        int32_t m = lookup(ctx, joined, ln + rn);
        if (l < 0 || r < 0 || m < 0) {
            fm_set_error(err, errlen, "tokenizer.ggml.merges[%llu] \"%.*s\": %s is not a token",
                         (unsigned long long)i, (int)(n > 60 ? 60 : n), s,
                         l < 0   ? "the left part"
                         : r < 0 ? "the right part"
                                 : "the result");
            goto bad;
        }
        uint64_t key = ((uint64_t)(uint32_t)l << 32) | (uint32_t)r;
        for (uint64_t h = hash64(key) & b->mask;; h = (h + 1) & b->mask) {
            if (b->slots[h].key == key) break; /* a repeated pair keeps its first (lowest) rank, as HF does */
            if (b->slots[h].key == EMPTY_KEY) {
                b->slots[h] = (merge_slot){key, (int32_t)i, m};
                break;
            }
        }
    }
    free(joined);
    return b;
bad:
    free(joined);
    fm_bpe_free(b);
    return NULL;
}

int fm_idvec_push(fm_idvec *a, int32_t id) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        int32_t *v = realloc(a->v, cap * sizeof *v);
        if (!v) return -1;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = id;
    return 0;
}

void fm_bpe_scratch_free(fm_bpe_scratch *s) {
    free(s->sym);
    free(s->next);
    free(s->prev);
    free(s->heap);
    memset(s, 0, sizeof *s);
}

typedef struct {
    int32_t rank;
    int32_t left;          /* symbol index */
    int32_t right;         /* symbol index expected next to left */
    int32_t lid, rid, mid; /* ids of the pair when pushed, and of the merge result */
} heap_item;

static int item_less(const heap_item *a, const heap_item *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->left < b->left;
}

static void heap_push(heap_item *h, size_t *n, heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!item_less(&it, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = it;
}

static heap_item heap_pop(heap_item *h, size_t *n) {
    heap_item top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && item_less(&h[c + 1], &h[c])) c++;
        if (!item_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

static int scratch_reserve(fm_bpe_scratch *s, size_t n) {
    if (s->cap >= n) return 0;
    size_t cap = n < 64 ? 64 : n;
    int32_t *a = realloc(s->sym, cap * sizeof *a);
    if (!a) return -1;
    s->sym = a;
    a = realloc(s->next, cap * sizeof *a);
    if (!a) return -1;
    s->next = a;
    a = realloc(s->prev, cap * sizeof *a);
    if (!a) return -1;
    s->prev = a;
    s->cap = cap;
    return 0;
}

/* Short pieces: repeatedly merge the lowest-rank adjacent pair (leftmost on ties). rank[i]/mid[i] cache the
 * merge of pair (i, i+1) so that each step only looks up the two pairs next to the merged symbol. */
static void pair_set(const fm_bpe *b, const int32_t *sym, int32_t *rank, int32_t *mid, size_t i) {
    const merge_slot *m = merge_find(b, sym[i], sym[i + 1]);
    rank[i] = m ? m->rank : INT32_MAX;
    mid[i] = m ? m->id : -1;
}

static void merge_scan(const fm_bpe *b, int32_t *sym, size_t *np) {
    int32_t rank[SCAN_MAX], mid[SCAN_MAX];
    size_t n = *np;
    for (size_t i = 0; i + 1 < n; i++) pair_set(b, sym, rank, mid, i);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == INT32_MAX) break;
        sym[best] = mid[best];
        memmove(sym + best + 1, sym + best + 2, (n - best - 2) * sizeof *sym);
        if (best + 2 < n) {
            memmove(rank + best + 1, rank + best + 2, (n - best - 3) * sizeof *rank);
            memmove(mid + best + 1, mid + best + 2, (n - best - 3) * sizeof *mid);
        }
        n--;
        if (best > 0) pair_set(b, sym, rank, mid, best - 1);
        if (best + 1 < n) pair_set(b, sym, rank, mid, best);
    }
    *np = n;
}

static void heap_try_push(const fm_bpe *b, const fm_bpe_scratch *s, heap_item *h, size_t *hn, int32_t l) {
    if (l < 0) return;
    int32_t r = s->next[l];
    if (r < 0) return;
    const merge_slot *m = merge_find(b, s->sym[l], s->sym[r]);
    if (m) heap_push(h, hn, (heap_item){m->rank, l, r, s->sym[l], s->sym[r], m->id});
}

int fm_bpe_encode_piece(const fm_bpe *b, const uint8_t *bytes, size_t n, fm_bpe_scratch *s, fm_idvec *out) {
    if (n > INT32_MAX || scratch_reserve(s, n) != 0) return -1;
    for (size_t i = 0; i < n; i++) s->sym[i] = b->byte_id[bytes[i]];
    if (n <= SCAN_MAX) {
        merge_scan(b, s->sym, &n);
        for (size_t i = 0; i < n; i++)
            if (fm_idvec_push(out, s->sym[i]) != 0) return -1;
        return 0;
    }
    /* Long pieces: a heap of candidate pairs. An entry is stale when its left symbol was absorbed, its
     * neighbour changed, or either side was re-merged (a merged token is longer, so its id differs). */
    if (s->heap_cap < n) {
        void *h = realloc(s->heap, n * 2 * sizeof(heap_item));
        if (!h) return -1;
        s->heap = h;
        s->heap_cap = n * 2;
    }
    heap_item *h = s->heap;
    size_t hn = 0;
    for (size_t i = 0; i < n; i++) {
        s->prev[i] = (int32_t)i - 1;
        s->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++) heap_try_push(b, s, h, &hn, (int32_t)i);
    while (hn > 0) {
        heap_item it = heap_pop(h, &hn);
        if (s->sym[it.left] != it.lid || s->next[it.left] != it.right || s->sym[it.right] != it.rid) continue;
        s->sym[it.left] = it.mid;
        s->sym[it.right] = -1; /* dead */
        int32_t nx = s->next[it.right];
        s->next[it.left] = nx;
        if (nx >= 0) s->prev[nx] = it.left;
        s->next[it.right] = -1;
        /* Each merge removes one symbol and pushes at most two pairs, so the heap never exceeds 2n. */
        heap_try_push(b, s, h, &hn, s->prev[it.left]);
        heap_try_push(b, s, h, &hn, it.left);
    }
    for (int32_t i = 0; i >= 0; i = s->next[i])
        if (fm_idvec_push(out, s->sym[i]) != 0) return -1;
    return 0;
}
