/* tokenizer.h: the Qwen2/Qwen3 byte-level BPE tokenizer, loaded from a GGUF's llama.cpp tokenizer metadata
 * and exact against Hugging Face `tokenizers` with Qwen3's tokenizer.json.
 *
 * Encoding, in HF's order:
 *   1. invalid UTF-8 in the input is replaced as String::from_utf8_lossy / bytes.decode("utf-8", "replace")
 *      do (one U+FFFD per maximal invalid subpart): HF only takes str, so this is the str our bytes denote;
 *   2. added tokens are cut out of the raw text, leftmost-longest: user-defined ones (type 4: <think>,
 *      <tool_call>, ...) always, control ones (type 3: <|im_start|>, <|endoftext|>, ...) only with
 *      parse_special (llama.cpp's rule; HF's encode_special_tokens=True is the same except that it keeps
 *      matching added tokens HF marks non-special yet llama.cpp marks control because they look like
 *      "<|...|>": <|fim_*|>, <|repo_name|>, <|file_sep|>);
 *   3. each remaining segment is NFC-normalised, split by the Qwen2 regex, and each piece BPE-encoded.
 * No BOS is added (Qwen: add_bos_token = false).
 *
 * A loaded tokenizer is immutable: encode and decode may run on several threads at once. */
#ifndef FM_TOKENIZER_TOKENIZER_H
#define FM_TOKENIZER_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "io/gguf.h"

typedef struct fm_tokenizer fm_tokenizer;

/* llama.cpp token types (tokenizer.ggml.token_type). */
enum {
    FM_TOKEN_NORMAL = 1,
    FM_TOKEN_UNKNOWN = 2,
    FM_TOKEN_CONTROL = 3,
    FM_TOKEN_USER_DEFINED = 4,
    FM_TOKEN_UNUSED = 5,
    FM_TOKEN_BYTE = 6,
};

/* Loads from GGUF metadata only (no tensors are read). Requires tokenizer.ggml.model == "gpt2" and
 * tokenizer.ggml.pre == "qwen2" (a missing pre is refused: llama.cpp would then use the GPT-2 regex, which is
 * not Qwen's), tokenizer.ggml.tokens and tokenizer.ggml.merges; tokenizer.ggml.token_type is optional (all
 * normal when absent). The tokenizer copies what it needs: the gguf_file may be closed afterwards. */
int fm_tokenizer_load_gguf(const gguf_file *f, fm_tokenizer **out, char *err, size_t errlen);
void fm_tokenizer_free(fm_tokenizer *tok);

int32_t fm_tokenizer_n_tokens(const fm_tokenizer *tok);
/* The token's type (FM_TOKEN_*), or 0 for an id out of range. */
int fm_tokenizer_token_type(const fm_tokenizer *tok, int32_t id);
/* The bytes a token stands for (normal tokens: GPT-2 spelling undone; added tokens: their text), not
 * NUL-terminated and not necessarily valid UTF-8 on their own. NULL (and *len = 0) for an id out of range. */
const char *fm_tokenizer_token_bytes(const fm_tokenizer *tok, int32_t id, size_t *len);
/* The id of the token whose bytes are exactly text (e.g. "<|im_end|>"), or -1. */
int32_t fm_tokenizer_find(const fm_tokenizer *tok, const char *text);

/* Encodes text[0..len) into *ids (malloc'ed, caller frees; *n may be 0 with *ids NULL). Returns 0 or -1. */
int fm_tokenizer_encode(const fm_tokenizer *tok, const char *text, size_t len, int parse_special,
                        int32_t **ids, size_t *n, char *err, size_t errlen);
/* Concatenated bytes of the ids (malloc'ed, NUL-terminated, caller frees); raw bytes, no UTF-8 repair. An id
 * out of range is an error. */
int fm_tokenizer_decode(const fm_tokenizer *tok, const int32_t *ids, size_t n, char **out, size_t *len,
                        char *err, size_t errlen);

/* Special ids: -1 when absent. */
int32_t fm_tokenizer_eos(const fm_tokenizer *tok); /* tokenizer.ggml.eos_token_id */
int32_t fm_tokenizer_bos(const fm_tokenizer *tok); /* tokenizer.ggml.bos_token_id (Qwen never adds it) */
/* Stop tokens for generation: eos, eot (when the GGUF names one), <|im_end|> and <|endoftext|> when present,
 * without duplicates. Returns the count; *ids points into the tokenizer. */
int fm_tokenizer_stop_ids(const fm_tokenizer *tok, const int32_t **ids);
int fm_tokenizer_is_stop(const fm_tokenizer *tok, int32_t id);

/* Streaming detokenizer: feeds token bytes in, hands out text that is always valid UTF-8 and never ends
 * inside a character. An incomplete sequence at the end is held back until the next token completes it; bytes
 * that cannot be UTF-8 become U+FFFD, so the concatenated output equals from_utf8_lossy of all bytes (what
 * HF's decode gives). Zero-initialise (or fm_detok_init), fm_detok_free at the end. */
typedef struct {
    uint8_t held[4]; /* incomplete trailing sequence, held back */
    size_t n_held;
    char *buf; /* output of the last call, owned */
    size_t cap;
} fm_detok;
void fm_detok_init(fm_detok *d);
void fm_detok_free(fm_detok *d);
/* Appends token id; returns the newly printable text (valid until the next call) and its length in *len.
 * NULL on an id out of range or out of memory. */
const char *fm_detok_push(fm_detok *d, const fm_tokenizer *tok, int32_t id, size_t *len);
/* The same for raw bytes. */
const char *fm_detok_push_bytes(fm_detok *d, const uint8_t *bytes, size_t n, size_t *len);
/* End of stream: a held incomplete sequence becomes U+FFFD. */
const char *fm_detok_flush(fm_detok *d, size_t *len);

#endif
