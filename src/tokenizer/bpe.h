/* bpe.h: byte-level BPE over token ids. Built from the merge list ("left right" in GPT-2 spelling, rank =
 * index) and a lookup from GPT-2 spelling to id; a piece's bytes start as one byte token each, then the
 * adjacent pair with the lowest merge rank is merged (leftmost first on ties) until no pair has a merge,
 * which is exactly the order of Hugging Face's BPE model. Short pieces use a plain scan; long ones a binary
 * heap of candidate pairs with lazy invalidation, so a 100 kB word costs O(n log n), not O(n^2). */
#ifndef FM_TOKENIZER_BPE_H
#define FM_TOKENIZER_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct fm_bpe fm_bpe;

/* Looks up a token by its GPT-2 spelling s[0..n); returns the id or -1. */
typedef int32_t (*fm_bpe_lookup_fn)(void *ctx, const char *s, size_t n);
/* Returns merge i's text (not NUL-terminated) through *s, *n. */
typedef int (*fm_bpe_merge_fn)(void *ctx, uint64_t i, const char **s, size_t *n);

fm_bpe *fm_bpe_create(uint64_t n_merges, fm_bpe_merge_fn merge_at, fm_bpe_lookup_fn lookup, void *ctx,
                      char *err, size_t errlen);
void fm_bpe_free(fm_bpe *b);

/* A growable id array. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} fm_idvec;
int fm_idvec_push(fm_idvec *a, int32_t id);

/* Per-call working memory (not shared between threads). Zero-initialise; fm_bpe_scratch_free at the end. */
typedef struct {
    int32_t *sym;  /* [cap] token id of each symbol (by original byte index) */
    int32_t *next; /* [cap] index of the next live symbol, or -1 */
    int32_t *prev; /* [cap] index of the previous live symbol, or -1 */
    void *heap;    /* [heap_cap] candidate pairs */
    size_t cap, heap_cap;
} fm_bpe_scratch;
void fm_bpe_scratch_free(fm_bpe_scratch *s);

/* Appends the ids of piece s[0..n) (raw bytes, n >= 1) to out. Returns 0, or -1 on allocation failure. */
int fm_bpe_encode_piece(const fm_bpe *b, const uint8_t *s, size_t n, fm_bpe_scratch *scr, fm_idvec *out);

#endif
