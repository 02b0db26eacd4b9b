/* bench_e2e.c: see bench_e2e.h. Each run starts from a reset session (position 0) with the same prompt and
 * ignores stop tokens, so every run produces exactly n_gen tokens and runs are comparable. */
#include "bench_e2e.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"

struct bench_e2e {
    fm_engine *e;
    fm_session *s;
    int32_t *prompt; /* [n_prompt] */
    int n_prompt, n_gen, verify, fallback;
    int32_t *reference; /* [n_reference]: the first plain run's tokens */
    int n_reference;
    fm_sampling sampling;
};

void bench_e2e_set_sampling(bench_e2e *b, const fm_sampling *s) {
    b->sampling = *s;
}

int bench_e2e_create(fm_engine *e, const int32_t *prompt, int n_prompt, int n_gen, int verify, int fallback,
                     bench_e2e **out, char *err, size_t errlen) {
    *out = NULL;
    bench_e2e *b = calloc(1, sizeof *b);
    if (!b) return fm_set_error(err, errlen, "out of memory");
    b->prompt = malloc((size_t)n_prompt * sizeof *prompt);
    if (!b->prompt) {
        free(b);
        return fm_set_error(err, errlen, "out of memory");
    }
    memcpy(b->prompt, prompt, (size_t)n_prompt * sizeof *prompt);
    b->e = e;
    b->n_prompt = n_prompt;
    b->n_gen = n_gen;
    b->verify = verify;
    b->fallback = fallback;
    if (fm_session_create(e, &b->s, err, errlen)) {
        bench_e2e_free(b);
        return -1;
    }
    *out = b;
    return 0;
}

void bench_e2e_free(bench_e2e *b) {
    if (!b) return;
    fm_session_free(b->s);
    free(b->prompt);
    free(b->reference);
    free(b);
}

static int run(bench_e2e *b, const fm_generate_params *p, bench_e2e_result *r, char *err, size_t errlen) {
    memset(r, 0, sizeof *r);
    fm_session_reset(b->s);
    int32_t *ids = NULL;
    int n = 0;
    fm_generate_stats st;
    if (fm_session_generate(b->s, b->prompt, b->n_prompt, p, &ids, &n, &st, err, errlen)) return -1;
    r->n_generated = n;
    r->tok_s = n > 1 && st.decode_s > 0 ? (n - 1) / st.decode_s : 0;
    r->rounds = st.rounds;
    r->plain_steps = st.plain_steps;
    r->mean_accepted = st.rounds ? (double)st.accepted / st.rounds : 0;
    if (!b->reference) {
        b->reference = ids;
        b->n_reference = n;
        r->identical = 1;
        return 0;
    }
    r->identical = n == b->n_reference && memcmp(ids, b->reference, (size_t)n * sizeof *ids) == 0;
    free(ids);
    return 0;
}

static void base_params(const bench_e2e *b, fm_generate_params *p) {
    fm_generate_params_init(p);
    p->max_new_tokens = b->n_gen;
    p->ignore_stop = 1;
    p->verify = b->verify;
    p->fallback = b->fallback;
    if (b->sampling.temperature > 0) p->sampling = b->sampling;
}

int bench_e2e_plain(bench_e2e *b, bench_e2e_result *r, char *err, size_t errlen) {
    fm_generate_params p;
    base_params(b, &p);
    p.speculative = 0;
    return run(b, &p, r, err, errlen);
}

int bench_e2e_simulated(bench_e2e *b, double sim_mean, uint64_t seed, bench_e2e_result *r, char *err,
                        size_t errlen) {
    if (!b->reference) return fm_set_error(err, errlen, "bench: a plain run must come before simulated runs");
    fm_generate_params p;
    base_params(b, &p);
    p.speculative = 1;
    p.sim_future = b->reference;
    p.sim_future_len = b->n_reference;
    p.sim_mean = sim_mean;
    p.sim_seed = seed;
    return run(b, &p, r, err, errlen);
}
