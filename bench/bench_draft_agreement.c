/* bench_draft_agreement.c: how often the Q8_0 copy of a drafter drafts what its stored (BF16) weights draft,
 * and what each draft costs. Drafts only steer speculation (the target verifies every token), so this is the
 * price of the faster drafts in acceptance, not in output.
 * Usage: bench_draft_agreement TARGET.gguf DRAFTER [rounds=8] [threads=0: all cores]
 * A seeded random prompt of 64 tokens is prefilled with feature capture; each round appends 8 more random
 * tokens, extends both drafters' contexts with the same feature rows and drafts from the same anchor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/rng.h"
#include "drafter/flashmap_drafter.h"

enum { PROMPT = 64, STEP = 8 };

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_draft_agreement TARGET.gguf DRAFTER [rounds=8] [threads=0]\n");
        return 2;
    }
    const int rounds = argc > 3 ? atoi(argv[3]) : 8, threads = argc > 4 ? atoi(argv[4]) : 0;
    char err[FM_ERROR_LEN];
    qwen3_model *m = NULL;
    qwen3_state *s = NULL;
    fm_drafter *d[2] = {NULL, NULL}; /* stored, q8_0 */
    fm_pool *pool = fm_pool_create(threads);
    int rc = 1, n_ctx = PROMPT + STEP * rounds + FM_DRAFTER_MAX_BLOCK + 1;
    if (rounds < 1 || !pool || qwen3_model_load(argv[1], &m, err, sizeof err)) goto fail;
    for (int i = 0; i < 2; i++)
        if (fm_drafter_load(argv[2], m, NULL, n_ctx, &d[i], err, sizeof err)) goto fail;
    if (fm_drafter_quantize_q8_0(d[1], pool, err, sizeof err)) goto fail;
    int n_cap;
    const int *cap = fm_drafter_target_layers(d[0], &n_cap);
    qwen3_state_params sp = {n_ctx, PROMPT, cap, n_cap};
    if (qwen3_state_create(m, &sp, &s, err, sizeof err)) goto fail;

    uint64_t seed = 7;
    int32_t ids[PROMPT];
    int pos = 0, n = PROMPT, agree = 0, slots = 0, K = fm_drafter_block(d[0]);
    double ms[2] = {0, 0};
    for (int r = 0; r < rounds; r++, n = STEP) {
        for (int i = 0; i < n; i++) ids[i] = (int32_t)(fm_splitmix64(&seed) % (uint64_t)m->hp.vocab);
        if (qwen3_forward(m, s, pool, ids, n, QWEN3_OUT_NONE, err, sizeof err)) goto fail;
        int32_t out[2][FM_DRAFTER_MAX_BLOCK];
        for (int i = 0; i < 2; i++) {
            if (fm_drafter_extend_context(d[i], pool, qwen3_state_features(s), n, pos, err, sizeof err))
                goto fail;
            double t0 = now_ms();
            if (fm_drafter_draft(d[i], pool, ids[n - 1], pos + n, fm_drafter_block(d[i]), out[i], err,
                                 sizeof err))
                goto fail;
            ms[i] += now_ms() - t0;
        }
        pos += n;
        int same = 0;
        for (int k = 0; k < K; k++) same += out[0][k] == out[1][k];
        printf("round %d (context %d): %d of %d drafts equal\n", r, pos, same, K);
        agree += same;
        slots += K;
    }
    printf("q8_0 vs %s drafts: %d of %d equal (%.1f %%); mean draft %.1f ms (%s) vs %.1f ms (q8_0)\n",
           fm_dtype_name(fm_drafter_matrix_type(d[0])), agree, slots, 100.0 * agree / slots, ms[0] / rounds,
           fm_dtype_name(fm_drafter_matrix_type(d[0])), ms[1] / rounds);
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_draft_agreement: %s\n", pool ? err : "cannot start threads");
done:
    qwen3_state_free(s);
    for (int i = 0; i < 2; i++) fm_drafter_free(d[i]);
    qwen3_model_free(m);
    fm_pool_free(pool);
    return rc;
}
