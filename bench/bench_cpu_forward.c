/* bench_cpu_forward.c: issue 6's per-step ratios on any CPU, without llama.cpp: a plain step, verify(8) and
 * verify(17) (the engine verifies K drafts as a block of K + 1 rows: 9 and 18), one draft (all 16 slots, and
 * the 7 a verify(7) round asks for) and a 256-token prefill chunk of the full-size synthetic pair
 * (Qwen3-4B-shaped Q8_0 target, FlashMap-Qwen3-4B-shaped BF16 drafter drafting on its Q8_0 copy), each the
 * median of REPS calls, with the target's weights in huge pages as the engine keeps them. For machines where
 * `flashmap bench` cannot run (the GPU machine's CPU: no llama.cpp, no libcurl); `flashmap bench` is the full
 * comparison. Usage: bench_cpu_forward WORKDIR [threads=2] [reps=5] [prefill_reps=reps] [ab] (synthesizes
 * the pair into WORKDIR on first use). With `ab` on a CPU with AMX the reps alternate between the AMX kernel
 * off and on, in one process (same weights, same pages), and both columns are printed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "cpu/cpu_features.h"
#include "drafter/flashmap_drafter.h"
#include "model/qwen3_synth.h"

enum { CONTEXT = 64, MAX_REPS = 64 };

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return 1e3 * (double)ts.tv_sec + 1e-6 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static int synth_pair(const char *dir, const char *tpath, const char *dpath, char *err, size_t errlen) {
    struct stat sb;
    if (stat(tpath, &sb)) {
        qwen3_synth_params sp;
        qwen3_synth_preset("qwen3-4b", &sp);
        fprintf(stderr, "synthesizing the target into %s\n", tpath);
        if (qwen3_synth_write(&sp, tpath, err, errlen)) return -1;
    }
    if (stat(dpath, &sb)) {
        char ddir[1024];
        snprintf(ddir, sizeof ddir, "%s/drafter", dir);
        mkdir(ddir, 0755);
        fm_drafter_synth_params dp;
        fm_drafter_synth_flashmap_4b(&dp);
        dp.seed = 7;
        fprintf(stderr, "synthesizing the drafter into %s\n", dpath);
        /* Shape of the qwen3-4b preset: 2560 wide, 36 layers, 151,936 tokens. */
        if (fm_drafter_synth(&dp, 2560, 36, 151936, dpath, err, errlen)) return -1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cpu_forward WORKDIR [threads=2] [reps=5] [prefill_reps=reps] [ab]\n");
        return 2;
    }
    const int threads = argc > 2 ? atoi(argv[2]) : 2, reps = argc > 3 ? atoi(argv[3]) : 5;
    const int pre_reps = argc > 4 ? atoi(argv[4]) : reps;
    const int ab = argc > 5 && strcmp(argv[5], "ab") == 0 && fm_cpu_amx();
    if (threads < 1 || reps < 1 || reps > MAX_REPS || pre_reps < 1 || pre_reps > reps) {
        fprintf(stderr, "bench_cpu_forward: threads >= 1, reps in 1..%d, prefill_reps in 1..reps\n",
                MAX_REPS);
        return 2;
    }
    char err[512] = "", tpath[1024], dpath[1100];
    snprintf(tpath, sizeof tpath, "%s/qwen3-4b-q8_0.gguf", argv[1]);
    snprintf(dpath, sizeof dpath, "%s/drafter/model.safetensors", argv[1]);
    qwen3_model *m = NULL;
    qwen3_state *s = NULL;
    fm_drafter *d = NULL;
    fm_pool *pool = fm_pool_create(threads);
    int rc = 1;
    if (!pool || synth_pair(argv[1], tpath, dpath, err, sizeof err) ||
        qwen3_model_load(tpath, &m, err, sizeof err) ||
        fm_drafter_load(dpath, m, NULL, 1024, &d, err, sizeof err) ||
        fm_drafter_quantize_q8_0(d, pool, err, sizeof err) || fm_drafter_pack_q8_0(d, pool, err, sizeof err))
        goto fail;
    const int resident = qwen3_model_make_resident(m, pool);
    int n_cap;
    const int *cap = fm_drafter_target_layers(d, &n_cap);
    qwen3_state_params sp = {1024, 256, cap, n_cap};
    if (qwen3_state_create(m, &sp, &s, err, sizeof err)) goto fail;
    int32_t ids[256];
    for (int i = 0; i < 256; i++) ids[i] = (int32_t)((i * 7919 + 13) % m->hp.vocab);
    if (qwen3_forward(m, s, pool, ids, CONTEXT, QWEN3_OUT_NONE, err, sizeof err) ||
        fm_drafter_extend_context(d, pool, qwen3_state_features(s), CONTEXT, 0, err, sizeof err))
        goto fail;

    /* Each measurement runs at context 64 and rewinds; a first untimed round warms every path. With `ab` the
     * configurations alternate within each rep. */
    const int n_cfg = ab ? 2 : 1;
    const int sizes[4] = {1, 9, 18, 256}; /* a step, verify(8), verify(17), a prefill chunk */
    static double t[2][6][MAX_REPS];
    for (int r = -1; r < reps; r++)
        for (int c = 0; c < n_cfg; c++) {
            if (ab) fm_cpu_set_amx(c);
            for (int k = 0; k < 4; k++) {
                if (k == 3 && r >= pre_reps) continue;
                if (k == 3 && r < 0) continue; /* every product was warmed by the smaller blocks */
                const double t0 = now_ms();
                if (qwen3_forward(m, s, pool, ids, sizes[k], k == 3 ? QWEN3_OUT_NONE : QWEN3_OUT_ALL_ARGMAX,
                                  err, sizeof err))
                    goto fail;
                if (r >= 0) t[c][k][r] = now_ms() - t0;
                qwen3_state_rewind(s, CONTEXT);
            }
            const int n_out[2] = {fm_drafter_block(d), 7};
            for (int k = 0; k < 2; k++) {
                int32_t out[FM_DRAFTER_MAX_BLOCK];
                const double t0 = now_ms();
                if (fm_drafter_draft(d, pool, ids[CONTEXT - 1], CONTEXT, n_out[k], out, err, sizeof err))
                    goto fail;
                if (r >= 0) t[c][4 + k][r] = now_ms() - t0;
            }
        }
    printf("isa %s, %d threads, weights in %s, medians of %d (prefill: %d)%s\n", fm_isa_name(fm_cpu_isa()),
           threads, resident ? "2 MiB pages" : "file pages", reps, pre_reps,
           ab ? ", AMX off / on alternating in one process" : "");
    for (int c = 0; c < n_cfg; c++) {
        const int amx = ab ? c : fm_cpu_amx();
        const double step = median(t[c][0], reps), v8 = median(t[c][1], reps), v17 = median(t[c][2], reps),
                     pre = median(t[c][3], pre_reps), draft = median(t[c][4], reps),
                     draft7 = median(t[c][5], reps);
        printf("-- AMX %s%s\n", amx ? "on" : "off", !ab && amx ? " (FLASHMAP_NO_AMX=1 turns it off)" : "");
        printf("plain step      %8.1f ms\n", step);
        printf("verify(8)       %8.1f ms = %.2f steps (9 rows; issue 6 goal <= 1.3)\n", v8, v8 / step);
        printf("verify(17)      %8.1f ms = %.2f steps (18 rows; goal <= 1.7)\n", v17, v17 / step);
        printf("draft (16)      %8.1f ms = %.2f steps (goal <= 0.35)\n", draft, draft / step);
        printf("draft (7 slots) %8.1f ms = %.2f steps (the head of the first 7 slots only)\n", draft7,
               draft7 / step);
        printf("prefill 256     %8.1f ms = %.1f tok/s\n", pre, 256e3 / pre);
    }
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "bench_cpu_forward: %s\n", pool ? err : "cannot start threads");
done:
    fm_drafter_free(d);
    qwen3_state_free(s);
    qwen3_model_free(m);
    fm_pool_free(pool);
    return rc;
}
