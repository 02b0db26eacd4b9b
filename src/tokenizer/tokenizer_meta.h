/* tokenizer_meta.h: writes llama.cpp-compatible tokenizer metadata into a GGUF writer, either the real
 * tokenizer of a Hugging Face model (tokenizer.json + tokenizer_config.json) or a small builtin byte-level
 * vocabulary for tiny synthetic models.
 *
 * Keys written (as llama.cpp's convert_hf_to_gguf.py writes them for Qwen2/Qwen3):
 *   tokenizer.ggml.model = "gpt2", tokenizer.ggml.pre = "qwen2"
 *   tokenizer.ggml.tokens      string[vocab_size]; ids without a token become "[PAD<id>]"
 *   tokenizer.ggml.token_type  int32[vocab_size]; 1 normal, 3 control (added token that is special or looks
 *                              like "<|...|>"), 4 user-defined (other added tokens), 5 unused ([PAD] ids)
 *   tokenizer.ggml.merges      string[], "left right" in GPT-2 spelling, rank = index
 *   tokenizer.ggml.eos_token_id / padding_token_id / bos_token_id (u32), tokenizer.ggml.add_bos_token = false
 *   tokenizer.chat_template    from tokenizer_config.json (the builtin vocabulary carries Qwen3's template)
 * For Qwen3 that gives eos = 151645 <|im_end|>, padding = 151643 <|endoftext|>, and bos = 151643:
 * tokenizer_config has no bos_token, and the real Qwen3 GGUFs take bos 151643 from config.json, which we
 * mirror. */
#ifndef FM_TOKENIZER_META_H
#define FM_TOKENIZER_META_H

#include <stddef.h>

#include "io/gguf.h"

/* tokenizer_json: path of a Hugging Face tokenizer.json (tokenizer_config.json in the same folder is read
 * when present for the chat template and the eos/pad/bos roles), or NULL for the builtin vocabulary.
 * vocab_size is the model's embedding row count: it must be >= the tokenizer's token count; the rest is [PAD]
 * padding. Returns 0, or -1 with one line in err. */
int fm_tokenizer_write_gguf_metadata(gguf_writer *w, const char *tokenizer_json, int vocab_size, char *err,
                                     size_t errlen);

/* Token count of the builtin vocabulary (256 bytes + learned merges + 5 Qwen special tokens): the smallest
 * vocab_size a synthetic model using it may have. Returns -1 only on allocation failure. */
int fm_tokenizer_builtin_n_tokens(void);
/* Tokens of a tokenizer.json (largest id + 1 over the vocabulary and the added tokens), for sizing a model.
 */
int fm_tokenizer_json_n_tokens(const char *tokenizer_json, int *n, char *err, size_t errlen);

#endif
