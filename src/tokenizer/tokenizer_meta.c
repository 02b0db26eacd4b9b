/* tokenizer_meta.c: tokenizer.json / builtin vocabulary -> GGUF tokenizer metadata (see tokenizer_meta.h).
 * Token strings point into the parsed cJSON tree or the builtin vocabulary while the arrays are handed to
 * the writer, which copies them. */
#include "tokenizer/tokenizer_meta.h"

#include <cjson/cJSON.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/builtin_vocab.h"
#include "tokenizer/chat.h"

enum { TOKEN_NORMAL = 1, TOKEN_CONTROL = 3, TOKEN_USER_DEFINED = 4, TOKEN_UNUSED = 5 };

static char *file_read_all(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fm_set_error(err, errlen, "%s: cannot open", path);
        return NULL;
    }
    char *buf = NULL;
    long n = -1;
    if (fseek(f, 0, SEEK_END) == 0) n = ftell(f);
    if (n >= 0 && fseek(f, 0, SEEK_SET) == 0) buf = malloc((size_t)n + 1);
    if (!buf || fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        fclose(f);
        fm_set_error(err, errlen, "%s: cannot read", path);
        return NULL;
    }
    fclose(f);
    buf[n] = 0;
    if (len) *len = (size_t)n;
    return buf;
}

static cJSON *json_load(const char *path, char *err, size_t errlen) {
    size_t n;
    char *text = file_read_all(path, &n, err, errlen);
    if (!text) return NULL;
    cJSON *j = cJSON_ParseWithLength(text, n);
    free(text);
    if (!j) fm_set_error(err, errlen, "%s: not valid JSON", path);
    return j;
}

/* Pads tokens[n..vocab_size) with "[PAD<id>]" (type unused), as llama.cpp's converter does. The strings are
 * stored in pad_buf (caller frees). */
static int vocab_pad(const char **tokens, int32_t *types, int n, int vocab_size, char **pad_buf) {
    size_t cap = (size_t)(vocab_size - n) * 20 + 1, o = 0;
    char *buf = malloc(cap);
    if (!buf) return -1;
    for (int i = n; i < vocab_size; i++) {
        int k = snprintf(buf + o, cap - o, "[PAD%d]", i);
        tokens[i] = buf + o;
        types[i] = TOKEN_UNUSED;
        o += (size_t)k + 1;
    }
    *pad_buf = buf;
    return 0;
}

static void meta_write_common(gguf_writer *w) {
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "qwen2");
}

static int meta_write_builtin(gguf_writer *w, int vocab_size, char *err, size_t errlen) {
    fm_builtin_vocab v;
    if (fm_builtin_vocab_build(&v, err, errlen) != 0) return -1;
    if (vocab_size < v.n_tokens) {
        int n = v.n_tokens;
        fm_builtin_vocab_free(&v);
        return fm_set_error(err, errlen, "builtin tokenizer: vocab_size %d is smaller than its %d tokens",
                            vocab_size, n);
    }
    const char **tokens = malloc((size_t)vocab_size * sizeof *tokens);
    int32_t *types = malloc((size_t)vocab_size * sizeof *types);
    char *pad = NULL;
    if (!tokens || !types || vocab_pad(tokens, types, v.n_tokens, vocab_size, &pad) != 0) {
        free(tokens);
        free(types);
        fm_builtin_vocab_free(&v);
        return fm_set_error(err, errlen, "builtin tokenizer: out of memory");
    }
    for (int i = 0; i < v.n_tokens; i++) {
        tokens[i] = v.tokens[i];
        types[i] = v.types[i];
    }
    meta_write_common(w);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)vocab_size);
    gguf_writer_set_arr_data(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)vocab_size);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)v.merges, (uint64_t)v.n_merges);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)v.im_end_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)v.endoftext_id);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)v.endoftext_id);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", 0);
    gguf_writer_set_str(w, "tokenizer.chat_template", fm_qwen3_chat_template);
    free(tokens);
    free(types);
    free(pad);
    fm_builtin_vocab_free(&v);
    return 0;
}

/* llama.cpp's does_token_look_special, for the cases a Qwen vocabulary can meet. */
static int token_looks_special(const char *s) {
    size_t n = strlen(s);
    return n >= 4 && memcmp(s, "<|", 2) == 0 && memcmp(s + n - 2, "|>", 2) == 0;
}

/* A config token entry is either a string or {"content": "..."}; NULL when absent or null. */
static const char *config_token_text(const cJSON *cfg, const char *key) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (cJSON_IsString(t)) return t->valuestring;
    if (cJSON_IsObject(t)) {
        const cJSON *c = cJSON_GetObjectItemCaseSensitive(t, "content");
        if (cJSON_IsString(c)) return c->valuestring;
    }
    return NULL;
}

static int token_find(const char **tokens, int n, const char *text) {
    if (!text) return -1;
    for (int i = n - 1; i >= 0; i--) /* special tokens sit at the end */
        if (tokens[i] && strcmp(tokens[i], text) == 0) return i;
    return -1;
}

/* Reads tokenizer_config.json beside path, if there is one; NULL (and no error) when absent. */
static cJSON *config_load_beside(const char *path, char *err, size_t errlen) {
    const char *slash = strrchr(path, '/');
    size_t dir = slash ? (size_t)(slash - path) + 1 : 0;
    char *cfg_path = malloc(dir + sizeof "tokenizer_config.json");
    if (!cfg_path) return NULL;
    memcpy(cfg_path, path, dir);
    memcpy(cfg_path + dir, "tokenizer_config.json", sizeof "tokenizer_config.json");
    cJSON *cfg = NULL;
    FILE *f = fopen(cfg_path, "rb");
    if (f) {
        fclose(f);
        cfg = json_load(cfg_path, err, errlen);
    }
    free(cfg_path);
    return cfg;
}

/* The token count of a parsed tokenizer.json: the largest id + 1 over model.vocab and added_tokens. */
static int json_token_count(const cJSON *root, const char *path, int *count, char *err, size_t errlen) {
    const cJSON *vocab =
        cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(root, "model"), "vocab");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens"), *it;
    if (!cJSON_IsObject(vocab)) return fm_set_error(err, errlen, "%s: no model.vocab object", path);
    int n = 0;
    cJSON_ArrayForEach(it, vocab) {
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= 1e8)
            return fm_set_error(err, errlen, "%s: model.vocab[\"%s\"]: expected an id in [0, 1e8)", path,
                                it->string);
        if (it->valueint + 1 > n) n = it->valueint + 1;
    }
    cJSON_ArrayForEach(it, added) {
        const cJSON *id = cJSON_GetObjectItemCaseSensitive(it, "id");
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(it, "content");
        if (!cJSON_IsNumber(id) || id->valuedouble < 0 || id->valuedouble >= 1e8 || !cJSON_IsString(content))
            return fm_set_error(err, errlen, "%s: added_tokens: expected {\"id\": N, \"content\": \"...\"}",
                                path);
        if (id->valueint + 1 > n) n = id->valueint + 1;
    }
    if (n < 1) return fm_set_error(err, errlen, "%s: the vocabulary is empty", path);
    *count = n;
    return 0;
}

int fm_tokenizer_json_n_tokens(const char *tokenizer_json, int *n, char *err, size_t errlen) {
    cJSON *root = json_load(tokenizer_json, err, errlen);
    if (!root) return -1;
    int rc = json_token_count(root, tokenizer_json, n, err, errlen);
    cJSON_Delete(root);
    return rc;
}

static int meta_write_hf(gguf_writer *w, const char *path, int vocab_size, char *err, size_t errlen) {
    cJSON *root = json_load(path, err, errlen);
    if (!root) return -1;
    const char **tokens = NULL;
    int32_t *types = NULL;
    char **merges = NULL;
    char *pad = NULL, *hole_buf = NULL; /* [PAD] strings, alive until the writer has copied them */
    int n_merges = 0, rc = -1;
    cJSON *cfg = NULL;

    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    const cJSON *jmerges = cJSON_GetObjectItemCaseSensitive(model, "merges");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsString(mtype) || strcmp(mtype->valuestring, "BPE") != 0 || !cJSON_IsObject(vocab) ||
        !cJSON_IsArray(jmerges)) {
        fm_set_error(err, errlen, "%s: expected model.type \"BPE\" with model.vocab and model.merges", path);
        goto done;
    }
    int n = 0;
    const cJSON *it;
    if (json_token_count(root, path, &n, err, errlen)) goto done;
    if (vocab_size < n) {
        fm_set_error(err, errlen, "%s: vocab_size %d is smaller than the tokenizer's %d tokens", path,
                     vocab_size, n);
        goto done;
    }
    tokens = calloc((size_t)vocab_size, sizeof *tokens);
    types = calloc((size_t)vocab_size, sizeof *types);
    if (!tokens || !types || vocab_pad(tokens, types, n, vocab_size, &pad) != 0) goto oom;
    cJSON_ArrayForEach(it, vocab) {
        tokens[it->valueint] = it->string;
        types[it->valueint] = TOKEN_NORMAL;
    }
    cJSON_ArrayForEach(it, added) {
        int id = cJSON_GetObjectItemCaseSensitive(it, "id")->valueint;
        const char *content = cJSON_GetObjectItemCaseSensitive(it, "content")->valuestring;
        int special = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(it, "special"));
        tokens[id] = content;
        types[id] = special || token_looks_special(content) ? TOKEN_CONTROL : TOKEN_USER_DEFINED;
    }
    /* Ids below n that nothing names are holes: [PAD] them as the converter does. */
    int holes = 0;
    for (int i = 0; i < n; i++)
        if (!tokens[i]) holes++;
    if (holes) {
        hole_buf = malloc((size_t)holes * 20);
        if (!hole_buf) goto oom;
        size_t o = 0;
        for (int i = 0; i < n; i++) {
            if (tokens[i]) continue;
            int k = snprintf(hole_buf + o, 20, "[PAD%d]", i);
            tokens[i] = hole_buf + o;
            types[i] = TOKEN_UNUSED;
            o += (size_t)k + 1;
        }
    }

    n_merges = cJSON_GetArraySize(jmerges);
    merges = calloc((size_t)n_merges + 1, sizeof *merges);
    if (!merges) goto oom;
    int m = 0;
    cJSON_ArrayForEach(it, jmerges) {
        if (cJSON_IsString(it)) { /* older format: "left right" */
            merges[m] = strdup(it->valuestring);
        } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                   cJSON_IsString(it->child->next)) {
            size_t la = strlen(it->child->valuestring), lb = strlen(it->child->next->valuestring);
            merges[m] = malloc(la + lb + 2);
            if (merges[m]) {
                memcpy(merges[m], it->child->valuestring, la);
                merges[m][la] = ' ';
                memcpy(merges[m] + la + 1, it->child->next->valuestring, lb + 1);
            }
        } else {
            fm_set_error(err, errlen, "%s: model.merges[%d]: expected \"a b\" or [\"a\", \"b\"]", path, m);
            goto done;
        }
        if (!merges[m++]) goto oom;
    }

    cfg = config_load_beside(path, err, errlen);
    const char *eos_text = cfg ? config_token_text(cfg, "eos_token") : "<|endoftext|>";
    const char *pad_text = cfg ? config_token_text(cfg, "pad_token") : NULL;
    const char *bos_text = cfg ? config_token_text(cfg, "bos_token") : NULL;
    int eos = token_find(tokens, n, eos_text), pad_id = token_find(tokens, n, pad_text);
    int bos = token_find(tokens, n, bos_text);
    if (bos < 0) bos = token_find(tokens, n, "<|endoftext|>"); /* Qwen: config.json's bos_token_id */
    const cJSON *tmpl = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "chat_template") : NULL;
    const cJSON *add_bos = cfg ? cJSON_GetObjectItemCaseSensitive(cfg, "add_bos_token") : NULL;

    meta_write_common(w);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", tokens, (uint64_t)vocab_size);
    gguf_writer_set_arr_data(w, "tokenizer.ggml.token_type", GGUF_TYPE_INT32, types, (uint64_t)vocab_size);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", (const char *const *)merges, (uint64_t)n_merges);
    if (eos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", (uint32_t)eos);
    if (pad_id >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.padding_token_id", (uint32_t)pad_id);
    if (bos >= 0) gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)bos);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", cJSON_IsTrue(add_bos));
    if (cJSON_IsString(tmpl)) gguf_writer_set_str(w, "tokenizer.chat_template", tmpl->valuestring);
    rc = 0;
    goto done;
oom:
    fm_set_error(err, errlen, "%s: out of memory", path);
done:
    if (merges)
        for (int i = 0; i < n_merges; i++) free(merges[i]);
    free(merges);
    free(tokens);
    free(types);
    free(pad);
    free(hole_buf);
    cJSON_Delete(cfg);
    cJSON_Delete(root);
    return rc;
}

int fm_tokenizer_write_gguf_metadata(gguf_writer *w, const char *tokenizer_json, int vocab_size, char *err,
                                     size_t errlen) {
    if (!w) return fm_set_error(err, errlen, "tokenizer metadata: no GGUF writer");
    if (vocab_size <= 0)
        return fm_set_error(err, errlen, "tokenizer metadata: vocab_size %d <= 0", vocab_size);
    if (!tokenizer_json) return meta_write_builtin(w, vocab_size, err, errlen);
    return meta_write_hf(w, tokenizer_json, vocab_size, err, errlen);
}

int fm_tokenizer_builtin_n_tokens(void) {
    fm_builtin_vocab v;
    if (fm_builtin_vocab_build(&v, NULL, 0) != 0) return -1;
    int n = v.n_tokens;
    fm_builtin_vocab_free(&v);
    return n;
}
