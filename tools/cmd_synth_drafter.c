/* cmd_synth_drafter.c: `flashmap synth drafter -m TARGET.gguf -o OUT.safetensors [...]`: a random FlashMap
 * drafter for the given target (its dim, layer count and vocabulary are read from the GGUF), with
 * config.json written beside it. Defaults are FlashMap-Qwen3-4B's shape. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "cli_common.h"
#include "core/error.h"
#include "drafter/flashmap_drafter.h"
#include "io/gguf.h"

static void usage(FILE *f) {
    fprintf(
        f, "usage: flashmap synth drafter -m TARGET.gguf -o OUT.safetensors [--dim 2048] [--layers 6]\n"
           "         [--heads 16] [--head-dim dim/heads] [--ffn 8192] [--captures 5 | --target-layers "
           "1,9,17,25,33]\n"
           "         [--block 16] [--cond 256] [--time-dim 256] [--seed N] [--type bf16|f16|f32]\n"
           "Writes a random drafter with the FlashMap tensor names and shapes, and config.json beside it.\n");
}

static int parse_layers(const char *s, fm_drafter_synth_params *p) {
    p->n_target_layers = 0;
    const char *c = s;
    while (*c) {
        char *end;
        errno = 0;
        long v = strtol(c, &end, 10);
        if (end == c || errno || v < 0 || v > 100000 || (*end && *end != ',') ||
            p->n_target_layers == FM_DRAFTER_MAX_CAPTURE) {
            fprintf(stderr,
                    "flashmap synth drafter: --target-layers expects up to %d layer numbers like 1,9,17, got "
                    "'%s'\n",
                    FM_DRAFTER_MAX_CAPTURE, s);
            return -1;
        }
        p->target_layers[p->n_target_layers++] = (int)v;
        c = *end ? end + 1 : end;
    }
    if (!p->n_target_layers) {
        fprintf(stderr, "flashmap synth drafter: --target-layers is empty\n");
        return -1;
    }
    return 0;
}

/* The target's dim, layer count and vocabulary from its GGUF. */
static int target_shape(const char *path, int *dim, int *layers, int *vocab) {
    char err[FM_ERROR_LEN];
    gguf_file *g = gguf_open(path, err, sizeof err);
    if (!g) {
        fprintf(stderr, "flashmap synth drafter: %s\n", err);
        return -1;
    }
    uint32_t d = 0, l = 0;
    const gguf_tensor *t = gguf_find_tensor(g, "token_embd.weight");
    int rc = gguf_get_u32(g, "qwen3.embedding_length", &d, err, sizeof err);
    if (!rc) rc = gguf_get_u32(g, "qwen3.block_count", &l, err, sizeof err);
    if (!rc && (!t || t->n_dims != 2))
        rc = fm_set_error(err, sizeof err, "%s: no 2-D token_embd.weight", path);
    if (rc)
        fprintf(stderr, "flashmap synth drafter: %s\n", err);
    else
        *dim = (int)d, *layers = (int)l, *vocab = (int)t->ne[1];
    gguf_close(g);
    return rc;
}

int cmd_synth_drafter(int argc, char **argv) {
    fm_drafter_synth_params p;
    fm_drafter_synth_flashmap_4b(&p);
    const char *model = NULL, *out = NULL;
    int i = 1, head_dim_given = 0;
    if (argc > 1 && !strcmp(argv[1], "drafter")) i = 2; /* called as `synth drafter ...` or `drafter ...` */
    for (; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "flashmap synth drafter: %s needs a value (or is unknown)\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long x = 0;
        int bad = 0;
        if (!strcmp(a, "-m"))
            model = v;
        else if (!strcmp(a, "-o"))
            out = v;
        else if (!strcmp(a, "--dim"))
            bad = cli_parse_int("synth drafter", a, v, 2, 65536, &x), p.dim = (int)x;
        else if (!strcmp(a, "--layers"))
            bad = cli_parse_int("synth drafter", a, v, 1, 256, &x), p.n_layers = (int)x;
        else if (!strcmp(a, "--heads"))
            bad = cli_parse_int("synth drafter", a, v, 1, 1024, &x), p.n_heads = (int)x;
        else if (!strcmp(a, "--head-dim"))
            bad = cli_parse_int("synth drafter", a, v, 2, 1024, &x), p.head_dim = (int)x, head_dim_given = 1;
        else if (!strcmp(a, "--ffn"))
            bad = cli_parse_int("synth drafter", a, v, 1, 1 << 20, &x), p.ffn = (int)x;
        else if (!strcmp(a, "--captures"))
            bad = cli_parse_int("synth drafter", a, v, 1, FM_DRAFTER_MAX_CAPTURE, &x), p.n_capture = (int)x;
        else if (!strcmp(a, "--target-layers"))
            bad = parse_layers(v, &p);
        else if (!strcmp(a, "--block"))
            bad = cli_parse_int("synth drafter", a, v, 1, FM_DRAFTER_MAX_BLOCK, &x), p.block = (int)x;
        else if (!strcmp(a, "--cond"))
            bad = cli_parse_int("synth drafter", a, v, 1, 65536, &x), p.cond_dim = (int)x;
        else if (!strcmp(a, "--time-dim"))
            bad = cli_parse_int("synth drafter", a, v, 2, 65536, &x), p.time_dim = (int)x;
        else if (!strcmp(a, "--seed"))
            bad = cli_parse_int("synth drafter", a, v, 0, 0x7fffffffL, &x), p.seed = (uint64_t)x;
        else if (!strcmp(a, "--type")) {
            if (fm_dtype_parse(v, &p.dtype) || p.dtype == FM_DTYPE_Q8_0) {
                fprintf(stderr, "flashmap synth drafter: --type expects bf16, f16 or f32, got '%s'\n", v);
                bad = -1;
            }
        } else {
            fprintf(stderr, "flashmap synth drafter: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        }
        if (bad) return 2;
    }
    if (!model || !out) {
        fprintf(stderr, "flashmap synth drafter: -m TARGET.gguf and -o OUT.safetensors are required\n");
        return 2;
    }
    if (!head_dim_given && p.n_heads > 0 && p.dim % p.n_heads == 0) p.head_dim = p.dim / p.n_heads;
    if (p.n_heads * p.head_dim != p.dim) {
        fprintf(stderr, "flashmap synth drafter: --heads %d x --head-dim %d must equal --dim %d\n", p.n_heads,
                p.head_dim, p.dim);
        return 2;
    }
    int dim, layers, vocab;
    if (target_shape(model, &dim, &layers, &vocab)) return 1;
    char err[FM_ERROR_LEN];
    clock_t t0 = clock();
    if (fm_drafter_synth(&p, dim, layers, vocab, out, err, sizeof err)) {
        fprintf(stderr, "flashmap synth drafter: %s\n", err);
        return 1;
    }
    fprintf(stderr, "flashmap synth drafter: wrote %s (dim %d, %d layers, target dim %d) in %.1f s CPU\n",
            out, p.dim, p.n_layers, dim, (double)(clock() - t0) / CLOCKS_PER_SEC);
    return 0;
}
