/* builtin_vocab.h: a small byte-level BPE vocabulary for tiny synthetic models, so they have a working
 * tokenizer without the real Qwen3 files. Layout (ids):
 *   0..255                 the 256 byte tokens, id = byte value, spelled in GPT-2 byte-to-unicode form
 *   256..256+n_merges-1    one token per merge, learned deterministically from a fixed English text
 *   then                   <|endoftext|>, <|im_start|>, <|im_end|>, <think>, </think>
 * The result is identical on every run and machine. */
#ifndef FM_TOKENIZER_BUILTIN_VOCAB_H
#define FM_TOKENIZER_BUILTIN_VOCAB_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int n_tokens;   /* bytes + merges + specials */
    char **tokens;  /* [n_tokens] NUL-terminated GPT-2 spellings (specials as plain text) */
    int32_t *types; /* [n_tokens] llama.cpp token types: 1 normal, 3 control, 4 user-defined */
    int n_merges;
    char **merges; /* [n_merges] "left right", rank = index */
    int32_t endoftext_id, im_start_id, im_end_id, think_id, think_end_id;
} fm_builtin_vocab;

int fm_builtin_vocab_build(fm_builtin_vocab *v, char *err, size_t errlen);
void fm_builtin_vocab_free(fm_builtin_vocab *v);

#endif
