/* cmd_generate.c: `flashmap generate`: prompt in, the target's greedy continuation out (streamed), plain or
 * speculative; --json prints one object instead (ids, text, stats, and with --trace every round). */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cli_common.h"
#include "cli_engine.h"
#include "decode/sampler.h"
#include "flashmap.h"
#include "io/model_cache.h"

#define CMD "generate"

typedef struct {
    cli_engine_opts eng;
    const char *prompt, *prompt_file, *prompt_ids, *system;
    int n_predict, chat, think, json, trace, ignore_eos;
    double sim_mean;
} gen_opts;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: flashmap generate [-m TARGET.gguf] [-d DRAFTER] (-p TEXT | -f FILE | --prompt-ids 1,2,3)\n"
        "                         [-n N] [-t THREADS] [--ctx N] [--chat [--system TEXT] [--no-think]]\n"
        "                         [--no-spec] [--verify adaptive|K] [--no-fallback] [--device cpu|cuda]\n"
        "                         [--draft-weights auto|q8_0|stored] [--mmap] [--json] [--trace]\n"
        "                         [--temp T] [--top-k N] [--top-p P] [--min-p P] [--seed N]\n"
        "                         [--ignore-eos] [--simulate MEAN]\n\n"
        "  -m PATH           target model (Qwen3 dense GGUF); default: the cached pinned Qwen3-4B "
        "(flashmap pull)\n"
        "  -d PATH           FlashMap drafter (.safetensors or a folder with model.safetensors); enables\n"
        "                    speculative decoding. Default with neither -m nor -d: the cached pinned "
        "drafter\n"
        "  -p TEXT, -f FILE  prompt text (special tokens such as <|im_start|> are recognised)\n"
        "  --prompt-ids L    prompt as comma-separated token ids\n"
        "  -n N              new tokens at most (default 128)\n"
        "  -t N              threads (default: all cores)\n"
        "  --ctx N           KV cache size in tokens (default 4096)\n"
        "  --chat            wrap the prompt in the Qwen3 chat template as the user message\n"
        "  --system TEXT     system message (with --chat)\n"
        "  --no-think        add the empty think block (Qwen3 enable_thinking=False)\n"
        "  --no-spec         plain decoding even with a drafter\n"
        "  --verify MODE     drafts verified per round: adaptive (the width with the most tokens per ms,\n"
        "                    from measured costs and acceptance) or a fixed K\n"
        "  --no-fallback     never fall back to plain steps when drafting loses\n"
        "  --draft-weights W the drafter's matrices (CPU and CUDA): auto/q8_0 = a Q8_0 copy made at load\n"
        "                    (faster drafts), stored = as in the file (BF16); the output is the same\n"
        "  --mmap            CPU: read the weights from the file mapping (faster start) instead of copying\n"
        "                    them into huge pages at load (~8%% faster steps)\n"
        "  --json            print one JSON object (prompt_ids, tokens, text, stats) instead of text\n"
        "  --trace           with --json: every speculative round (pos, anchor, drafted, verified, "
        "accepted)\n" CLI_SAMPLING_HELP "  --ignore-eos      do not stop at stop tokens\n"
        "  --simulate MEAN   SIMULATED acceptance for benchmarks: decode plainly first, then replace the\n"
        "                    drafts by the known continuation for k ~ Binomial(16, MEAN/16) tokens per "
        "round\n"
        "                    (drawn with --seed, default 1)\n");
}

static int parse(int argc, char **argv, gen_opts *o) {
    memset(o, 0, sizeof *o);
    o->n_predict = 128;
    o->think = 1;
    cli_engine_opts_init(&o->eng);
    o->sim_mean = -1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        const int engine = cli_engine_opt(CMD, argc, argv, &i, 0, &o->eng);
        if (engine < 0) return -1;
        if (engine) continue;
#define VALUE()                                                                                              \
    if (!(v = cli_value(CMD, argc, argv, &i))) return -1
        if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) {
            VALUE();
            o->prompt = v;
        } else if (!strcmp(a, "-f") || !strcmp(a, "--file")) {
            VALUE();
            o->prompt_file = v;
        } else if (!strcmp(a, "--prompt-ids")) {
            VALUE();
            o->prompt_ids = v;
        } else if (!strcmp(a, "--system")) {
            VALUE();
            o->system = v;
        } else if (!strcmp(a, "-n") || !strcmp(a, "--n-predict")) {
            VALUE();
            if (cli_parse_int(CMD, a, v, 1, 1 << 20, &n)) return -1;
            o->n_predict = (int)n;
        } else if (!strcmp(a, "--simulate")) {
            VALUE();
            if (cli_parse_double(CMD, a, v, 0, 32, &o->sim_mean)) return -1;
        } else if (!strcmp(a, "--chat")) {
            o->chat = 1;
        } else if (!strcmp(a, "--no-think")) {
            o->think = 0;
        } else if (!strcmp(a, "--json")) {
            o->json = 1;
        } else if (!strcmp(a, "--trace")) {
            o->trace = 1;
        } else if (!strcmp(a, "--ignore-eos")) {
            o->ignore_eos = 1;
        } else {
            fprintf(stderr, "flashmap %s: unknown option '%s' (see --help)\n", CMD, a);
            return -1;
        }
#undef VALUE
    }
    int sources = !!o->prompt + !!o->prompt_file + !!o->prompt_ids;
    if (sources != 1) {
        fprintf(stderr, "flashmap %s: give exactly one of -p TEXT, -f FILE or --prompt-ids (see --help)\n",
                CMD);
        return -1;
    }
    if (o->chat && o->prompt_ids) {
        fprintf(stderr, "flashmap %s: --chat needs a text prompt (-p or -f), not --prompt-ids\n", CMD);
        return -1;
    }
    if (o->trace && !o->json) {
        fprintf(stderr, "flashmap %s: --trace goes with --json\n", CMD);
        return -1;
    }
    return 0;
}

/* Builds the prompt ids from --prompt-ids, or the text (wrapped in the chat template with --chat). */
static int prompt_ids(fm_engine *e, const gen_opts *o, int32_t **ids, int *n) {
    if (o->prompt_ids) return cli_parse_id_list(CMD, "--prompt-ids", o->prompt_ids, ids, n);
    char *text = NULL, err[FM_ERRBUF_SIZE];
    size_t len = 0;
    if (o->prompt_file) {
        if (cli_read_file(CMD, o->prompt_file, &text, &len)) return -1;
    } else {
        text = strdup(o->prompt);
        len = strlen(text);
    }
    if (o->chat) {
        fm_message msgs[2];
        int k = 0;
        if (o->system) msgs[k++] = (fm_message){"system", o->system};
        msgs[k++] = (fm_message){"user", text};
        char *rendered = NULL;
        if (fm_format_chat(msgs, k, o->think, &rendered, err, sizeof err)) {
            fprintf(stderr, "flashmap %s: %s\n", CMD, err);
            free(text);
            return -1;
        }
        free(text);
        text = rendered;
        len = strlen(text);
    }
    size_t n_ids = 0;
    int rc = fm_tokenize(e, text, len, 1, ids, &n_ids, err, sizeof err);
    free(text);
    if (rc) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        return -1;
    }
    if (n_ids == 0) {
        fprintf(stderr, "flashmap %s: the prompt is empty\n", CMD);
        free(*ids);
        return -1;
    }
    *n = (int)n_ids;
    return 0;
}

/* Streams token text to stdout as it is produced (never half a UTF-8 character). */
static int stream_tokens(void *user, const int32_t *ids, int n) {
    fm_text_stream *ts = user;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *t = fm_text_stream_push(ts, ids[i], &len);
        if (t) fwrite(t, 1, len, stdout);
    }
    fflush(stdout);
    return 0;
}

static const char *stop_name(fm_stop_reason r) {
    switch (r) {
    case FM_STOP_LENGTH:
        return "length";
    case FM_STOP_TOKEN:
        return "stop token";
    case FM_STOP_CONTEXT:
        return "context full";
    default:
        return "none";
    }
}

static void print_stats(const fm_generate_stats *st, int spec, const fm_sampling *sp) {
    fprintf(stderr, "prompt %d tok | prefill %.1f tok/s | decode %.2f tok/s | %d new tok", st->n_prompt,
            cli_prefill_tok_s(st), cli_decode_tok_s(st), st->n_generated);
    if (spec)
        fprintf(stderr, " | rounds %d, mean accepted %.2f, plain steps %d | draft %.0f%% verify %.0f%%%s",
                st->rounds, st->rounds ? (double)st->accepted / st->rounds : 0, st->plain_steps,
                st->decode_s > 0 ? 100 * st->draft_s / (st->prefill_s + st->decode_s) : 0,
                st->decode_s > 0 ? 100 * st->verify_s / (st->prefill_s + st->decode_s) : 0,
                st->simulated ? " | SIMULATED acceptance" : "");
    if (sp->temperature > 0) fprintf(stderr, " | sampled, seed %llu", (unsigned long long)sp->seed);
    fprintf(stderr, " | stop: %s\n", stop_name(st->stop));
}

static cJSON *ids_json(const int32_t *ids, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber(ids[i]));
    return a;
}

static void print_json(fm_engine *e, const int32_t *prompt, int n_prompt, const int32_t *toks, int n_toks,
                       const fm_generate_stats *st, const fm_round_trace *tr, int n_tr, int spec,
                       const fm_sampling *sp) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddItemToObject(root, "prompt_ids", ids_json(prompt, n_prompt));
    cJSON_AddItemToObject(root, "tokens", ids_json(toks, n_toks));
    char *text = NULL, err[FM_ERRBUF_SIZE];
    size_t len = 0;
    if (fm_detokenize(e, toks, (size_t)n_toks, &text, &len, err, sizeof err))
        text = NULL;                            /* ids-only model */
    cli_json_add_text(root, "text", text, len); /* the text may hold NUL bytes */
    free(text);
    cJSON *s = cJSON_AddObjectToObject(root, "stats");
    cJSON_AddNumberToObject(s, "prompt_tokens", st->n_prompt);
    cJSON_AddNumberToObject(s, "new_tokens", st->n_generated);
    cJSON_AddBoolToObject(s, "speculative", spec);
    cli_json_add_decode_stats(s, st);
    cJSON_AddBoolToObject(s, "simulated", st->simulated);
    cJSON_AddStringToObject(s, "stop", stop_name(st->stop));
    cli_json_add_sampling(s, sp);
    if (tr) {
        cJSON *rounds = cJSON_AddArrayToObject(root, "rounds");
        for (int i = 0; i < n_tr; i++) {
            cJSON *r = cJSON_CreateObject();
            cJSON_AddNumberToObject(r, "pos", tr[i].pos);
            cJSON_AddNumberToObject(r, "anchor", tr[i].anchor);
            cJSON_AddItemToObject(r, "drafted", ids_json(tr[i].drafted, tr[i].n_drafted));
            cJSON_AddNumberToObject(r, "verified", tr[i].verified);
            cJSON_AddNumberToObject(r, "accepted", tr[i].accepted);
            cJSON_AddItemToArray(rounds, r);
        }
    }
    char *out = cJSON_PrintUnformatted(root);
    if (out) printf("%s\n", out);
    free(out);
    cJSON_Delete(root);
}

int cmd_generate(int argc, char **argv) {
    gen_opts o;
    if (parse(argc, argv, &o)) return 2;
    char err[FM_ERRBUF_SIZE];
    if (cli_engine_resolve_defaults(CMD, &o.eng)) return 1;
    fm_engine_params ep;
    cli_engine_params(&o.eng, &ep);
    fm_engine *e = NULL;
    if (fm_engine_load(&ep, &e, err, sizeof err)) {
        fprintf(stderr, "flashmap %s: %s\n", CMD, err);
        return 1;
    }
    cli_print_device_note(CMD, e);
    int32_t *prompt = NULL, *toks = NULL, *future = NULL;
    int n_prompt = 0, n_toks = 0, n_future = 0, rc = 1, n_trace = 0;
    fm_session *s = NULL;
    fm_round_trace *trace = NULL;
    fm_text_stream *ts = fm_text_stream_create(e);
    fm_generate_stats st;
    if (prompt_ids(e, &o, &prompt, &n_prompt)) goto done;
    if (fm_session_create(e, &s, err, sizeof err)) goto fail;
    fm_generate_params gp;
    fm_generate_params_init(&gp);
    gp.max_new_tokens = o.n_predict;
    gp.speculative = o.eng.spec && o.eng.drafter;
    gp.verify = o.eng.verify;
    gp.fallback = o.eng.fallback;
    gp.ignore_stop = o.ignore_eos;
    gp.sampling = o.eng.sampling;
    if (gp.sampling.temperature > 0 && !o.eng.seed_given) gp.sampling.seed = cli_random_seed();
    if (o.sim_mean >= 0) {
        if (!gp.speculative) {
            fprintf(stderr, "flashmap %s: --simulate needs a drafter (-d)\n", CMD);
            goto done;
        }
        /* The known continuation: a plain pass first, then the same prompt speculatively. */
        fm_generate_params plain = gp;
        plain.speculative = 0;
        if (fm_session_generate(s, prompt, n_prompt, &plain, &future, &n_future, NULL, err, sizeof err))
            goto fail;
        fm_session_reset(s);
        gp.sim_future = future;
        gp.sim_future_len = n_future;
        gp.sim_mean = o.sim_mean;
        gp.sim_seed = o.eng.seed_given ? o.eng.sampling.seed : 1;
        gp.fallback = 0; /* simulated rounds measure drafting itself */
    }
    if (o.trace) {
        gp.trace_cap = o.n_predict + 1;
        trace = calloc((size_t)gp.trace_cap, sizeof *trace);
        gp.trace = trace;
        gp.n_trace = &n_trace;
    }
    if (!o.json) {
        gp.on_tokens = stream_tokens;
        gp.user = ts;
    }
    if (fm_session_generate(s, prompt, n_prompt, &gp, &toks, &n_toks, &st, err, sizeof err)) goto fail;
    if (o.json) {
        print_json(e, prompt, n_prompt, toks, n_toks, &st, trace, n_trace, gp.speculative, &gp.sampling);
    } else {
        size_t len = 0;
        const char *tail = ts ? fm_text_stream_flush(ts, &len) : NULL;
        if (tail) fwrite(tail, 1, len, stdout);
        printf("\n");
    }
    print_stats(&st, gp.speculative, &gp.sampling);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "flashmap %s: %s\n", CMD, err);
done:
    free(prompt);
    free(toks);
    free(future);
    free(trace);
    fm_text_stream_free(ts);
    fm_session_free(s);
    fm_engine_free(e);
    return rc;
}
