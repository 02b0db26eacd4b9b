/* test_sampler.c: the sampler (src/decode/sampler.c) against Hugging Face transformers and against itself.
 *   1. tests/fixtures/sampling/cases.json (scripts/make_sampling_fixtures.py): for rows of logits and
 *      temperature / top-k / top-p / min-p settings, the tokens HF's warpers keep and their probabilities.
 *      Ours must keep the same tokens (but those HF gives less than e^-30 x the top probability, which ours
 *      never draws) with the same probabilities.
 *   2. Draws at many positions follow the kept distribution.
 *   3. A draw depends on the row, the settings and the row's key only: not on the order of the candidates,
 *      nor on extra candidates past the range (the GPU gathers a superset); greedy is the argmax; coupled
 *      draws of equal rows agree, of close rows mostly; the noise is Gumbel and keyed by seed and position;
 *      bad settings are refused with a message. */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/rng.h"
#include "decode/sampler.h"
#include "test_util.h"

enum { MAX_V = 1024 };

static fm_sampling settings_of(const cJSON *c) {
    fm_sampling s = {0};
    s.temperature = (float)cJSON_GetObjectItem(c, "temperature")->valuedouble;
    s.top_k = cJSON_GetObjectItem(c, "top_k")->valueint;
    s.top_p = (float)cJSON_GetObjectItem(c, "top_p")->valuedouble;
    s.min_p = (float)cJSON_GetObjectItem(c, "min_p")->valuedouble;
    return s;
}

/* The row's logits (JSON null: -inf); returns its length. */
static int row_of(const cJSON *rows, const char *name, float *out) {
    const cJSON *r = cJSON_GetObjectItem(rows, name), *v;
    int n = 0;
    cJSON_ArrayForEach(v, r) {
        if (n < MAX_V) out[n++] = cJSON_IsNull(v) ? -INFINITY : (float)v->valuedouble;
    }
    return n;
}

/* HF's RepetitionPenaltyLogitsProcessor on a row given a sequence: the same float32 values, bit for bit. */
static int g_repetition_cases;
static void check_repetition_cases(const cJSON *root) {
    const cJSON *rows = cJSON_GetObjectItem(root, "rows"), *c;
    static float row[MAX_V], want[MAX_V];
    static int counts[MAX_V];
    static fm_penalty list[MAX_V];
    static int32_t seq[MAX_V];
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "repetition")) {
        const char *name = cJSON_GetObjectItem(c, "row")->valuestring;
        const int V = row_of(rows, name, row);
        int n = 0, same = 0;
        const cJSON *v;
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(c, "context")) {
            if (n < MAX_V) seq[n++] = v->valueint;
        }
        int nw = 0;
        cJSON_ArrayForEach(v, cJSON_GetObjectItem(c, "out")) {
            if (nw < MAX_V) want[nw++] = cJSON_IsNull(v) ? -INFINITY : (float)v->valuedouble;
        }
        fm_sampling s = {0};
        s.repetition_penalty = (float)cJSON_GetObjectItem(c, "penalty")->valuedouble;
        fm_sample_penalize(row, &s, seq, n, 0, NULL, 0, counts, list);
        for (int i = 0; i < V; i++) same += memcmp(&row[i], &want[i], sizeof(float)) == 0;
        CHECK_MSG(nw == V && same == V, "repetition %g on %s: %d of %d logits as HF's",
                  (double)s.repetition_penalty, name, same, V);
        g_repetition_cases++;
    }
}

static int check_fixture(void) {
    const char *src = getenv("FM_SOURCE_DIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/sampling/cases.json", src ? src : ".");
    char *text = fm_test_read_file(path, NULL);
    CHECK_MSG(text != NULL, "cannot read %s (set FM_SOURCE_DIR)", path);
    if (!text) return 0;
    cJSON *root = cJSON_Parse(text);
    free(text);
    CHECK_MSG(root != NULL, "%s is not JSON", path);
    if (!root) return 0;
    const cJSON *rows = cJSON_GetObjectItem(root, "rows"), *c;
    static float logits[MAX_V];
    static fm_candidate cand[MAX_V];
    static int32_t ids[MAX_V];
    static double p[MAX_V];
    int n_cases = 0;
    cJSON_ArrayForEach(c, cJSON_GetObjectItem(root, "cases")) {
        const char *name = cJSON_GetObjectItem(c, "row")->valuestring;
        const int V = row_of(rows, name, logits);
        const fm_sampling s = settings_of(c);
        const int n_cand = fm_sample_gather(logits, V, s.temperature, cand);
        int n = 0;
        fm_sample_distribution(cand, n_cand, &s, ids, p, &n);
        /* HF's kept tokens and probabilities, by id. */
        static double hf[MAX_V];
        for (int i = 0; i < V; i++) hf[i] = -1;
        const cJSON *hid = cJSON_GetObjectItem(c, "ids"), *hp = cJSON_GetObjectItem(c, "probs");
        double hf_max = 0;
        for (int i = 0; i < cJSON_GetArraySize(hid); i++) {
            const int id = cJSON_GetArrayItem(hid, i)->valueint;
            hf[id] = cJSON_GetArrayItem(hp, i)->valuedouble;
            hf_max = fmax(hf_max, hf[id]);
        }
        int bad = 0;
        for (int i = 0; i < n; i++) {
            const double want = hf[ids[i]];
            if (want < 0 || fabs(p[i] - want) > 1e-6 + 1e-5 * want) {
                if (!bad++)
                    fprintf(stderr, "%s T %g k %d p %g min-p %g: token %d p %.9g, HF %.9g\n", name,
                            (double)s.temperature, s.top_k, (double)s.top_p, (double)s.min_p, ids[i], p[i],
                            want);
            }
            hf[ids[i]] = -1; /* seen */
        }
        for (int i = 0; i < V; i++)
            if (hf[i] >= hf_max * exp(-(double)FM_SAMPLE_RANGE + 0.1)) {
                if (!bad++)
                    fprintf(stderr, "%s T %g k %d p %g min-p %g: HF keeps token %d (p %.9g), we do not\n",
                            name, (double)s.temperature, s.top_k, (double)s.top_p, (double)s.min_p, i, hf[i]);
            }
        CHECK_MSG(bad == 0, "case %d (%s): %d tokens differ from HF's", n_cases, name, bad);
        n_cases++;
    }
    check_repetition_cases(root);
    cJSON_Delete(root);
    return n_cases;
}

/* Draws at N positions follow the kept distribution: every token's count within 5 standard deviations (+2)
 * of N p, and none outside the kept set. */
static void check_draw_frequencies(void) {
    enum { V = 200, N = 20000 };
    static float row[V];
    static fm_candidate cand[V], work[V];
    static int32_t ids[V];
    static double p[V];
    static int count[V];
    uint64_t st = 99;
    for (int i = 0; i < V; i++) row[i] = (float)(4 * (fm_rng_uniform(&st) - 0.5));
    const fm_sampling settings[] = {{1.0f, 0, 1, 0, 5, 0, 0, 0, 0},
                                    {0.7f, 20, 0.9f, 0, 6, 0, 0, 0, 0},
                                    {1.5f, 0, 0.8f, 0.05f, 7, 0, 0, 0, 0}};
    for (int k = 0; k < 3; k++) {
        const fm_sampling *s = &settings[k];
        int n = 0;
        const int nc = fm_sample_gather(row, V, s->temperature, cand);
        memcpy(work, cand, sizeof cand);
        fm_sample_distribution(work, nc, s, ids, p, &n);
        memset(count, 0, sizeof count);
        for (int i = 0; i < N; i++) {
            memcpy(work, cand, sizeof cand);
            count[fm_sample_pick(work, nc, s, fm_sample_row_key(s->seed, i))]++;
        }
        int bad = 0, drawn = 0;
        for (int i = 0; i < n; i++) {
            const double mean = N * p[i], sd = sqrt(N * p[i] * (1 - p[i]));
            bad += fabs(count[ids[i]] - mean) > 5 * sd + 2;
            drawn += count[ids[i]];
        }
        CHECK_MSG(drawn == N, "setting %d: %d of %d draws outside the kept tokens", k, N - drawn, N);
        CHECK_MSG(bad == 0, "setting %d: %d tokens drawn far from N p", k, bad);
        CHECK_MSG(n > 1 && (k == 0 || n < V), "setting %d keeps %d tokens", k, n);
    }
}

static void check_invariance(void) {
    enum { V = 500 };
    static float row[V];
    static fm_candidate cand[V + 8], work[V + 8];
    uint64_t st = 7;
    for (int i = 0; i < V; i++) row[i] = (float)(6 * (fm_rng_uniform(&st) - 0.5));
    row[123] = row[77]; /* a tie */
    const fm_sampling s = {0.8f, 40, 0.95f, 0.02f, 0, 0, 0, 0, 0};
    const int nc = fm_sample_gather(row, V, s.temperature, cand);
    int same_order = 0, same_extra = 0;
    for (int t = 0; t < 200; t++) {
        const uint64_t u = fm_splitmix64(&st); /* a row key */
        memcpy(work, cand, sizeof cand);
        const int32_t want = fm_sample_pick(work, nc, &s, u);
        /* Shuffled. */
        memcpy(work, cand, sizeof cand);
        for (int i = nc - 1; i > 0; i--) {
            const int j = (int)(fm_splitmix64(&st) % (uint64_t)(i + 1));
            const fm_candidate x = work[i];
            work[i] = work[j], work[j] = x;
        }
        same_order += fm_sample_pick(work, nc, &s, u) == want;
        /* With candidates past the range (as the GPU's looser gather brings). */
        memcpy(work, cand, sizeof cand);
        for (int i = 0; i < 8; i++)
            work[nc + i] =
                (fm_candidate){cand[0].logit - (FM_SAMPLE_RANGE + 0.5f) * s.temperature - 10, i, 0};
        same_extra += fm_sample_pick(work, nc + 8, &s, u) == want;
    }
    CHECK_MSG(same_order == 200, "%d of 200 draws changed with the candidates' order", 200 - same_order);
    CHECK_MSG(same_extra == 200, "%d of 200 draws changed with candidates past the range", 200 - same_extra);

    /* Greedy: the argmax, ties to the lowest id. */
    row[300] = row[400] = 10;
    const fm_sampling greedy = {0, 40, 0.5f, 0, 1, 0, 0, 0, 0};
    CHECK(fm_sample_row(row, V, &greedy, 5, NULL) == 300);
    row[400] = 9; /* no tie from here: HF's top-k 1 keeps every token tied with the first */
    /* A cold temperature draws the argmax too; top-k 1 always does. */
    const fm_sampling cold = {0.01f, 0, 1, 0, 3, 0, 0, 0, 0}, k1 = {2.0f, 1, 1, 0, 3, 0, 0, 0, 0};
    int argmax_draws = 0;
    for (int pos = 0; pos < 100; pos++)
        argmax_draws +=
            fm_sample_row(row, V, &cold, pos, cand) == 300 && fm_sample_row(row, V, &k1, pos, cand) == 300;
    CHECK_MSG(argmax_draws == 100, "%d of 100", argmax_draws);
    /* A warm one draws other tokens. */
    const fm_sampling warm = {1.0f, 0, 1, 0, 3, 0, 0, 0, 0};
    int others = 0;
    for (int pos = 0; pos < 100; pos++) others += fm_sample_row(row, V, &warm, pos, cand) != 300;
    CHECK_MSG(others > 10, "only %d of 100 warm draws left the argmax (p about 0.3 each)", others);
}

/* Total variation distance between softmax(a) and softmax(b). */
static double tv_distance(const float *a, const float *b, int n) {
    double ma = a[0], mb = b[0], sa = 0, sb = 0, tv = 0;
    for (int i = 1; i < n; i++) ma = fmax(ma, a[i]), mb = fmax(mb, b[i]);
    for (int i = 0; i < n; i++) sa += exp(a[i] - ma), sb += exp(b[i] - mb);
    for (int i = 0; i < n; i++) tv += fabs(exp(a[i] - ma) / sa - exp(b[i] - mb) / sb);
    return tv / 2;
}

/* Coupled draws (sample_noise.h): a drafter row equal to the target's draws what the target draws every
 * time; for others the agreement lies between the Gumbel coupling's (1 - TV) / (1 + TV) and the most any
 * coupling can reach, 1 - TV, and for a close row far above the target's probability of the row's argmax
 * (what an argmax draft gets). */
static void check_coupling(void) {
    enum { V = 300, N = 4000 };
    static float p_row[V], q_row[V], z_row[V];
    static fm_candidate cand[V];
    uint64_t st = 5;
    for (int i = 0; i < V; i++) p_row[i] = (float)(3 * (fm_rng_uniform(&st) - 0.5));
    for (int i = 0; i < V; i++) q_row[i] = p_row[i] + (float)(0.4 * (fm_rng_uniform(&st) - 0.5));
    for (int i = 0; i < V; i++) z_row[i] = (float)(8 * (fm_rng_uniform(&st) - 0.5)); /* unrelated */
    const fm_sampling s = {1.0f, 0, 1, 0, 11, 0, 0, 0, 0};
    int same = 0, close = 0, unrelated = 0, argmax = 0;
    const int32_t q_top = fm_sample_row(q_row, V, &(fm_sampling){0}, 0, NULL);
    for (int pos = 0; pos < N; pos++) {
        const int32_t t = fm_sample_row(p_row, V, &s, pos, cand);
        same += fm_sample_row(p_row, V, &s, pos, cand) == t;
        close += fm_sample_row(q_row, V, &s, pos, cand) == t;
        unrelated += fm_sample_row(z_row, V, &s, pos, cand) == t;
        argmax += q_top == t;
    }
    const double tv_q = tv_distance(p_row, q_row, V), tv_z = tv_distance(p_row, z_row, V);
    printf("coupled draws agreeing with the target's (of %d): same row %d; close row %d (TV %.3f: bounds "
           "%.0f .. "
           "%.0f); unrelated row %d (TV %.3f: bounds %.0f .. %.0f); the close row's argmax %d\n",
           N, same, close, tv_q, N * (1 - tv_q) / (1 + tv_q), N * (1 - tv_q), unrelated, tv_z,
           N * (1 - tv_z) / (1 + tv_z), N * (1 - tv_z), argmax);
    CHECK(same == N);
    const double slack = 4 * sqrt(N * 0.25); /* four standard deviations of a count */
    CHECK(close >= N * (1 - tv_q) / (1 + tv_q) - slack && close <= N * (1 - tv_q) + slack);
    CHECK(unrelated >= N * (1 - tv_z) / (1 + tv_z) - slack && unrelated <= N * (1 - tv_z) + slack);
    CHECK_MSG(close > 5 * argmax, "close %d, argmax %d", close, argmax);
}

/* Penalties: each token that appeared in the history (generated ids, then the drafts ahead of the row) loses
 * presence + frequency x its count, once; the others keep their logit; the counts scratch ends zeroed. */
static void check_penalties(void) {
    enum { V = 50 };
    float row[V], want[V];
    int counts[V] = {0};
    fm_penalty list[7];
    for (int i = 0; i < V; i++) row[i] = want[i] = (float)i * 0.25f - 3;
    const int32_t gen[] = {4, 7, 4, 9, 4}, extra[] = {7, 11};
    const fm_sampling s = {0.7f, 0, 1, 0, 1, 0.5f, 0.25f, 0, 0};
    fm_sample_penalize(row, &s, gen, 5, 5, extra, 2, counts, list);
    want[4] -= 0.5f + 0.25f * 3, want[7] -= 0.5f + 0.25f * 2, want[9] -= 0.5f + 0.25f,
        want[11] -= 0.5f + 0.25f;
    int same = 0, zero = 0;
    for (int i = 0; i < V; i++) same += row[i] == want[i], zero += counts[i] == 0;
    CHECK_MSG(same == V, "%d of %d logits as defined", same, V);
    CHECK(zero == V);
    CHECK(fm_sampling_penalized(&s) && !fm_sampling_penalized(&(fm_sampling){0.7f, 0, 1, 0, 1, 0, 0, 0, 0}));
}

/* The repetition penalty: over the whole history (prompt, generated tokens, drafts ahead) or its last
 * repeat_last_n tokens; a positive logit divided, the others multiplied, before presence / frequency. */
static void check_repetition(void) {
    enum { V = 40 };
    float row[V], want[V];
    int counts[V] = {0};
    fm_penalty list[12];
    for (int i = 0; i < V; i++) row[i] = want[i] = (float)i * 0.5f - 10; /* token 20 is 0 */
    /* prompt 3 30 20 | generated 31 3 | a draft 36 */
    const int32_t seq[] = {3, 30, 20, 31, 3}, extra[] = {36};
    fm_sampling s = {0};
    s.repetition_penalty = 2, s.presence_penalty = 0.5f;
    fm_sample_penalize(row, &s, seq, 5, 2, extra, 1, counts, list);
    want[3] = want[3] * 2 - 0.5f;   /* negative, in the prompt and generated */
    want[30] = want[30] / 2;        /* positive, in the prompt only */
    want[20] = 0;                   /* zero stays zero */
    want[31] = want[31] / 2 - 0.5f; /* positive, generated */
    want[36] = want[36] / 2 - 0.5f; /* a draft ahead of the row counts as generated */
    int same = 0, zero = 0;
    for (int i = 0; i < V; i++) same += row[i] == want[i], zero += counts[i] == 0;
    CHECK_MSG(same == V, "%d of %d logits as defined (whole history)", same, V);
    CHECK(zero == V);
    /* the last 3 tokens only (31 3 36): 30 keeps its logit, 3 is still scaled and 31, 36 too */
    for (int i = 0; i < V; i++) row[i] = want[i] = (float)i * 0.5f - 10;
    s.presence_penalty = 0, s.repeat_last_n = 3;
    fm_sample_penalize(row, &s, seq, 5, 2, extra, 1, counts, list);
    want[3] *= 2, want[31] /= 2, want[36] /= 2;
    same = 0;
    for (int i = 0; i < V; i++) same += row[i] == want[i];
    CHECK_MSG(same == V, "%d of %d logits as defined (last 3)", same, V);
    /* off at 1: no entry */
    s.repetition_penalty = 1, s.repeat_last_n = 0;
    CHECK(!fm_sampling_penalized(&s) && fm_penalty_list(&s, seq, 5, 2, extra, 1, counts, list) == 0);
}

/* fm_penalty_rows (one eval's rows at once, the history read once) gives the entries of fm_penalty_list row
 * by row, in the same order, for random histories, drafts and settings, moving windows included. */
static void check_penalty_rows(void) {
    enum { V = 50, MAXS = 60, MAXR = 17 };
    int counts[V] = {0}, offsets[MAXR + 1], bad = 0, cases = 0, fast = 0;
    static fm_penalty rows_out[MAXR * (MAXS + MAXR)], one[MAXS + MAXR];
    uint64_t st = 7;
    for (int c = 0; c < 400; c++) {
        int32_t seq[MAXS], extra[MAXR];
        const int n_seq = (int)(fm_rng_uniform(&st) * MAXS), n_gen = (int)(fm_rng_uniform(&st) * (n_seq + 1));
        const int rows = 1 + (int)(fm_rng_uniform(&st) * MAXR);
        for (int i = 0; i < n_seq; i++) seq[i] = (int32_t)(fm_rng_uniform(&st) * V);
        for (int i = 0; i < MAXR; i++) extra[i] = (int32_t)(fm_rng_uniform(&st) * V);
        static const float pres[] = {0, 0.5f, -1}, freq[] = {0, 0.3f}, rep[] = {0, 1.3f};
        static const int win[] = {0, 3, 100};
        fm_sampling s = {0};
        s.presence_penalty = pres[(int)(fm_rng_uniform(&st) * 3)];
        s.frequency_penalty = freq[(int)(fm_rng_uniform(&st) * 2)];
        s.repetition_penalty = rep[(int)(fm_rng_uniform(&st) * 2)];
        s.repeat_last_n = win[(int)(fm_rng_uniform(&st) * 3)];
        const int total = fm_penalty_rows(&s, seq, n_seq, n_gen, extra, rows, counts, rows_out, offsets);
        fast += rows > 1 && !(s.repeat_last_n > 0 && s.repeat_last_n < n_seq + rows - 1);
        for (int r = 0; r < rows; r++) {
            const int k = fm_penalty_list(&s, seq, n_seq, n_gen, extra, r, counts, one);
            bad += offsets[r + 1] - offsets[r] != k ||
                   memcmp(one, rows_out + offsets[r], sizeof *one * (size_t)k) != 0;
        }
        bad += total != offsets[rows];
        for (int i = 0; i < V; i++) bad += counts[i] != 0;
        cases++;
    }
    printf("penalty rows: %d cases (%d through the shared history), %d differences\n", cases, fast, bad);
    CHECK_MSG(bad == 0 && fast > 100, "%d differences, %d shared-history cases", bad, fast);
}

/* The noise: Gumbel scores of a flat row average the Euler-Mascheroni constant; keys differ by seed and by
 * position, and are repeatable. */
static void check_noise(void) {
    double sum = 0;
    for (int id = 0; id < 100000; id++) sum += fm_sample_score(0, 0, 1.0, fm_sample_row_key(42, 7), id);
    CHECK_NEAR(sum / 100000, 0.5772, 0.02);
    CHECK(fm_sample_row_key(42, 7) != fm_sample_row_key(43, 7));
    CHECK(fm_sample_row_key(42, 7) != fm_sample_row_key(42, 8));
    CHECK(fm_sample_score(1.5f, 2, 0.7, fm_sample_row_key(42, 7), 9) ==
          fm_sample_score(1.5f, 2, 0.7, fm_sample_row_key(42, 7), 9));
}

static void check_settings(void) {
    char err[256];
    const fm_sampling ok = {0.7f, 20, 0.8f, 0, 1, 0, 0, 0, 0}, greedy = {0, 0, 1, 0, 0, 0, 0, 0, 0},
                      zeroed = {0}, zero_p = {1, 0, 0, 0, 0, 0, 0, 0, 0};
    CHECK(fm_sampling_check(&ok, err, sizeof err) == 0);
    CHECK(fm_sampling_check(&zeroed, err, sizeof err) == 0);
    CHECK(fm_sampling_check(&zero_p, err, sizeof err) == 0 && !fm_sampling_top_p_on(&zero_p));
    CHECK(fm_sampling_check(&greedy, err, sizeof err) == 0);
    const fm_sampling bad[] = {
        {-1, 0, 1, 0, 0, 0, 0, 0, 0},    {NAN, 0, 1, 0, 0, 0, 0, 0, 0},  {1, -2, 1, 0, 0, 0, 0, 0, 0},
        {1, 0, -0.5f, 0, 0, 0, 0, 0, 0}, {1, 0, 1.5f, 0, 0, 0, 0, 0, 0}, {1, 0, 1, 1, 0, 0, 0, 0, 0},
        {1, 0, 1, -0.1f, 0, 0, 0, 0, 0}, {0, 0, 1, 0, 0, 2.5f, 0, 0, 0}, {0, 0, 1, 0, 0, 0, NAN, 0, 0},
        {0, 0, 1, 0, 0, 0, 0, -1, 0},    {0, 0, 1, 0, 0, 0, 0, 11, 0},   {0, 0, 1, 0, 0, 0, 0, NAN, 0},
        {0, 0, 1, 0, 0, 0, 0, 1e-5f, 0}, {0, 0, 1, 0, 0, 0, 0, 1.1f, -1}};
    static const char *const names[] = {"temperature",
                                        "temperature",
                                        "top-k",
                                        "top-p",
                                        "top-p",
                                        "min-p",
                                        "min-p",
                                        "presence penalty",
                                        "frequency penalty",
                                        "repetition penalty",
                                        "repetition penalty",
                                        "repetition penalty",
                                        "repetition penalty",
                                        "repeat-last-n"};
    enum { N_BAD = sizeof bad / sizeof bad[0] };
    for (int i = 0; i < N_BAD; i++) {
        err[0] = 0;
        CHECK_MSG(fm_sampling_check(&bad[i], err, sizeof err) != 0 && strstr(err, names[i]),
                  "setting %d: '%s'", i, err);
    }
}

int main(void) {
    const int n = check_fixture();
    printf("HF fixture cases: %d\n", n);
    CHECK_MSG(n >= 60, "only %d fixture cases", n);
    check_draw_frequencies();
    check_invariance();
    check_coupling();
    check_penalties();
    printf("HF repetition cases: %d\n", g_repetition_cases);
    CHECK_MSG(g_repetition_cases >= 20, "only %d repetition cases", g_repetition_cases);
    check_repetition();
    check_penalty_rows();
    check_noise();
    check_settings();
    return fm_test_report("test_sampler");
}
