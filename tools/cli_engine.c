#include "cli_engine.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli_common.h"
#include "decode/sampler.h"
#include "io/model_cache.h"

void cli_engine_opts_init(cli_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->device = FM_DEVICE_AUTO;
    o->draft_weights = FM_DRAFT_WEIGHTS_AUTO;
    o->spec = 1;
    o->fallback = 1;
    o->sampling.top_p = 1;
}

uint64_t cli_random_seed(void) {
    uint64_t seed = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&seed, sizeof seed, 1, f) != 1) seed = (uint64_t)time(NULL) * 0x9e3779b97f4a7c15ull;
    if (f) fclose(f);
    return seed & ((1ull << 53) - 1); /* exact in JSON numbers, so a printed seed can be given back */
}

/* The shortest decimal that reads back as f (0.9, not 0.899999976). */
static double short_float(float f) {
    char buf[32];
    for (int digits = 6; digits < 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)f);
        if ((float)strtod(buf, NULL) == f) return strtod(buf, NULL);
    }
    return (double)f;
}

void cli_json_add_sampling(cJSON *obj, const fm_sampling *sp) {
    if (!(sp->temperature > 0 || fm_sampling_penalized(sp))) return; /* greedy, nothing to reproduce */
    cJSON *s = cJSON_AddObjectToObject(obj, "sampling");
    char seed[24];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)sp->seed);
    cJSON_AddNumberToObject(s, "temperature", short_float(sp->temperature));
    cJSON_AddNumberToObject(s, "top_k", sp->top_k);
    cJSON_AddNumberToObject(s, "top_p", short_float(sp->top_p));
    cJSON_AddNumberToObject(s, "min_p", short_float(sp->min_p));
    cJSON_AddRawToObject(s, "seed", seed);
    if (sp->presence_penalty != 0)
        cJSON_AddNumberToObject(s, "presence_penalty", short_float(sp->presence_penalty));
    if (sp->frequency_penalty != 0)
        cJSON_AddNumberToObject(s, "frequency_penalty", short_float(sp->frequency_penalty));
    if (fm_sampling_repeats(sp)) {
        cJSON_AddNumberToObject(s, "repetition_penalty", short_float(sp->repetition_penalty));
        cJSON_AddNumberToObject(s, "repeat_last_n", sp->repeat_last_n);
    }
}

/* The sampling options; same contract as cli_engine_opt. */
static int sampling_opt(const char *cmd, int argc, char **argv, int *i, cli_engine_opts *o) {
    const char *a = argv[*i];
    const int is_temp = !strcmp(a, "--temp") || !strcmp(a, "--temperature"), is_k = !strcmp(a, "--top-k"),
              is_p = !strcmp(a, "--top-p"), is_min = !strcmp(a, "--min-p"), is_seed = !strcmp(a, "--seed"),
              is_presence = !strcmp(a, "--presence-penalty"),
              is_frequency = !strcmp(a, "--frequency-penalty"),
              is_repeat = !strcmp(a, "--repeat-penalty") || !strcmp(a, "--repetition-penalty"),
              is_last_n = !strcmp(a, "--repeat-last-n");
    if (!(is_temp || is_k || is_p || is_min || is_seed || is_presence || is_frequency || is_repeat ||
          is_last_n))
        return 0;
    const char *v = cli_value(cmd, argc, argv, i);
    if (!v) return -1;
    double d;
    long n;
    o->sampling_given |= is_temp || is_k || is_p || is_min;
    if (is_presence || is_frequency) {
        if (cli_parse_double(cmd, a, v, -2, 2, &d)) return -1;
        *(is_presence ? &o->sampling.presence_penalty : &o->sampling.frequency_penalty) = (float)d;
    } else if (is_repeat) {
        if (cli_parse_double(cmd, a, v, 1e-3, 10, &d)) return -1;
        o->sampling.repetition_penalty = o->repeat_off ? 0 : (float)d;
    } else if (is_last_n) {
        if (cli_parse_int(cmd, a, v, -1, 1L << 30, &n)) return -1;
        o->repeat_off = n == 0;
        o->sampling.repeat_last_n = n < 0 ? 0 : (int)n; /* fm_sampling: 0 is the whole sequence */
        if (o->repeat_off) o->sampling.repetition_penalty = 0;
    } else if (is_temp) {
        if (cli_parse_double(cmd, a, v, 0, 100, &d)) return -1;
        o->sampling.temperature = (float)d;
    } else if (is_p || is_min) {
        if (cli_parse_double(cmd, a, v, is_p ? 1e-9 : 0, is_p ? 1 : 0.999999, &d)) return -1;
        *(is_p ? &o->sampling.top_p : &o->sampling.min_p) = (float)d;
    } else if (is_k) {
        if (cli_parse_int(cmd, a, v, 0, 1L << 30, &n)) return -1;
        o->sampling.top_k = (int)n;
    } else {
        if (cli_parse_int(cmd, a, v, 0, (1L << 53) - 1, &n)) return -1;
        o->sampling.seed = (uint64_t)n;
        o->seed_given = 1;
    }
    return 1;
}

/* s among names[0..n) (in the enum's order) -> its index; else a message listing them. */
static int parse_name(const char *cmd, const char *opt, const char *s, const char *const *names, int n,
                      const char *expected, int *out) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s, names[i])) {
            *out = i;
            return 0;
        }
    fprintf(stderr, "flashmap %s: %s expects %s, got '%s'\n", cmd, opt, expected, s);
    return -1;
}

static int parse_count(const char *cmd, const char *opt, const char *s, long lo, long hi, int *out) {
    long n;
    if (cli_parse_int(cmd, opt, s, lo, hi, &n)) return -1;
    *out = (int)n;
    return 0;
}

int cli_engine_opt(const char *cmd, int argc, char **argv, int *i, unsigned flags, cli_engine_opts *o) {
    static const char *const devices[] = {"auto", "cpu", "cuda"};    /* fm_device order */
    static const char *const weights[] = {"auto", "q8_0", "stored"}; /* fm_draft_weights order */
    const char *a = argv[*i];
    if (!(flags & CLI_ENGINE_NO_SAMPLING)) {
        const int r = sampling_opt(cmd, argc, argv, i, o);
        if (r) return r;
    }
    /* Switches. */
    if (!strcmp(a, "--no-spec")) return o->spec = 0, 1;
    if (!strcmp(a, "--no-fallback")) return o->fallback = 0, 1;
    if (!strcmp(a, "--mmap")) return o->keep_mmap = 1, 1;
    /* Options with a value. */
    const int is_model = !strcmp(a, "-m") || !strcmp(a, "--model"),
              is_drafter = !strcmp(a, "-d") || !strcmp(a, "--drafter"),
              is_threads = !strcmp(a, "-t") || !strcmp(a, "--threads"),
              is_ctx = !(flags & CLI_ENGINE_NO_CTX) && !strcmp(a, "--ctx"),
              is_device = !(flags & CLI_ENGINE_NO_DEVICE) && !strcmp(a, "--device"),
              is_weights = !strcmp(a, "--draft-weights"), is_verify = !strcmp(a, "--verify");
    if (!(is_model || is_drafter || is_threads || is_ctx || is_device || is_weights || is_verify)) return 0;
    const char *v = cli_value(cmd, argc, argv, i);
    if (!v) return -1;
    if (is_model) o->model = v;
    if (is_drafter) o->drafter = v;
    if (is_threads && parse_count(cmd, a, v, 1, 1024, &o->threads)) return -1;
    if (is_ctx && parse_count(cmd, a, v, 16, 1 << 20, &o->n_ctx)) return -1;
    if (is_device && parse_name(cmd, a, v, devices, 3, "cpu, cuda or auto", &o->device)) return -1;
    if (is_weights && parse_name(cmd, a, v, weights, 3, "auto, q8_0 or stored", &o->draft_weights)) return -1;
    if (is_verify) {
        if (!strcmp(v, "adaptive"))
            o->verify = 0;
        else if (parse_count(cmd, a, v, 1, FM_MAX_BLOCK, &o->verify))
            return -1;
    }
    return 1;
}

int cli_engine_resolve_defaults(const char *cmd, cli_engine_opts *o) {
    if (o->model) return 0;
    char err[FM_ERRBUF_SIZE];
    if (fm_cache_resolve_default(FM_CACHE_TARGET, o->model_buf, sizeof o->model_buf, err, sizeof err)) {
        fprintf(stderr, "flashmap %s: no -m given and %s\n", cmd, err);
        return -1;
    }
    o->model = o->model_buf;
    if (!o->drafter && o->spec &&
        fm_cache_resolve_default(FM_CACHE_DRAFTER, o->drafter_buf, sizeof o->drafter_buf, err, sizeof err) ==
            0)
        o->drafter = o->drafter_buf;
    return 0;
}

void cli_engine_params(const cli_engine_opts *o, fm_engine_params *ep) {
    fm_engine_params_init(ep);
    ep->model_path = o->model;
    ep->drafter_path = o->spec ? o->drafter : NULL;
    ep->n_threads = o->threads;
    ep->n_ctx = o->n_ctx;
    ep->device = (fm_device)o->device;
    ep->drafter_weights = (fm_draft_weights)o->draft_weights;
    ep->keep_mmap = o->keep_mmap;
}

void cli_print_device_note(const char *cmd, const fm_engine *e) {
    fm_engine_info info;
    fm_engine_get_info(e, &info);
    if (info.device_note) fprintf(stderr, "flashmap %s: note: %s\n", cmd, info.device_note);
}

double cli_prefill_tok_s(const fm_generate_stats *st) {
    return st->prefill_s > 0 ? st->n_prompt / st->prefill_s : 0;
}

double cli_decode_tok_s(const fm_generate_stats *st) {
    return st->decode_s > 0 && st->n_generated > 1 ? (st->n_generated - 1) / st->decode_s : 0;
}

void cli_json_add_decode_stats(cJSON *obj, const fm_generate_stats *st) {
    cJSON_AddNumberToObject(obj, "prefill_s", st->prefill_s);
    cJSON_AddNumberToObject(obj, "decode_s", st->decode_s);
    cJSON_AddNumberToObject(obj, "prefill_tok_s", cli_prefill_tok_s(st));
    cJSON_AddNumberToObject(obj, "decode_tok_s", cli_decode_tok_s(st));
    cJSON_AddNumberToObject(obj, "rounds", st->rounds);
    cJSON_AddNumberToObject(obj, "accepted", st->accepted);
    cJSON_AddNumberToObject(obj, "mean_accepted", st->rounds ? (double)st->accepted / st->rounds : 0);
    cJSON_AddNumberToObject(obj, "plain_steps", st->plain_steps);
    cJSON_AddNumberToObject(obj, "draft_s", st->draft_s);
    cJSON_AddNumberToObject(obj, "verify_s", st->verify_s);
}
