/* chat.h: renders a conversation in the Qwen3 chat format, byte-identical to Hugging Face
 * apply_chat_template with the Qwen3 tokenizer_config.json template (no tools). This is a C rendering of that
 * one template's behaviour, not a Jinja engine:
 *   - a leading system message becomes "<|im_start|>system\n...<|im_end|>\n"; later system messages and all
 *     user messages render as "<|im_start|>ROLE\nCONTENT<|im_end|>\n";
 *   - assistant turns drop their "<think>...</think>" reasoning unless they come after the last real user
 *     query (then the reasoning is kept, re-spelled as "<think>\nR\n</think>\n\n");
 *   - "tool" messages are grouped into one user turn of <tool_response> blocks;
 *   - add_generation_prompt appends "<|im_start|>assistant\n", and with enable_thinking == 0 also
 *     "<think>\n\n</think>\n\n".
 * Messages with any other role render nothing, as in the template. */
#ifndef FM_TOKENIZER_CHAT_H
#define FM_TOKENIZER_CHAT_H

#include <stddef.h>

typedef struct {
    const char *role;              /* "system", "user", "assistant" or "tool" */
    const char *content;           /* NUL-terminated UTF-8; NULL is treated as "" */
    const char *reasoning_content; /* assistant only; NULL = not given (then taken from <think> in content) */
} fm_chat_message;

/* Renders n >= 1 messages into *out (malloc'ed, NUL-terminated; the caller frees). Returns 0, or -1 with err.
 */
int fm_chat_render(const fm_chat_message *msgs, int n, int add_generation_prompt, int enable_thinking,
                   char **out, char *err, size_t errlen);

/* The Jinja text of the Qwen3 chat template (what tokenizer_config.json carries), for GGUF metadata. */
extern const char fm_qwen3_chat_template[];

#endif
