/* cmd_chat.c: `flashmap chat`: an interactive conversation that keeps its KV cache (and the drafter's
 * context) across turns, so each turn prefills only the new user message.
 *
 * Turn text: the first turn is the Qwen3 template of [system?, user] with the assistant prompt; a later turn
 * is
 * "\n" (closing the previous assistant turn after its <|im_end|>) plus the template of [user] alone. The
 * cache keeps the assistant's replies as generated (thinking included), as llama.cpp's chat does; the
 * template itself would drop earlier thinking when re-rendering the whole history. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "cli_common.h"
#include "cli_engine.h"
#include "flashmap.h"

#define CMD "chat"

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: flashmap chat [-m TARGET.gguf] [-d DRAFTER] [--system TEXT] [--no-think] [-n N] [-t N]\n"
        "                     [--ctx N] [--no-spec] [--verify adaptive|K] [--no-fallback]\n"
        "                     [--device cpu|cuda|auto] [--draft-weights auto|q8_0|stored] [--mmap]\n"
        "                     [--temp T] [--top-k N] [--top-p P] [--min-p P] [--seed N]\n\n"
        "Reads one user message per line from stdin; an empty line or end of input ends the chat.\n"
        "The KV cache (and the drafter's context) carries over between turns. -n N caps each reply\n"
        "(default 1024); the other options are generate's (see flashmap generate --help); without -m:\n"
        "the cached pinned models (flashmap pull).\n\n"
        "Unlike generate, chat samples by default with Qwen3's suggested settings: --temp 0.6 --top-k 20\n"
        "--top-p 0.95, or with --no-think --temp 0.7 --top-k 20 --top-p 0.8 (greedy decoding can repeat\n"
        "itself in thinking mode). Any of --temp, --top-k, --top-p, --min-p replaces them all (--seed and\n"
        "the penalties do not); --temp 0 is greedy.\n");
}

static int print_tokens(void *user, const int32_t *ids, int n) {
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *t = fm_text_stream_push(user, ids[i], &len);
        if (t) fwrite(t, 1, len, stdout);
    }
    fflush(stdout);
    return 0;
}

int cmd_chat(int argc, char **argv) {
    cli_engine_opts eo;
    cli_engine_opts_init(&eo);
    const char *system = NULL;
    long n_predict = 1024;
    int think = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        }
        const int engine = cli_engine_opt(CMD, argc, argv, &i, 0, &eo);
        if (engine < 0) return 2;
        if (engine) continue;
        if (!strcmp(a, "--no-think")) {
            think = 0;
        } else if (!strcmp(a, "--system") || !strcmp(a, "-n")) {
            if (!(v = cli_value(CMD, argc, argv, &i))) return 2;
            if (!strcmp(a, "--system"))
                system = v;
            else if (cli_parse_int(CMD, a, v, 1, 1 << 20, &n_predict))
                return 2;
        } else {
            fprintf(stderr, "flashmap %s: unknown option '%s' (see --help)\n", CMD, a);
            return 2;
        }
    }
    if (cli_engine_resolve_defaults(CMD, &eo)) return 1;
    char err[FM_ERRBUF_SIZE];
    fm_engine_params ep;
    cli_engine_params(&eo, &ep);
    fm_engine *e = NULL;
    fm_session *s = NULL;
    if (fm_engine_load(&ep, &e, err, sizeof err) || fm_session_create(e, &s, err, sizeof err)) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        fm_engine_free(e);
        return 1;
    }
    cli_print_device_note(CMD, e);
    fm_generate_params gp;
    fm_generate_params_init(&gp);
    gp.max_new_tokens = (int)n_predict;
    gp.speculative = eo.spec && eo.drafter;
    gp.verify = eo.verify;
    gp.fallback = eo.fallback;
    gp.sampling = eo.sampling;
    if (!eo.sampling_given) {
        /* The penalties stay the command line's. */
        gp.sampling.temperature = think ? 0.6f : 0.7f;
        gp.sampling.top_k = 20;
        gp.sampling.top_p = think ? 0.95f : 0.8f;
        gp.sampling.min_p = 0;
    }
    if (gp.sampling.temperature > 0 && !eo.seed_given) gp.sampling.seed = cli_random_seed();
    gp.on_tokens = print_tokens;
    const int tty = isatty(0);
    if (gp.sampling.temperature > 0)
        fprintf(stderr,
                "sampling: temperature %g, top-k %d, top-p %g, min-p %g, seed %llu (--temp 0: greedy)\n",
                (double)gp.sampling.temperature, gp.sampling.top_k, (double)gp.sampling.top_p,
                (double)gp.sampling.min_p, (unsigned long long)gp.sampling.seed);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    for (int turn = 0;; turn++) {
        if (tty) fprintf(stderr, "> ");
        ssize_t got = getline(&line, &cap, stdin);
        if (got <= 0) break;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        if (got == 0) break;
        fm_message msgs[2];
        int k = 0;
        if (turn == 0 && system) msgs[k++] = (fm_message){"system", system};
        msgs[k++] = (fm_message){"user", line};
        char *rendered = NULL;
        if (fm_format_chat(msgs, k, think, &rendered, err, sizeof err)) goto fail;
        size_t len = strlen(rendered) + 2;
        char *text = malloc(len);
        snprintf(text, len, "%s%s", turn ? "\n" : "", rendered);
        free(rendered);
        int32_t *ids = NULL;
        size_t n_ids = 0;
        int bad = fm_tokenize(e, text, strlen(text), 1, &ids, &n_ids, err, sizeof err);
        free(text);
        if (bad) goto fail;
        fm_text_stream *ts = fm_text_stream_create(e);
        gp.user = ts;
        fm_generate_stats st;
        bad = fm_session_generate(s, ids, (int)n_ids, &gp, NULL, NULL, &st, err, sizeof err);
        free(ids);
        size_t tail_len = 0;
        const char *tail = fm_text_stream_flush(ts, &tail_len);
        if (tail) fwrite(tail, 1, tail_len, stdout);
        fm_text_stream_free(ts);
        printf("\n");
        fflush(stdout);
        if (bad) goto fail;
        fm_engine_info info;
        fm_engine_get_info(e, &info);
        fprintf(stderr, "[%d new tok, %.2f tok/s, context %d/%d]\n", st.n_generated, cli_decode_tok_s(&st),
                fm_session_pos(s), info.n_ctx);
    }
    goto done;
fail:
    fprintf(stderr, "flashmap %s: %s\n", CMD, err);
    rc = 1;
done:
    free(line);
    fm_session_free(s);
    fm_engine_free(e);
    return rc;
}
