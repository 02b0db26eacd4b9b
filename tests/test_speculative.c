/* test_speculative.c: losslessness. Speculative output must equal plain output token for token, greedy or
 * sampled with the same seed (temperatures, top-k, top-p, min-p, presence, frequency and repetition
 * penalties drawn per case), for random tiny models
 * (several weight types, tied and untied), random prompts, every verify mode, fallback on and off, extra stop
 * tokens, token limits from 1 to 200 and small context limits; and under simulated acceptance, where rounds
 * accept anything from 0 to all 16 drafts. A session cut back to a prefix of its
 * conversation (fm_session_truncate, the server's prompt cache) then continued gives what a fresh session
 * gives the whole prompt. Models come from `flashmap synth`. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashmap.h"
#include "test_util.h"

typedef struct {
    const char *type, *tie;
    int kv_heads, seed;
} model_spec;

/* The K-quants need every product's input length a multiple of 256: dim, the heads' width and ffn. */
static const char *const SHAPE_SMALL = "--dim 64 --heads 4 --head-dim 16 --ffn 128",
                         *const SHAPE_K = "--dim 256 --heads 4 --head-dim 64 --ffn 256",
                         /* Every product's input a multiple of 512: on an AVX-512 VNNI CPU the engine
                          * repacks these Q8_0 matrices (fm_matrix_repack_vnni4), the drafter's too. */
                             *const SHAPE_VNNI4 = "--dim 512 --heads 4 --head-dim 128 --ffn 1024";

static const model_spec MODELS[] = {
    {"f32", "--tied", 2, 11},    {"q8_0", "--tied", 1, 12},   {"bf16", "--untied", 4, 13},
    {"f16", "--untied", 2, 14},  {"q4_k_m", "--tied", 2, 15}, {"q6_k", "--untied", 1, 16},
    {"q5_0", "--untied", 2, 17}, {"q8_0", "--tied", 2, 18}, /* the last one in SHAPE_VNNI4 */
};
enum { N_MODELS = sizeof MODELS / sizeof MODELS[0], N_CASES_PER_MODEL = 60 };

static uint64_t rng_state = 0x1234567;
static uint32_t rnd(uint32_t n) {
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng_state >> 33) % n;
}

static int run(const char *cmd) {
    int rc = system(cmd);
    if (rc != 0) fprintf(stderr, "command failed (%d): %s\n", rc, cmd);
    return rc;
}

/* Writes a tiny target + drafter pair; returns 0 on success. */
static int synth_pair(const model_spec *m, char *target, char *drafter, size_t len) {
    const char *cli = getenv("FM_CLI");
    if (!cli) {
        fprintf(stderr, "FM_CLI is not set (run through ctest)\n");
        return -1;
    }
    snprintf(target, len, "%s/spec_target_%s_%d.gguf", fm_test_tmpdir(), m->type, m->seed);
    snprintf(drafter, len, "%s/spec_drafter_%s_%d", fm_test_tmpdir(), m->type, m->seed);
    char cmd[16384];
    const int wide = m == &MODELS[N_MODELS - 1];
    snprintf(cmd, sizeof cmd,
             "'%s' synth target -o '%s' --layers 3 %s --kv-heads %d --type %s %s --seed %d >/dev/null 2>&1",
             cli, target,
             wide                    ? SHAPE_VNNI4
             : strstr(m->type, "_k") ? SHAPE_K
                                     : SHAPE_SMALL,
             m->kv_heads, m->type, m->tie, m->seed);
    if (run(cmd)) return -1;
    snprintf(cmd, sizeof cmd,
             "mkdir -p '%s' && '%s' synth drafter -m '%s' -o '%s/model.safetensors' --layers 2 %s "
             "--target-layers 0,2 --seed %d >/dev/null 2>&1",
             drafter, cli, target, drafter, wide ? SHAPE_VNNI4 : SHAPE_SMALL, m->seed);
    return run(cmd);
}

typedef struct {
    int32_t *ids;
    int n;
    fm_stop_reason stop;
} result;

static int generate(fm_engine *e, const int32_t *prompt, int n_prompt, const fm_generate_params *p, result *r,
                    fm_generate_stats *st) {
    char err[FM_ERRBUF_SIZE];
    fm_session *s = NULL;
    if (fm_session_create(e, &s, err, sizeof err)) {
        fprintf(stderr, "session: %s\n", err);
        return -1;
    }
    fm_generate_stats local;
    if (!st) st = &local;
    int rc = fm_session_generate(s, prompt, n_prompt, p, &r->ids, &r->n, st, err, sizeof err);
    if (rc) fprintf(stderr, "generate: %s\n", err);
    r->stop = st->stop;
    fm_session_free(s);
    return rc;
}

static int same(const result *a, const result *b) {
    return a->n == b->n && a->stop == b->stop && !memcmp(a->ids, b->ids, (size_t)a->n * sizeof *a->ids);
}

/* A conversation of prompt + reply, cut to k tokens, then continued by a new tail, must give the reply of a
 * fresh session to conversation[0..k) + tail: the kept KV rows and drafter context must be as good as new,
 * and so must the tokens the repetition penalty reads (on in about half the cases). */
static int g_truncate_repeated;
static int check_truncate(fm_engine *e, const fm_engine_info *info, const char *model, int n_cases) {
    char err[FM_ERRBUF_SIZE];
    fm_session *s = NULL;
    if (fm_session_create(e, &s, err, sizeof err)) return -1;
    int checked = 0;
    for (int c = 0; c < n_cases; c++) {
        int32_t conv[256];
        int n_conv = 1 + (int)rnd(40);
        for (int i = 0; i < n_conv; i++) conv[i] = (int32_t)rnd((uint32_t)info->vocab);
        fm_generate_params p;
        fm_generate_params_init(&p);
        p.ignore_stop = 1;
        p.speculative = (int)rnd(2);
        p.verify = (int)rnd(3) * 7; /* adaptive, 7, 14 */
        p.max_new_tokens = 1 + (int)rnd(60);
        if (rnd(2)) {
            p.sampling.repetition_penalty = 1.5f;
            p.sampling.repeat_last_n = (int)rnd(2) * 8;
            g_truncate_repeated++;
        }
        result first = {0}, cont = {0}, fresh = {0};
        fm_session_reset(s);
        fm_generate_stats st;
        if (fm_session_generate(s, conv, n_conv, &p, &first.ids, &first.n, &st, err, sizeof err)) break;
        memcpy(conv + n_conv, first.ids, (size_t)first.n * sizeof *conv);
        n_conv += first.n;
        CHECK_MSG(fm_session_pos(s) == n_conv, "%s: session holds %d tokens, conversation %d", model,
                  fm_session_pos(s), n_conv);
        CHECK(fm_session_truncate(s, n_conv + 1, err, sizeof err) != 0 && strstr(err, "cannot keep"));
        const int keep = (int)rnd((uint32_t)n_conv + 1), n_tail = 1 + (int)rnd(20);
        int32_t whole[256];
        memcpy(whole, conv, (size_t)keep * sizeof *conv);
        for (int i = 0; i < n_tail; i++) whole[keep + i] = (int32_t)rnd((uint32_t)info->vocab);
        p.speculative = (int)rnd(2);
        p.max_new_tokens = 1 + (int)rnd(60);
        if (fm_session_truncate(s, keep, err, sizeof err) ||
            fm_session_generate(s, whole + keep, n_tail, &p, &cont.ids, &cont.n, &st, err, sizeof err) ||
            generate(e, whole, keep + n_tail, &p, &fresh, NULL)) {
            CHECK_MSG(0, "%s: %s", model, err);
        } else {
            cont.stop = st.stop;
            CHECK_MSG(fm_session_pos(s) == keep + n_tail + cont.n, "%s: session holds %d tokens", model,
                      fm_session_pos(s));
            CHECK_MSG(same(&cont, &fresh),
                      "%s case %d: kept %d of %d tokens, tail %d: continued reply differs from a fresh one "
                      "(%d vs %d tokens)",
                      model, c, keep, n_conv, n_tail, cont.n, fresh.n);
            checked++;
        }
        free(first.ids);
        free(cont.ids);
        free(fresh.ids);
    }
    fm_session_free(s);
    return checked;
}

int main(void) {
    char target[4096], drafter[4096], err[FM_ERRBUF_SIZE];
    int accepted_hist[FM_MAX_BLOCK + 1] = {0}, cases = 0, truncated = 0, sampled = 0, penalized = 0,
                                     repeated = 0;
    for (int mi = 0; mi < N_MODELS; mi++) {
        if (synth_pair(&MODELS[mi], target, drafter, sizeof target)) {
            CHECK_MSG(0, "synthesizing the %s pair failed", MODELS[mi].type);
            continue;
        }
        for (int ctx_variant = 0; ctx_variant < 2; ctx_variant++) {
            fm_engine_params ep;
            fm_engine_params_init(&ep);
            ep.model_path = target;
            ep.drafter_path = drafter;
            ep.n_threads = 2;
            ep.n_ctx = ctx_variant ? 48 : 512; /* 48: rounds meet the cache's end */
            ep.prefill_chunk = ctx_variant ? 5 : 64;
            fm_engine *e = NULL;
            if (fm_engine_load(&ep, &e, err, sizeof err)) {
                CHECK_MSG(0, "load %s: %s", target, err);
                continue;
            }
            fm_engine_info info;
            fm_engine_get_info(e, &info);
            if (mi == N_MODELS - 1 && !ctx_variant)
                printf("test_speculative: the %d-wide q8_0 pair: %d target matrices repacked for the VNNI "
                       "kernel\n",
                       info.dim, info.repacked);
            if (!ctx_variant) {
                const int n = check_truncate(e, &info, MODELS[mi].type, 10);
                CHECK_MSG(n >= 0, "%s: no session for the truncation cases", MODELS[mi].type);
                truncated += n > 0 ? n : 0;
            }
            for (int c = 0; c < N_CASES_PER_MODEL / 2; c++) {
                int32_t prompt[64];
                const int n_prompt = 1 + (int)rnd(ctx_variant ? 20 : 40);
                for (int i = 0; i < n_prompt; i++) prompt[i] = (int32_t)rnd((uint32_t)info.vocab);
                fm_generate_params plain;
                fm_generate_params_init(&plain);
                plain.max_new_tokens = 1 + (int)rnd(200);
                plain.ignore_stop = 1;
                const int sample = rnd(2);
                if (sample) {
                    static const int top_ks[] = {0, 1, 5, 40};
                    static const float top_ps[] = {1, 0.95f, 0.5f}, min_ps[] = {0, 0.05f, 0.3f};
                    plain.sampling.temperature = 0.2f + 0.1f * (float)rnd(14);
                    plain.sampling.top_k = top_ks[rnd(4)];
                    plain.sampling.top_p = top_ps[rnd(3)];
                    plain.sampling.min_p = min_ps[rnd(3)];
                    plain.sampling.seed = rnd(1u << 30);
                }
                if (rnd(3) == 0) { /* penalties, greedy or sampled */
                    static const float pens[] = {0, 0.5f, 1.5f, -1.0f}, reps[] = {0, 1.3f, 0.8f, 2.0f};
                    static const int windows[] = {0, 0, 3, 32};
                    plain.sampling.presence_penalty = pens[rnd(4)];
                    plain.sampling.frequency_penalty = pens[rnd(4)];
                    plain.sampling.repetition_penalty = reps[rnd(4)];
                    plain.sampling.repeat_last_n = windows[rnd(4)];
                    penalized +=
                        plain.sampling.presence_penalty != 0 || plain.sampling.frequency_penalty != 0;
                    repeated += plain.sampling.repetition_penalty != 0;
                }
                result a = {0}, b = {0};
                if (generate(e, prompt, n_prompt, &plain, &a, NULL)) {
                    CHECK_MSG(0, "plain generation failed");
                    continue;
                }
                CHECK_MSG(a.n <= plain.max_new_tokens, "plain produced %d > -n %d", a.n,
                          plain.max_new_tokens);
                fm_generate_params sp = plain;
                sp.speculative = 1;
                static const int verify_modes[] = {0, 1, 3, 7, 15, 16};
                sp.verify = verify_modes[rnd(6)];
                sp.fallback = (int)rnd(2);
                int32_t stop_id;
                if (a.n > 3 && rnd(3) == 0) { /* an extra stop token taken from the plain output */
                    stop_id = a.ids[rnd((uint32_t)a.n)];
                    sp.stop_ids = plain.stop_ids = &stop_id;
                    sp.n_stop_ids = plain.n_stop_ids = 1;
                    free(a.ids);
                    a = (result){0};
                    if (generate(e, prompt, n_prompt, &plain, &a, NULL)) continue;
                }
                const int simulate = rnd(2);
                fm_round_trace trace[256];
                int n_trace = 0;
                if (simulate) {
                    static const double means[] = {0, 2, 4, 6.5, 8, 16};
                    sp.sim_future = a.ids;
                    sp.sim_future_len = a.n;
                    sp.sim_mean = means[rnd(6)];
                    sp.sim_seed = rnd(1000);
                    sp.trace = trace;
                    sp.trace_cap = 256;
                    sp.n_trace = &n_trace;
                }
                fm_generate_stats st;
                if (generate(e, prompt, n_prompt, &sp, &b, &st)) {
                    CHECK_MSG(0, "speculative generation failed");
                    free(a.ids);
                    continue;
                }
                cases++;
                sampled += sample;
                CHECK_MSG(same(&a, &b),
                          "model %s ctx %d case %d: speculative (verify %d, fallback %d, sim %d, temperature "
                          "%g) differs from plain (%d vs %d tokens)",
                          MODELS[mi].type, info.n_ctx, c, sp.verify, sp.fallback, simulate,
                          (double)sp.sampling.temperature, b.n, a.n);
                CHECK(b.n <= sp.max_new_tokens);
                for (int r = 0; r < n_trace; r++) {
                    CHECK(trace[r].accepted <= trace[r].verified);
                    accepted_hist[trace[r].accepted]++;
                }
                free(a.ids);
                free(b.ids);
            }
            fm_engine_free(e);
        }
    }
    printf("cases: %d (%d sampled, %d with presence / frequency penalties, %d with a repetition penalty), "
           "truncated conversations: %d (%d with a repetition penalty); rounds by accepted drafts:",
           cases, sampled, penalized, repeated, truncated, g_truncate_repeated);
    int reached = 0;
    for (int k = 0; k <= 16; k++) {
        printf(" %d:%d", k, accepted_hist[k]);
        reached += accepted_hist[k] > 0;
    }
    printf("\n");
    CHECK_MSG(cases >= 200, "only %d cases ran", cases);
    CHECK_MSG(sampled >= 70, "only %d sampled cases ran", sampled);
    CHECK_MSG(penalized >= 40, "only %d cases with penalties ran", penalized);
    CHECK_MSG(repeated >= 30, "only %d cases with a repetition penalty ran", repeated);
    CHECK_MSG(g_truncate_repeated >= 10, "only %d truncated conversations with a repetition penalty",
              g_truncate_repeated);
    CHECK_MSG(truncated >= 30, "only %d truncated-conversation cases ran", truncated);
    CHECK_MSG(accepted_hist[0] > 0 && accepted_hist[16] > 0 && reached >= 12,
              "simulated rounds should accept from 0 to 16 drafts (saw %d distinct counts)", reached);
    return fm_test_report("test_speculative");
}
