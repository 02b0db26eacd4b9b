/* cmd_synth.c: `flashmap synth target ...` writes a random-weight Qwen3 GGUF (src/model/qwen3_synth.c);
 * `flashmap synth drafter ...` is handed to cmd_synth_drafter. A preset is applied first wherever --preset
 * appears, so explicit options always override it. */
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cli_common.h"
#include "core/error.h"
#include "model/qwen3_synth.h"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: flashmap synth target -o OUT.gguf [options]\n"
        "       flashmap synth drafter ...   (see flashmap synth drafter --help)\n"
        "\n"
        "Writes a Qwen3 dense model with random weights, in llama.cpp's GGUF layout.\n"
        "\n"
        "options:\n"
        "  -o PATH            output file (written to a temporary file, then renamed)\n"
        "  --preset NAME      tiny (default: 2 layers, dim 64, 4/2 heads of 16, ffn 128, f32, untied,\n"
        "                     builtin byte-level vocabulary) or qwen3-4b (36 layers, dim 2560, 32/8 heads\n"
        "                     of 128, ffn 9728, vocab 151936, q8_0, tied)\n"
        "  --layers N         decoder blocks\n"
        "  --dim N            embedding width\n"
        "  --heads N          query heads\n"
        "  --kv-heads N       key/value heads (must divide --heads)\n"
        "  --head-dim N       per-head width (default: the preset's, or dim / heads when --dim or\n"
        "                     --heads is given)\n"
        "  --ffn N            feed-forward width\n"
        "  --vocab N          token table rows (default: the tokenizer's size rounded up as Qwen does,\n"
        "                     151936 for the Qwen3 tokenizer)\n"
        "  --type T           the matrices' type (norms stay f32): f32, f16, bf16, q8_0, q4_0, q5_0,\n"
        "                     q4_k, q5_k or q6_k for every matrix, or llama.cpp's mixes q4_k_m / q5_k_m\n"
        "                     (Q4_K / Q5_K, with Q6_K for the lm_head and for attn_v and ffn_down in the\n"
        "                     first and last eighth of the layers and every third one between). The K\n"
        "                     types need dim, heads * head-dim and ffn to be multiples of 256 (--preset\n"
        "                     qwen3-4b is), q8_0 / q4_0 / q5_0 multiples of 32\n"
        "  --tied, --untied   share the token table as the output head, or write output.weight\n"
        "  --seed N           weights are a pure function of the seed (default 1234)\n"
        "  --ctx N            qwen3.context_length\n"
        "  --tokenizer PATH   a Hugging Face tokenizer.json (default: a builtin byte-level vocabulary)\n"
        "  --threads N        generation threads (default: one per core)\n"
        "  --qk-norm X        q/k norm weights, the sharpness of attention (default 3; reference fixtures\n"
        "                     use 1, where numerical comparisons with other engines are tighter)\n"
        "  -q, --quiet        no progress on stderr\n");
}

typedef struct {
    int tty;
    int last_pct;
    double t0;
} progress_state;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void on_progress(void *ctx, int tensor, int n_tensors, uint64_t done, uint64_t total) {
    progress_state *s = ctx;
    if (total < 100000000) return; /* small models are written in a blink */
    int pct = total ? (int)(100.0 * (double)done / (double)total) : 100;
    if (!s->tty && pct < s->last_pct + 10 && tensor < n_tensors) return; /* a line per 10% in a log */
    s->last_pct = pct;
    fprintf(stderr, "%ssynth: %3d%%  tensor %d/%d  %.2f/%.2f GB  %.1f s%s", s->tty ? "\r" : "", pct, tensor,
            n_tensors, (double)done / 1e9, (double)total / 1e9, now_s() - s->t0, s->tty ? "" : "\n");
    fflush(stderr);
}

static int cmd_synth_target(int argc, char **argv) {
    qwen3_synth_params p;
    qwen3_synth_preset("tiny", &p);
    for (int i = 2; i + 1 < argc; i++) /* the preset first, so later options override it */
        if (!strcmp(argv[i], "--preset")) {
            if (qwen3_synth_preset(argv[i + 1], &p)) {
                fprintf(stderr, "flashmap synth target: unknown preset '%s' (tiny, qwen3-4b)\n", argv[i + 1]);
                return 2;
            }
        }
    const char *out = NULL;
    int head_dim_given = 0, shape_given = 0, quiet = 0;
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        if (!strcmp(a, "--tied") || !strcmp(a, "--untied")) {
            p.tied = !strcmp(a, "--tied");
            continue;
        }
        if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) {
            quiet = 1;
            continue;
        }
        static const char *const with_value[] = {
            "-o",      "--preset", "--layers", "--dim", "--heads",     "--kv-heads", "--head-dim", "--ffn",
            "--vocab", "--type",   "--seed",   "--ctx", "--tokenizer", "--threads",  "--qk-norm"};
        int known = 0;
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
            known |= !strcmp(a, with_value[k]);
        if (!known) {
            fprintf(stderr, "flashmap synth target: unknown option '%s' (try --help)\n", a);
            return 2;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "flashmap synth target: %s needs a value\n", a);
            return 2;
        }
        const char *v = argv[++i];
        long x = 0;
        int bad = 0;
        if (!strcmp(a, "-o"))
            out = v;
        else if (!strcmp(a, "--preset"))
            continue; /* applied above */
        else if (!strcmp(a, "--tokenizer"))
            p.tokenizer_json = v;
        else if (!strcmp(a, "--type")) {
            if (qwen3_synth_parse_type(v, &p)) {
                fprintf(stderr,
                        "flashmap synth target: --type expects f32, f16, bf16, q8_0, q4_0, q5_0, q4_k, q5_k, "
                        "q6_k, "
                        "q4_k_m or q5_k_m, got '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            bad = cli_parse_int("synth target", a, v, 0, LONG_MAX, &x), p.seed = (uint64_t)x;
        } else if (!strcmp(a, "--vocab")) {
            bad = cli_parse_int("synth target", a, v, 1, 1 << 24, &x), p.vocab = (int)x;
        } else if (!strcmp(a, "--ctx")) {
            bad = cli_parse_int("synth target", a, v, 1, INT32_MAX, &x), p.context_length = (int)x;
        } else if (!strcmp(a, "--qk-norm")) {
            char *end;
            p.qk_norm = strtof(v, &end);
            if (*end || !(p.qk_norm > 0 && p.qk_norm <= 100)) {
                fprintf(stderr, "flashmap synth target: --qk-norm expects a number in (0, 100], got '%s'\n",
                        v);
                return 2;
            }
        } else if (!strcmp(a, "--threads")) {
            bad = cli_parse_int("synth target", a, v, 1, 4096, &x), p.n_threads = (int)x;
        } else {
            bad = cli_parse_int("synth target", a, v, 1, 1 << 24, &x);
            if (!strcmp(a, "--layers"))
                p.n_layers = (int)x;
            else if (!strcmp(a, "--dim"))
                p.dim = (int)x, shape_given = 1;
            else if (!strcmp(a, "--heads"))
                p.n_heads = (int)x, shape_given = 1;
            else if (!strcmp(a, "--kv-heads"))
                p.n_kv_heads = (int)x;
            else if (!strcmp(a, "--head-dim"))
                p.head_dim = (int)x, head_dim_given = 1;
            else if (!strcmp(a, "--ffn"))
                p.ffn = (int)x;
        }
        if (bad) return 2;
    }
    if (!out) {
        fprintf(stderr, "flashmap synth target: -o OUT.gguf is required (try --help)\n");
        return 2;
    }
    if (shape_given && !head_dim_given) {
        if (p.dim % p.n_heads) {
            fprintf(stderr, "flashmap synth target: dim %d is not divisible by heads %d (give --head-dim)\n",
                    p.dim, p.n_heads);
            return 2;
        }
        p.head_dim = p.dim / p.n_heads;
    }
    char err[FM_ERROR_LEN];
    if (qwen3_synth_validate(&p, err, sizeof err)) {
        fprintf(stderr, "flashmap: %s\n", err);
        return 2;
    }
    progress_state ps = {isatty(2), -100, now_s()};
    if (!quiet) p.progress = on_progress, p.progress_ctx = &ps;
    if (qwen3_synth_write(&p, out, err, sizeof err)) {
        if (ps.tty && !quiet && ps.last_pct >= 0) fputc('\n', stderr);
        fprintf(stderr, "flashmap: %s\n", err);
        return 1;
    }
    if (!quiet) {
        if (ps.tty && ps.last_pct >= 0) fputc('\n', stderr);
        fprintf(stderr, "synth: wrote %s (%d layers, dim %d, %s, %s) in %.1f s\n", out, p.n_layers, p.dim,
                qwen3_synth_type_name(&p), p.tied ? "tied" : "untied", now_s() - ps.t0);
    }
    return 0;
}

int cmd_synth(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "target")) return cmd_synth_target(argc, argv);
    if (!strcmp(argv[1], "drafter")) return cmd_synth_drafter(argc, argv);
    fprintf(stderr, "flashmap synth: expected 'target' or 'drafter', got '%s' (try --help)\n", argv[1]);
    return 2;
}
