/* bench_cuda.c: the CUDA backend on the full-size synthetic pair (Qwen3-4B-shaped Q8_0 target, FlashMap-
 * Qwen3-4B-shaped BF16 drafter), synthesized into WORKDIR on first use. Reports device-to-device copy
 * bandwidth, plain decode tok/s and its share of the roofline (weights + KV bytes per step / copy bandwidth),
 * verify(8), verify(17) and draft time relative to a step, and end-to-end tok/s at simulated acceptance
 * (with the adaptive width: the widths chosen, and a round's time split into drafter, verify and the rest);
 * then (unless FM_BENCH_BF16_ONLY is set) the drafter rows again in the same process with the drafter's
 * Q8_0 copy (fm_drafter_quantize_q8_0, what --draft-weights q8_0 uploads), on a fresh backend.
 * FM_BENCH_QUICK: the plain steps only; FM_BENCH_TARGET_ONLY: no drafter rows.
 * usage: bench_cuda WORKDIR [prompt_len=512] [new_tokens=256] */
#include <cuda_profiler_api.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_debug.h"
#include "decode/cpu_backend.h"
#include "decode/speculative.h"
#include "model/qwen3_synth.h"
#include "../../tests/cuda/cuda_harness.h"

static int never(const void *c, int32_t id) {
    (void)c, (void)id;
    return 0;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_d);
    return v[n / 2];
}

/* n timed greedy steps after 8 untimed ones from position np (*next fed first), seconds each into ts; the
 * cache is cut back to np after. */
static int plain_steps(const fm_decode_backend *G, int np, int32_t *next, double *ts, int n, char *err,
                       size_t errlen) {
    for (int i = 0; i < 8 + n; i++) {
        const double a = hx_now();
        const int32_t in = *next;
        if (G->eval(G->ctx, &in, 1, 0, next, err, errlen)) return -1;
        if (i >= 8) ts[i - 8] = hx_now() - a;
    }
    G->rewind(G->ctx, np);
    return 0;
}

/* Prefill chunk: the engine's default on CUDA (engine.c) and the backend's row capacity. */
enum { CHUNK = 512 };

/* Prefill (chunks of CHUNK), features committed; *next: the greedy id after the prompt. */
static int prefill(fm_decode_backend *G, const int32_t *prompt, int NP, int32_t *next, char *err,
                   size_t errlen) {
    G->reset(G->ctx);
    for (int i = 0; i < NP; i += CHUNK) {
        const int n = NP - i < CHUNK ? NP - i : CHUNK;
        if (G->eval(G->ctx, prompt + i, n, 0, i + n >= NP ? next : NULL, err, errlen) ||
            G->commit_features(G->ctx, n, i, err, errlen))
            return -1;
    }
    return 0;
}

/* One generation from a fresh start (empty cache, the loop's averages reset), as a new session would run it.
 */
static int e2e(fm_decode_backend *G, const int32_t *prompt, int NP, const fm_generate_params *p,
               int32_t **ids, int *n, fm_generate_stats *st, char *err, size_t errlen) {
    fm_decode_averages avg;
    G->reset(G->ctx);
    fm_decode_averages_reset(&avg);
    return fm_decode_run(G, &avg, NULL, 0, prompt, NP, p, never, NULL, ids, n, st, err, errlen);
}

/* Plain decoding with sampling settings sp, then simulated acceptance 6.5 against its own continuation
 * (the same seed draws the same tokens at the same positions, so the drafts that match are accepted as in
 * greedy decoding): tok/s of both, against greedy plain (plain_tps) and against each other. */
static int e2e_setting(fm_decode_backend *G, const int32_t *prompt, int NP, int NEW, const fm_sampling *sp,
                       const char *label, double plain_tps, const char *tag) {
    char err[512] = "";
    fm_generate_params pp, ps;
    fm_generate_stats st;
    hx_params(&pp, NEW);
    pp.sampling = *sp;
    int32_t *ref = NULL, *ids = NULL;
    int n_ref = 0, n = 0;
    if (e2e(G, prompt, NP, &pp, &ref, &n_ref, &st, err, sizeof err))
        return fprintf(stderr, "%s: %s\n", label, err), 1;
    const double ref_tps = st.n_generated / st.decode_s;
    hx_params(&ps, NEW);
    ps.sampling = *sp, ps.speculative = 1;
    ps.sim_future = ref, ps.sim_future_len = n_ref, ps.sim_mean = 6.5, ps.sim_seed = 1;
    if (e2e(G, prompt, NP, &ps, &ids, &n, &st, err, sizeof err))
        return fprintf(stderr, "%s spec: %s\n", label, err), 1;
    printf("RESULT [%s] e2e %s: plain %.1f tok/s (%.3f x greedy plain); simulated 6.5 adaptive %.1f tok/s = "
           "%.2f x its plain; ids %s its plain\n",
           tag, label, ref_tps, ref_tps / plain_tps, st.n_generated / st.decode_s,
           st.n_generated / st.decode_s / ref_tps,
           n == n_ref && !memcmp(ids, ref, sizeof(int32_t) * n) ? "==" : "!=");
    free(ids);
    free(ref);
    return 0;
}

/* The drafter's rows: its fc1 / fc2 kernels, the draft (graph on / off) and end to end through the decoding
 * loop (plain, simulated acceptance, the real drafter). step: the plain step of this backend, seconds. */
static int drafter_rows(fm_cuda_backend *gb, fm_decode_backend *G, const fm_drafter *d, const int32_t *prompt,
                        int NP, int NEW, int32_t next, double step, double bw, const char *tag) {
    char err[512] = "";
    static const char *names[] = {"drafter fc1 (+ GELU)", "drafter fc2 (+ gated add)"};
    for (int k = 6; k < 8; k++) {
        uint64_t by = 0;
        const double us = fm_cuda_debug_time_kernel(gb, k, 16, 1, &by);
        printf("RESULT [%s] kernel %-28s T=16: %8.2f us, %6.0f GB/s = %5.1f%% of copy bandwidth\n", tag,
               names[k - 6], us, by / (us * 1e-6) / 1e9, 100.0 * by / (us * 1e-6) / (bw * 1e9));
    }
    /* The whole block with and without the graph, then 7 drafts (verify 7: the head for 8 slots), then the
     * block with the repetition and presence penalties over the prompt (draft_penalized's passes). */
    const fm_sampling penalised = {0, 0, 1, 0, 0, 0.5f, 0, 1.1f, 0}, greedy = {0, 0, 1, 0, 0, 0, 0, 0, 0};
    for (int cfg = 0; cfg < 4; cfg++) {
        const int graphs = cfg != 1, n_out = cfg == 2 ? 7 : G->block;
        if (cfg == 3) {
            if (G->set_sampling(G->ctx, &penalised, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
            G->set_history(G->ctx, prompt, NP, NP / 2);
        }
        double v[20];
        int32_t out[64];
        fm_cuda_debug_set_graphs(gb, graphs);
        for (int i = 0; i < 22; i++) {
            double a = hx_now();
            if (G->draft(G->ctx, next, NP, n_out, out, err, sizeof err))
                return fprintf(stderr, "draft: %s\n", err), 1;
            if (i >= 2) v[i - 2] = hx_now() - a;
        }
        const double dt = median(v, 20);
        printf("RESULT [%s] draft (block %d, %d out, graph %s%s): %.3f ms = %.2f x step\n", tag,
               fm_drafter_block(d), n_out, graphs ? "on" : "off",
               cfg == 3 ? ", repetition 1.1 + presence 0.5 over the prompt" : "", dt * 1e3, dt / step);
    }
    G->set_history(G->ctx, NULL, 0, 0);
    if (G->set_sampling(G->ctx, &greedy, err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
    fm_cuda_debug_set_graphs(gb, 1);
    {
        /* A round's two halves back to back as the loop runs them (a draft of 7, the verify block of 8,
         * one row kept and committed), at a fixed position: what each costs inside a round, beside the
         * draft and verify(8) alone (the context rows and whatever the one leaves the other). */
        double vd[20], vv[20];
        int32_t blk[8], rows[8];
        for (int i = 0; i < 22; i++) {
            const double a = hx_now();
            if (G->draft(G->ctx, next, NP, 7, blk + 1, err, sizeof err))
                return fprintf(stderr, "draft: %s\n", err), 1;
            const double b = hx_now();
            blk[0] = next;
            if (G->eval(G->ctx, blk, 8, 1, rows, err, sizeof err))
                return fprintf(stderr, "verify: %s\n", err), 1;
            const double c = hx_now();
            G->rewind(G->ctx, NP + 1);
            if (G->commit_features(G->ctx, 1, NP, err, sizeof err))
                return fprintf(stderr, "commit: %s\n", err), 1;
            G->rewind(G->ctx, NP);
            if (i >= 2) vd[i - 2] = b - a, vv[i - 2] = c - b;
        }
        printf("RESULT [%s] a round's halves back to back (draft 7 out, verify 8, 1 row kept): draft %.3f + "
               "verify %.3f ms\n",
               tag, median(vd, 20) * 1e3, median(vv, 20) * 1e3);
    }
    fm_generate_params p;
    fm_generate_stats st;
    int32_t *plain = NULL;
    int n_plain = 0;
    hx_params(&p, NEW);
    if (e2e(G, prompt, NP, &p, &plain, &n_plain, &st, err, sizeof err))
        return fprintf(stderr, "plain: %s\n", err), 1;
    const double plain_tps = st.n_generated / st.decode_s;
    printf("RESULT [%s] e2e plain: %d tokens, %.1f tok/s\n", tag, st.n_generated, plain_tps);
    const double means[] = {0, 4, 6.5, 8};
    /* 0: adaptive (7 drafts while acceptance is low, else the block); -1: adaptive with costs modelled row
     * by row (a row granule of 1, the model before the backend's granule of 8 reached it); 15: the most
     * drafts whose verify block keeps to two 8-row tiles. */
    const int verifies[] = {0, -1, 7, 15, 16};
    for (int vi = 0; vi < 5; vi++)
        for (int mi = 0; mi < 4; mi++) {
            fm_generate_params ps;
            hx_params(&ps, NEW);
            ps.speculative = 1, ps.verify = verifies[vi] > 0 ? verifies[vi] : 0;
            fm_decode_backend GV = *G;
            if (verifies[vi] < 0) GV.row_granule = 1;
            ps.sim_future = plain, ps.sim_future_len = n_plain, ps.sim_mean = means[mi], ps.sim_seed = 1;
            fm_round_trace trace[512]; /* rounds <= new tokens (256) */
            int n_trace = 0;
            ps.trace = trace, ps.trace_cap = 512, ps.n_trace = &n_trace;
            int32_t *ids = NULL;
            int n = 0;
            if (e2e(&GV, prompt, NP, &ps, &ids, &n, &st, err, sizeof err))
                return fprintf(stderr, "spec: %s\n", err), 1;
            const int same = n == n_plain && !memcmp(ids, plain, sizeof(int32_t) * n);
            char label[32];
            snprintf(label, sizeof label, "%d", verifies[vi]);
            printf("RESULT [%s] e2e simulated acceptance %.1f, verify %-12s: %.1f tok/s = %.2f x plain; %d "
                   "rounds, %.2f accepted/round; ids %s plain\n",
                   tag, means[mi],
                   verifies[vi] == 0    ? "adaptive"
                   : verifies[vi] == -1 ? "adaptive g=1"
                                        : label,
                   st.n_generated / st.decode_s, st.n_generated / st.decode_s / plain_tps, st.rounds,
                   st.rounds ? (double)st.accepted / st.rounds : 0.0, same ? "==" : "!=");
            if (verifies[vi] <= 0) { /* which widths the adaptive rule chose, in round order */
                printf("RESULT [%s]   adaptive%s widths at %.1f:", tag, verifies[vi] ? " g=1" : "",
                       means[mi]);
                for (int r = 0; r < n_trace; r++) printf(" %d", trace[r].verified);
                printf("\n");
                /* where a round's time goes: the drafter (the draft, and the context rows of the round
                 * before it, which the draft lines above do not include), the verify block, the rest
                 * (the loop's own work, plain steps) */
                const double rn = st.rounds > 0 ? st.rounds : 1;
                printf("RESULT [%s]   adaptive%s time at %.1f: a round %.3f ms = drafter %.3f + verify %.3f "
                       "+ rest %.3f; %d plain steps\n",
                       tag, verifies[vi] ? " g=1" : "", means[mi], 1e3 * st.decode_s / rn,
                       1e3 * st.draft_s / rn, 1e3 * st.verify_s / rn,
                       1e3 * (st.decode_s - st.draft_s - st.verify_s) / rn, st.plain_steps);
            }
            free(ids);
        }
    {
        fm_generate_params ps;
        hx_params(&ps, NEW);
        ps.speculative = 1, ps.fallback = 1;
        int32_t *ids = NULL;
        int n = 0;
        if (e2e(G, prompt, NP, &ps, &ids, &n, &st, err, sizeof err))
            return fprintf(stderr, "spec: %s\n", err), 1;
        printf("RESULT [%s] e2e real (random) drafter, adaptive + fallback: %.1f tok/s, %d rounds, %d "
               "accepted; ids %s plain\n",
               tag, st.n_generated / st.decode_s, st.rounds, st.accepted,
               n == n_plain && !memcmp(ids, plain, sizeof(int32_t) * n) ? "==" : "!=");
        free(ids);
    }
    /* Sampling (T 0.7, top-k 20, top-p 0.8: Qwen3's suggestion without thinking), then greedy with the
     * repetition and presence penalties (every draft slot penalised as the row it meets). */
    const fm_sampling sampled = {0.7f, 20, 0.8f, 0, 11, 0, 0, 0, 0};
    if (e2e_setting(G, prompt, NP, NEW, &sampled, "sampled (T 0.7, top-k 20, top-p 0.8)", plain_tps, tag) ||
        e2e_setting(G, prompt, NP, NEW, &penalised, "greedy, repetition 1.1 + presence 0.5", plain_tps, tag))
        return 1;
    free(plain);
    return 0;
}

/* Median of STEPS plain steps (graph + PDL) from the prompt's end; the cache is rewound to NP after. */
static double plain_step(fm_decode_backend *G, int32_t *next, int NP) {
    enum { N = 128 };
    double ts[N];
    char err[256];
    for (int i = 0; i < 8 + N; i++) {
        double a = hx_now();
        int32_t in = *next;
        if (G->eval(G->ctx, &in, 1, 0, next, err, sizeof err)) return -1;
        if (i >= 8) ts[i - 8] = hx_now() - a;
    }
    G->rewind(G->ctx, NP);
    return median(ts, N);
}

int main(int argc, char **argv) {
    if (argc < 2) return fprintf(stderr, "usage: bench_cuda WORKDIR [prompt_len] [new_tokens]\n"), 2;
    const int NP = argc > 2 ? atoi(argv[2]) : 512, NEW = argc > 3 ? atoi(argv[3]) : 256;
    char err[512] = "", tpath[512], ddir[512], dpath[600];
    snprintf(tpath, sizeof tpath, "%s/qwen3-4b-q8_0.gguf", argv[1]);
    snprintf(ddir, sizeof ddir, "%s/drafter", argv[1]);
    snprintf(dpath, sizeof dpath, "%s/model.safetensors", ddir);
    mkdir(ddir, 0755);
    struct stat sb;
    double t0 = hx_now();
    if (stat(tpath, &sb)) {
        qwen3_synth_params sp;
        qwen3_synth_preset("qwen3-4b", &sp);
        sp.n_threads = 16;
        if (qwen3_synth_write(&sp, tpath, err, sizeof err)) return fprintf(stderr, "synth: %s\n", err), 1;
        printf("synthesized target in %.1f s\n", hx_now() - t0);
    }
    qwen3_model *m = NULL;
    if (qwen3_model_load(tpath, &m, err, sizeof err)) return fprintf(stderr, "load: %s\n", err), 1;
    if (stat(dpath, &sb)) {
        t0 = hx_now();
        fm_drafter_synth_params dp;
        fm_drafter_synth_flashmap_4b(&dp);
        dp.seed = 7;
        if (fm_drafter_synth(&dp, m->hp.dim, m->hp.n_layers, m->hp.vocab, dpath, err, sizeof err))
            return fprintf(stderr, "synth drafter: %s\n", err), 1;
        printf("synthesized drafter in %.1f s\n", hx_now() - t0);
    }
    const int n_ctx = NP + NEW + 256 > 2048 ? NP + NEW + 256 : 2048; /* long prompts: room for them */
    fm_drafter *d = NULL;
    if (fm_drafter_load(dpath, m, NULL, n_ctx, &d, err, sizeof err))
        return fprintf(stderr, "drafter: %s\n", err), 1;
    int ncap = 0;
    const int *cap = fm_drafter_target_layers(d, &ncap);
    fm_cuda_backend *gb = NULL;
    if (getenv("FM_BENCH_PROFILE") && getenv("FM_BENCH_Q8_DRAFTER")) {
        /* profile the Q8_0 drafter's draft instead of the stored BF16 one */
        fm_pool *pool = fm_pool_create(16);
        const int rc = fm_drafter_quantize_q8_0(d, pool, err, sizeof err);
        fm_pool_free(pool);
        if (rc) return fprintf(stderr, "q8_0 drafter: %s\n", err), 1;
    }
    t0 = hx_now();
    if (fm_cuda_backend_create(m, d, n_ctx, CHUNK, cap, ncap, &gb, err, sizeof err))
        return fprintf(stderr, "cuda: %s\n", err), 1;
    printf("upload %.1f s\n", hx_now() - t0);
    /* The backend captures the step's, every verify size's and the draft's graphs at creation, so the timed
     * generations below (the adaptive width tries several sizes) pay no capture. */
    printf("RESULT graph captures at backend creation (step, verify 2..%d, draft): %.1f ms\n",
           fm_drafter_block(d) + 1, fm_cuda_debug_warm_ms(gb));
    char name[256];
    fm_cuda_debug_device_name(name, sizeof name);
    const double bw = fm_cuda_debug_copy_bandwidth((size_t)1 << 30, 20);
    fm_decode_backend G = fm_cuda_backend_ops(gb);
    const int V = m->hp.vocab;
    int32_t *prompt = malloc(sizeof(int32_t) * (NP + 64));
    uint64_t r = 99;
    for (int i = 0; i < NP + 64; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((r >> 33) % (uint64_t)V);
    }
    /* Prefill (chunks of CHUNK), features committed: the first run (kernels loaded on first use) and the
     * median of four more. */
    int32_t am[32], next = 0;
    double pf[5];
    for (int k = 0; k < 5; k++) {
        t0 = hx_now();
        if (prefill(&G, prompt, NP, &next, err, sizeof err)) return fprintf(stderr, "prefill: %s\n", err), 1;
        pf[k] = hx_now() - t0;
    }
    const double prefill_cold = pf[0], prefill_s = median(pf + 1, 4);
    /* One chunk of CHUNK rows from an empty cache: the target's forward, then the drafter's context
     * extension.
     */
    double fw[4], dc[4];
    for (int k = 0; k < 4; k++) {
        G.reset(G.ctx);
        t0 = hx_now();
        if (G.eval(G.ctx, prompt, CHUNK, 0, NULL, err, sizeof err))
            return fprintf(stderr, "eval: %s\n", err), 1;
        fm_cuda_debug_sync();
        const double t1 = hx_now();
        if (G.commit_features(G.ctx, CHUNK, 0, err, sizeof err))
            return fprintf(stderr, "features: %s\n", err), 1;
        fm_cuda_debug_sync();
        fw[k] = t1 - t0, dc[k] = hx_now() - t1;
    }
    if (prefill(&G, prompt, NP, &next, err, sizeof err)) return fprintf(stderr, "prefill: %s\n", err), 1;
    if (getenv("FM_BENCH_PROFILE")) {
        /* For `ncu --profile-from-start off`: 1: a plain step, 2: a verify(17) block, 3: a draft (the Q8_0
         * drafter with FM_BENCH_Q8_DRAFTER set), 4: a prompt chunk of CHUNK rows after the prompt, 5: a
         * verify(8) block, 6: a verify(16) block, each once warm (graphs + PDL) and then inside the profiled
         * range. */
        const int what = atoi(getenv("FM_BENCH_PROFILE"));
        for (int i = 0; i < 2; i++) {
            int32_t in = next, out[64];
            if (i == 1) cudaProfilerStart();
            const int rc = what == 1   ? G.eval(G.ctx, &in, 1, 0, &next, err, sizeof err)
                           : what == 2 ? G.eval(G.ctx, prompt + NP, 17, 1, am, err, sizeof err)
                           : what == 5 ? G.eval(G.ctx, prompt + NP, 8, 1, am, err, sizeof err)
                           : what == 6 ? G.eval(G.ctx, prompt + NP, 16, 1, am, err, sizeof err)
                           : what == 4 ? G.eval(G.ctx, prompt, CHUNK, 0, NULL, err, sizeof err)
                                       : G.draft(G.ctx, next, NP, G.block, out, err, sizeof err);
            if (rc) return fprintf(stderr, "profile: %s\n", err), 1;
            if (what != 3) G.rewind(G.ctx, NP);
        }
        cudaProfilerStop();
        return 0;
    }
    /* Plain steps: graphs + PDL (the default), graphs without PDL, no graphs. */
    enum { STEPS = 128 };
    double ts[STEPS], step = 0;
    const uint64_t wbytes = fm_cuda_debug_step_bytes(gb);
    const double kv = 2.0 * 2 * m->hp.n_layers * (NP + 68) * (double)m->hp.n_kv_heads * m->hp.head_dim;
    printf("RESULT device: %s\n", name);
    printf("RESULT copy bandwidth (read+write): %.0f GB/s\n", bw);
    int mk_stages = 0, mk_warps = 0;
    const char *mk = fm_cuda_debug_mega(gb, &mk_stages, &mk_warps);
    printf("RESULT persistent step kernel: %s (%d warps a block, %d ring stages of 4 tiles a warp)\n", mk,
           mk_warps, mk_stages);
    int mkv_rows = 0;
    const char *mkv = fm_cuda_debug_mega_verify(gb, &mkv_rows);
    printf("RESULT persistent verify blocks: %s (2..%d rows)\n", mkv, mkv_rows);
    if (getenv("FM_BENCH_MEGA_TRACE") && mk_stages) { /* where a persistent step's time goes */
        static const char *phase[18] = {"norm",    "qkv",     "barrier", "q/k norm", "barrier", "attention",
                                        "barrier", "merge",   "barrier", "act load", "wo",      "barrier",
                                        "norm",    "gate/up", "barrier", "act load", "down",    "barrier"};
        double us[3 * 18 + 16], tot = 0;
        /* FM_BENCH_MEGA_TRACE=verify: verify(8) blocks' instead */
        const int vb = !strcmp(getenv("FM_BENCH_MEGA_TRACE"), "verify");
        fm_cuda_debug_set_mega(gb, 1);
        if (fm_cuda_debug_mega_trace(gb, vb ? 2 : 1, NULL)) return fprintf(stderr, "trace: none\n"), 1;
        for (int i = 0; vb && i < 16; i++) {
            const double a = hx_now();
            if (G.eval(G.ctx, prompt + NP, 8, 1, am, err, sizeof err))
                return fprintf(stderr, "verify: %s\n", err), 1;
            ts[i] = hx_now() - a;
            G.rewind(G.ctx, NP);
        }
        if ((!vb && plain_steps(&G, NP, &next, ts, 16, err, sizeof err)) ||
            fm_cuda_debug_mega_trace(gb, 1, us) != 18)
            return fprintf(stderr, "trace: %s\n", err), 1;
        for (int i = 0; i < 18; i++) tot += us[i];
        for (int i = 0; i < 18; i++) /* block 0's, then the slowest and the fastest block's */
            printf("RESULT mega phase %-10s %7.2f us (blocks %.2f-%.2f)\n", phase[i], us[i], us[36 + i],
                   us[18 + i]);
        printf("RESULT mega layer %.2f us (block 0's clock; %s %.3f ms)\n", tot, vb ? "verify(8)" : "step",
               median(ts, 16) * 1e3);
        /* each product's time in a block by the block's groups of it (the SM's speed shows as the spread
         * among blocks of the same load); FM_BENCH_MEGA_BLOCKS=1 prints every block's phases and SM too */
        enum { MAXB = 1024 };
        static double bus[MAXB * 18];
        static int binfo[MAXB * 5];
        const int nb = fm_cuda_debug_mega_blocks(gb, bus, binfo, MAXB);
        static const int prod_phase[4] = {1, 10, 13, 16};
        static const char *prod[4] = {"qkv", "wo", "gate/up", "down"};
        for (int k = 0; k < 4; k++)
            for (int c = 0; c <= 64; c++) {
                int n = 0;
                double lo = 1e30, hi = 0, sum = 0;
                for (int b = 0; b < nb; b++) {
                    if (binfo[b * 5 + 1 + k] != c) continue;
                    const double v = bus[b * 18 + prod_phase[k]];
                    n++, sum += v, lo = v < lo ? v : lo, hi = v > hi ? v : hi;
                }
                if (n)
                    printf("RESULT mega blocks %-8s %2d groups: %3d blocks, %.2f / %.2f / %.2f us (fastest, "
                           "mean, slowest)\n",
                           prod[k], c, n, lo, sum / n, hi);
            }
        for (int b = 0; getenv("FM_BENCH_MEGA_BLOCKS") && b < nb; b++) {
            printf("RESULT mega block %3d sm %3d groups %d %d %d %d us", b, binfo[b * 5], binfo[b * 5 + 1],
                   binfo[b * 5 + 2], binfo[b * 5 + 3], binfo[b * 5 + 4]);
            for (int i = 0; i < 18; i++) printf(" %.2f", bus[b * 18 + i]);
            printf("\n");
        }
        for (int k = 0; k < 4; k++) { /* a profiling build's stalls (cuda_megakernel.cu, FM_MK_PROFILE) */
            const double *v = us + 54 + 4 * k, st = v[3] > 0 ? v[3] : 1; /* 8 + 16 steps since enabled */
            if (v[1] > 0)
                printf(
                    "RESULT mega stalls %-8s a warp, a layer: waiting %.0f cycles, issuing %.0f, streaming "
                    "%.0f in all, %.1f stages; a stage: %.0f waiting, %.0f issuing, %.0f the rest\n",
                    prod[k], v[0] / 24, v[1] / 24, v[2] / 24, v[3] / 24, v[0] / st, v[1] / st,
                    (v[2] - v[0] - v[1]) / st);
        }
        return 0;
    }
    if (getenv("FM_BENCH_MEGA_AB") && mk_stages) { /* plain steps, persistent kernel off / on, alternated */
        for (int round = 0; round < 3; round++)
            for (int on = 0; on < 2; on++) {
                fm_cuda_debug_set_mega(gb, on);
                if (plain_steps(&G, NP, &next, ts, STEPS, err, sizeof err))
                    return fprintf(stderr, "step: %s\n", err), 1;
                printf("RESULT round %d plain step, persistent kernel %s: %.3f ms\n", round,
                       on ? "on " : "off", median(ts, STEPS) * 1e3);
            }
        return 0;
    }
    printf("RESULT prefill %d tokens: %.1f ms (%.0f tok/s); first run %.1f ms\n", NP, prefill_s * 1e3,
           NP / prefill_s, prefill_cold * 1e3);
    printf("RESULT prefill chunk of %d rows: target forward %.2f ms, drafter context %.2f ms\n", CHUNK,
           median(fw, 4) * 1e3, median(dc, 4) * 1e3);
    for (int cfg = 0; cfg < 3; cfg++) {
        const int graphs = cfg < 2, pdl = cfg != 1;
        fm_cuda_debug_set_graphs(gb, graphs);
        fm_cuda_debug_set_pdl(gb, pdl);
        if (plain_steps(&G, NP, &next, ts, STEPS, err, sizeof err))
            return fprintf(stderr, "step: %s\n", err), 1;
        const double t = median(ts, STEPS);
        printf("RESULT plain step (graphs %s, PDL %s): %.3f ms = %.1f tok/s; %.1f%% of roofline\n",
               graphs ? "on" : "off", pdl ? "on" : "off", t * 1e3, 1 / t,
               100.0 * (wbytes + kv) / t / (bw * 1e9));
        if (cfg == 0) step = t;
        if (getenv("FM_BENCH_PERSIST")) { /* the persistent-launch experiment (cuda_q8_persist.cu) */
            static const char *forms[] = {"graph of launches",         "persistent, blocks",
                                          "persistent, ring",          "persistent, bulk ring 2x8",
                                          "persistent, bulk ring 4x4", "persistent, bulk ring 8x3"};
            for (int f = 1; f < 5; f++)
                printf("RESULT persist: %s == engine launches bit for bit: %s\n", forms[f + 1],
                       fm_cuda_debug_persist(gb, f, -1) == 0 ? "yes (5 of 5 products)" : "NO");
            for (int f = 1; f < 5; f++) /* the rings' stream and products alone */
                printf("RESULT persist: step's 145 products, %-26s %-9s %.3f ms\n", forms[f + 1],
                       "stream+mma", fm_cuda_debug_persist(gb, f, 2));
            for (int rep = 0; rep < 3; rep++)
                for (int f = -1; f < 5; f++)
                    for (int w = 1; w >= 0; w--)
                        printf("RESULT persist: step's 145 products, %-26s %-9s %.3f ms\n", forms[f + 1],
                               f < 0 ? (w ? "PDL" : "no PDL") : (w ? "waits" : "no waits"),
                               fm_cuda_debug_persist(gb, f, w));
            return 0;
        }
        if (getenv("FM_BENCH_QUICK")) return 0; /* the plain step only (kernel-variant sweeps) */
    }
    fm_cuda_debug_set_graphs(gb, 1);
    fm_cuda_debug_set_pdl(gb, 1);
    printf("RESULT bytes/step %.3f GB weights + %.3f GB KV; roofline %.1f tok/s at the copy bandwidth\n",
           wbytes / 1e9, kv / 1e9, bw * 1e9 / (wbytes + kv));
    printf("RESULT plain step (graph + PDL): %.3f ms = %.1f tok/s = %.1f%% of roofline\n", step * 1e3,
           1 / step, 100.0 * (wbytes + kv) / step / (bw * 1e9));
    /* Each kernel group alone (graph of one launch per layer, weights not in L2), at 1, 8 and 17 rows. */
    {
        static const char *names[] = {"qkv (+RMSNorm, quantise)",           "wo",
                                      "gate/up (+RMSNorm, SiLU, quantise)", "down",
                                      "lm_head (+RMSNorm, quantise)",       "attention (splits + merge)"};
        /* 16 rows: a whole-block draft's lm_head; 128 and CHUNK rows: prefill chunks (the wide product
         * kernel; its int8 rate in TOP/s) */
        const int Ts[] = {1, 8, 16, 17, 128, CHUNK};
        int32_t in = next;
        G.eval(G.ctx, &in, 1, 0, NULL, err, sizeof err); /* position NP + 1: a cache row to attend to */
        for (int k = 0; k < 6; k++)
            for (int ti = 0; ti < (int)(sizeof Ts / sizeof Ts[0]); ti++) {
                uint64_t by = 0;
                const int T = Ts[ti];
                const double us = fm_cuda_debug_time_kernel(gb, k, T, 1, &by);
                if (by && T > 32)
                    printf("RESULT kernel %-36s T=%3d: %8.2f us, %6.1f int8 TOP/s\n", names[k], T, us,
                           2.0 * (double)by * 32 / 34 * T / (us * 1e-6) / 1e12);
                else if (by)
                    printf("RESULT kernel %-36s T=%3d: %8.2f us, %6.0f GB/s = %5.1f%% of copy bandwidth\n",
                           names[k], T, us, by / (us * 1e-6) / 1e9, 100.0 * by / (us * 1e-6) / (bw * 1e9));
                else
                    printf("RESULT kernel %-36s T=%3d: %8.2f us\n", names[k], T, us);
            }
        G.rewind(G.ctx, NP);
    }
    static const int verify_rows[] = {8, 9, 16, 17}; /* each side of the second and third 8-row tile */
    for (int vr = 0; vr < 4; vr++) {
        const int T = verify_rows[vr];
        double v[20];
        for (int i = 0; i < 22; i++) {
            double a = hx_now();
            if (G.eval(G.ctx, prompt + NP, T, 1, am, err, sizeof err))
                return fprintf(stderr, "verify: %s\n", err), 1;
            if (i >= 2) v[i - 2] = hx_now() - a;
            G.rewind(G.ctx, NP);
        }
        const double vt = median(v, 20);
        printf("RESULT verify(%d): %.3f ms = %.2f x step\n", T, vt * 1e3, vt / step);
    }
    {
        /* Sampling's cost on the same rows (cuda_sample.cuh): Qwen3's suggested settings (top-k tiers), the
         * temperature alone (the chunk draw), top-p alone (on these random weights its tiers hold more than
         * the GPU brings back, so each row is read whole: the worst case). */
        static const fm_sampling modes[] = {{0.7f, 20, 0.8f, 0, 1, 0, 0, 0, 0},
                                            {1.0f, 0, 1, 0, 1, 0, 0, 0, 0},
                                            {1.0f, 0, 0.95f, 0, 1, 0, 0, 0, 0}};
        for (int k = 0; k < 3; k++) {
            if (G.set_sampling(G.ctx, &modes[k], err, sizeof err)) return fprintf(stderr, "%s\n", err), 1;
            const double st = plain_step(&G, &next, NP);
            double v[10];
            for (int i = 0; i < 12; i++) {
                double a = hx_now();
                if (G.eval(G.ctx, prompt + NP, 17, 1, am, err, sizeof err))
                    return fprintf(stderr, "verify: %s\n", err), 1;
                if (i >= 2) v[i - 2] = hx_now() - a;
                G.rewind(G.ctx, NP);
            }
            printf("RESULT sampled (T %.1f, top-k %d, top-p %.2f): step %.3f ms = %.3f x greedy, verify(17) "
                   "%.3f "
                   "ms\n",
                   (double)modes[k].temperature, modes[k].top_k, (double)modes[k].top_p, st * 1e3, st / step,
                   median(v, 10) * 1e3);
        }
        const fm_sampling greedy = {0, 0, 1, 0, 0, 0, 0, 0, 0};
        G.set_sampling(G.ctx, &greedy, err, sizeof err);
    }
    if (getenv("FM_BENCH_TARGET_ONLY")) return 0; /* the target's rows only (attention-variant sweeps) */
    if (drafter_rows(gb, &G, d, prompt, NP, NEW, next, step, bw, "bf16 drafter")) return 1;
    fm_cuda_backend_free(gb);
    gb = NULL;
    if (!getenv("FM_BENCH_BF16_ONLY")) {
        /* The same drafter's Q8_0 copy on a fresh backend (same target weights, same prompt). */
        fm_pool *pool = fm_pool_create(16);
        t0 = hx_now();
        if (fm_drafter_quantize_q8_0(d, pool, err, sizeof err) ||
            fm_cuda_backend_create(m, d, n_ctx, CHUNK, cap, ncap, &gb, err, sizeof err))
            return fprintf(stderr, "q8_0 drafter: %s\n", err), 1;
        fm_pool_free(pool);
        printf("quantise + upload %.1f s\n", hx_now() - t0);
        G = fm_cuda_backend_ops(gb);
        if (prefill(&G, prompt, NP, &next, err, sizeof err)) return fprintf(stderr, "prefill: %s\n", err), 1;
        const double step_q = plain_step(&G, &next, NP);
        printf("RESULT [q8_0 drafter] plain step (graph + PDL): %.3f ms (this backend)\n", step_q * 1e3);
        if (drafter_rows(gb, &G, d, prompt, NP, NEW, next, step_q, bw, "q8_0 drafter")) return 1;
        fm_cuda_backend_free(gb);
    }
    free(prompt);
    fm_drafter_free(d);
    qwen3_model_free(m);
    return 0;
}
