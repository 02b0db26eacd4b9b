/* cmd_bench.c: `flashmap bench`: one table of the engine's speed on a model pair, beside llama.cpp measured
 * on the same GGUF in the same run: plain step, verify(8), verify(17), one draft (each also as a multiple of
 * a plain step), prefill, plain decoding, speculative decoding at SIMULATED mean acceptance 0 / 2 / 4 / 6.5 /
 * 8 (output checked identical to plain decoding), the measured read bandwidth and the memory roofline.
 *
 * Method: every figure is a median over repetitions (the bandwidth: the best pass, as STREAM reports); the
 * short measurements (step, verify, draft, bandwidth) repeat --reps times, the long ones (prefill,
 * end-to-end, llama-bench) --long-reps times, all interleaved in one loop so a noisy phase of the machine
 * hits every column alike. An untimed step before each repetition keeps the mmap'd weights hot (they slow
 * down after idle). No figure is asserted anywhere: this only reports. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_e2e.h"
#include "bench_llama.h"
#include "bench_machine.h"
#include "bench_stream.h"
#include "bench_target.h"
#include "bench_util.h"
#include "cli.h"
#include "cli_common.h"
#include "cli_engine.h"
#include "flashmap.h"

#define CMD "bench"

static const double SIM_MEANS[] = {0, 2, 4, 6.5, 8};
/* The sampled rows: Qwen3's suggested settings without thinking, simulated acceptance 6.5. */
static const fm_sampling SAMPLED = {0.7f, 20, 0.8f, 0, 7, 0, 0, 0, 0};
static const double SAMPLED_SIM = 6.5;
enum { N_SIM = sizeof SIM_MEANS / sizeof SIM_MEANS[0], N_COLS = 6, MAX_ROWS = 24, CELL = 160 };

typedef struct {
    cli_engine_opts eng; /* no --device (CPU only), no --ctx (sized from --prompt and --gen) */
    const char *llama_bench, *out;
    int reps, long_reps, prompt, gen, prefill, stream_mib;
    long seed;
} bench_opts;

typedef struct {
    bench_samples step, v8, v17, draft, prefill, bw, plain_tps;
    bench_samples sim_tps[N_SIM], sim_acc[N_SIM], sim_rounds[N_SIM], sim_plain[N_SIM];
    int sim_mismatch[N_SIM], plain_mismatch;
    bench_samples samp_plain_tps, samp_sim_tps, samp_sim_acc;
    int samp_mismatch;
    bench_llama llama;
    int llama_failed;
    char llama_error[FM_ERRBUF_SIZE];
} bench_results;

static void usage(FILE *f) {
    fprintf(
        f,
        "usage: flashmap bench -m TARGET.gguf [-d DRAFTER] [-t THREADS] [--llama-bench PATH] [--reps N]\n"
        "                      [--long-reps N] [--out FILE.md] [more options]\n\n"
        "Prints one table: plain step, verify(8), verify(17), one draft, prefill, plain decoding and\n"
        "speculative decoding at SIMULATED mean acceptance 0/2/4/6.5/8 (output checked identical to plain\n"
        "decoding), both again sampled (T 0.7, top-k 20, top-p 0.8; acceptance 6.5), llama.cpp's decode\n"
        "and prefill on the same GGUF (llama-bench, same run, same threads),\n"
        "the measured read bandwidth and the memory roofline. Figures are medians of interleaved "
        "repetitions (the bandwidth is the best pass).\n\n"
        "  -m PATH             target model (Qwen3 dense GGUF)\n"
        "  -d PATH             FlashMap drafter (.safetensors or a folder); without it no draft/speculative "
        "rows\n"
        "  -t N                threads for flashmap, llama-bench and the bandwidth probe (default: all "
        "cores)\n"
        "  --llama-bench PATH  llama.cpp's llama-bench (bench/build_llamacpp.sh builds it); without it the\n"
        "                      llama.cpp columns say 'not measured'\n"
        "  --reps N            repetitions of step, verify, draft, bandwidth (default 5)\n"
        "  --long-reps N       repetitions of prefill, end-to-end and llama-bench (default 3, at most "
        "--reps)\n"
        "  --prompt N          context tokens under every step/verify/draft and end-to-end prompt (default "
        "64)\n"
        "  --gen N             new tokens per end-to-end run (default 64, as llama-bench's tg64)\n"
        "  --prefill N         prefill prompt length (default 512, as llama-bench's pp512)\n"
        "  --verify MODE       speculative verify width: adaptive (default, the engine's) or a fixed K\n"
        "  --no-fallback       speculative runs never fall back to plain steps\n"
        "  --no-spec           no draft/speculative rows even with -d\n"
        "  --mmap              read the weights from the file mapping instead of huge pages\n"
        "  --draft-weights W   auto/q8_0 (a Q8_0 copy of the drafter, the default) or stored (BF16)\n"
        "  --seed N            prompt ids and simulated-acceptance draws (default 1)\n"
        "  --stream-mib N      bandwidth probe buffer in MiB (default 1024; far above the caches)\n"
        "  --out FILE          append the table, the machine description and the command to FILE "
        "(markdown)\n");
}

static int parse(int argc, char **argv, bench_opts *o) {
    memset(o, 0, sizeof *o);
    o->reps = 5;
    o->long_reps = 3;
    o->prompt = 64;
    o->gen = 64;
    o->prefill = 512;
    cli_engine_opts_init(&o->eng);
    o->stream_mib = 1024;
    o->seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        long n;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            exit(0);
        }
        const int engine = cli_engine_opt(
            CMD, argc, argv, &i, CLI_ENGINE_NO_DEVICE | CLI_ENGINE_NO_CTX | CLI_ENGINE_NO_SAMPLING, &o->eng);
        if (engine < 0) return -1;
        if (engine) continue;
#define VALUE()                                                                                              \
    if (!(v = cli_value(CMD, argc, argv, &i))) return -1
#define INT_OPT(field, lo, hi)                                                                               \
    VALUE();                                                                                                 \
    if (cli_parse_int(CMD, a, v, lo, hi, &n)) return -1;                                                     \
    o->field = (int)n
        if (!strcmp(a, "--llama-bench")) {
            VALUE();
            o->llama_bench = v;
        } else if (!strcmp(a, "--out")) {
            VALUE();
            o->out = v;
        } else if (!strcmp(a, "--reps")) {
            INT_OPT(reps, 1, BENCH_MAX_SAMPLES);
        } else if (!strcmp(a, "--long-reps")) {
            INT_OPT(long_reps, 1, BENCH_MAX_SAMPLES);
        } else if (!strcmp(a, "--prompt")) {
            INT_OPT(prompt, 1, 256);
        } else if (!strcmp(a, "--gen")) {
            INT_OPT(gen, 2, 4096);
        } else if (!strcmp(a, "--prefill")) {
            INT_OPT(prefill, 1, 8192);
        } else if (!strcmp(a, "--stream-mib")) {
            INT_OPT(stream_mib, 1, 1 << 16);
        } else if (!strcmp(a, "--seed")) {
            VALUE();
            if (cli_parse_int(CMD, a, v, 0, 2147483647L, &n)) return -1;
            o->seed = n;
        } else {
            fprintf(stderr, "flashmap " CMD ": unknown option '%s' (see flashmap bench --help)\n", a);
            return -1;
        }
#undef VALUE
#undef INT_OPT
    }
    if (!o->eng.model) {
        fprintf(stderr, "flashmap " CMD ": no target model given (-m TARGET.gguf)\n");
        return -1;
    }
    if (o->prompt > o->prefill) o->prompt = o->prefill;
    if (o->long_reps > o->reps) o->long_reps = o->reps;
    return 0;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- the table ---- */

typedef struct {
    char cell[MAX_ROWS][N_COLS][CELL];
    int n;
} table;

static void row(table *t, const char *c0, const char *c1, const char *c2, const char *c3, const char *c4,
                const char *c5) {
    if (t->n == MAX_ROWS) return;
    const char *c[N_COLS] = {c0, c1, c2, c3, c4, c5};
    for (int i = 0; i < N_COLS; i++) snprintf(t->cell[t->n][i], CELL, "%s", c[i] ? c[i] : "");
    t->n++;
}

static void table_print(const table *t, FILE *f) {
    int w[N_COLS] = {0};
    for (int r = 0; r < t->n; r++)
        for (int i = 0; i < N_COLS; i++) {
            const int len = (int)strlen(t->cell[r][i]);
            if (len > w[i]) w[i] = len;
        }
    for (int r = 0; r < t->n; r++) {
        for (int i = 0; i < N_COLS; i++) fprintf(f, "| %-*s ", w[i], t->cell[r][i]);
        fprintf(f, "|\n");
        if (r == 0) {
            for (int i = 0; i < N_COLS; i++) {
                fprintf(f, "|");
                for (int k = 0; k < w[i] + 2; k++) fputc('-', f);
            }
            fprintf(f, "|\n");
        }
    }
}

/* snprintf into a cell-sized buffer; returns it. */
static const char *fmt(char *buf, const char *format, ...) __attribute__((format(printf, 2, 3)));
static const char *fmt(char *buf, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    vsnprintf(buf, CELL, format, ap);
    va_end(ap);
    return buf;
}

/* Decimals that keep about three significant digits of a time in ms (tiny test models take microseconds). */
static int ms_digits(double ms) {
    return ms >= 10 || !(ms == ms) ? 1 : ms >= 1 ? 2 : 3;
}

static void build_table(const bench_opts *o, const fm_engine_info *info, const bench_results *r, table *t) {
    char a[CELL], b[CELL], c[CELL], d[CELL], e[CELL];
    const int have_llama = o->llama_bench && r->llama.runs > 0;
    const char *no_llama = o->llama_bench ? "failed (see below)" : "not measured (no --llama-bench)";
    const char *no_drafter = "not measured (no -d)";
    const double step = bench_median(&r->step);
    const double tg = bench_median(&r->llama.tg_ts);
    const double llama_step = have_llama && r->llama.tg_ts.n ? 1e3 / tg : NAN;
    row(t, "measurement", "flashmap", "per plain step", "llama.cpp", "flashmap speed vs llama.cpp", "notes");

    row(t, "plain step (T=1)", fmt(a, "%.*f ms", ms_digits(step), step), "1.00",
        have_llama ? fmt(b, "%.*f ms (1000/tg%d)", ms_digits(llama_step), llama_step, o->gen) : no_llama,
        have_llama ? fmt(c, "%.2fx", llama_step / step) : "-",
        fmt(d, "median of %d; context %d tokens; argmax of the row", r->step.n, o->prompt));
    const bench_samples *v[2] = {&r->v8, &r->v17};
    const int vt[2] = {8, 17};
    for (int i = 0; i < 2; i++) {
        const double ms = bench_median(v[i]);
        const bench_samples *pp = have_llama ? bench_llama_pp_samples(&r->llama, vt[i]) : NULL;
        const double lms = pp && pp->n ? 1e3 * vt[i] / bench_median(pp) : NAN;
        row(t, fmt(e, "verify(%d) (T=%d)", vt[i], vt[i]), fmt(a, "%.*f ms", ms_digits(ms), ms),
            fmt(b, "%.2f", ms / step),
            pp ? fmt(c, "%.*f ms = %.2f steps (%d/pp%d)", ms_digits(lms), lms, lms / llama_step, vt[i], vt[i])
               : no_llama,
            pp ? fmt(d, "%.2fx", lms / ms) : "-", "one forward of the block, argmax of every row");
    }
    if (info->has_drafter) {
        const double ms = bench_median(&r->draft);
        row(t, "draft (one drafter forward)", fmt(a, "%.*f ms", ms_digits(ms), ms), fmt(b, "%.2f", ms / step),
            "-", "-",
            fmt(c, "%d slots; drafter dim %d, %d layers, %d captures, %s weights", info->drafter_block,
                info->drafter_dim, info->drafter_layers, info->drafter_n_capture, info->drafter_weight_type));
    } else {
        row(t, "draft (one drafter forward)", no_drafter, "-", "-", "-", "");
    }
    {
        const double ours = bench_median(&r->prefill);
        const bench_samples *pp = have_llama ? bench_llama_pp_samples(&r->llama, o->prefill) : NULL;
        const double theirs = pp && pp->n ? bench_median(pp) : NAN;
        row(t, fmt(e, "prefill %d tokens", o->prefill), fmt(a, "%.1f tok/s", ours), "-",
            pp ? fmt(b, "%.1f tok/s (pp%d)", theirs, o->prefill) : no_llama,
            pp ? fmt(c, "%.2fx", ours / theirs) : "-",
            fmt(d, "median of %d; target only, chunks of the engine's prefill size", r->prefill.n));
    }
    const double plain = bench_median(&r->plain_tps);
    row(t, fmt(e, "plain decode (%d new tokens)", o->gen), fmt(a, "%.2f tok/s", plain), "-",
        have_llama ? fmt(b, "%.2f tok/s (tg%d)", tg, o->gen) : no_llama,
        have_llama ? fmt(c, "%.2fx", plain / tg) : "-",
        fmt(d, "median of %d; %d-token prompt; output is the reference%s", r->plain_tps.n, o->prompt,
            r->plain_mismatch ? "; MISMATCH between plain runs" : ""));
    for (int i = 0; i < N_SIM; i++) {
        fmt(e, "speculative, SIMULATED acceptance %g", SIM_MEANS[i]);
        if (!info->has_drafter) {
            row(t, e, no_drafter, "-", "-", "-", "");
            continue;
        }
        const double tps = bench_median(&r->sim_tps[i]);
        row(t, e, fmt(a, "%.2f tok/s", tps), fmt(b, "%.2fx plain decode", tps / plain), "-",
            have_llama ? fmt(c, "%.2fx", tps / tg) : "-",
            fmt(d, "measured %.2f accepted/round, %.0f rounds, %.0f plain steps; output %s",
                bench_median(&r->sim_acc[i]), bench_median(&r->sim_rounds[i]), bench_median(&r->sim_plain[i]),
                r->sim_mismatch[i] ? "MISMATCH" : "OK"));
    }
    const double samp = bench_median(&r->samp_plain_tps);
    row(t, "plain decode, sampled (T 0.7, top-k 20, top-p 0.8)", fmt(a, "%.2f tok/s", samp),
        fmt(b, "%.2fx greedy plain decode", samp / plain), "-", have_llama ? fmt(c, "%.2fx", samp / tg) : "-",
        fmt(d, "median of %d; output is the sampled reference", r->samp_plain_tps.n));
    if (info->has_drafter) {
        const double tps = bench_median(&r->samp_sim_tps);
        row(t, fmt(e, "speculative, SIMULATED acceptance %g, sampled", SAMPLED_SIM),
            fmt(a, "%.2f tok/s", tps), fmt(b, "%.2fx sampled plain decode", tps / samp), "-",
            have_llama ? fmt(c, "%.2fx", tps / tg) : "-",
            fmt(d, "measured %.2f accepted/round; output %s", bench_median(&r->samp_sim_acc),
                r->samp_mismatch ? "MISMATCH" : "OK"));
    } else {
        row(t, fmt(e, "speculative, SIMULATED acceptance %g, sampled", SAMPLED_SIM), no_drafter, "-", "-",
            "-", "");
    }
    /* The best pass, as STREAM reports: the roofline is what the memory can deliver, and a pass slowed by a
     * neighbour on a shared machine would put it below what the steps themselves achieve. */
    const double bw = bench_max(&r->bw);
    row(t, fmt(e, "read bandwidth (STREAM-like, %d threads)", info->n_threads), fmt(a, "%.1f GB/s", bw), "-",
        "-", "-",
        fmt(b, "best of %d passes over %d MiB; median %.1f GB/s", r->bw.n, o->stream_mib,
            bench_median(&r->bw)));
    const double roof_ms = (double)info->weight_bytes / (bw * 1e9) * 1e3;
    row(t, "roofline step (weight bytes / bandwidth)", fmt(a, "%.*f ms", ms_digits(roof_ms), roof_ms),
        fmt(b, "flashmap step at %.0f%%", 100 * roof_ms / step),
        have_llama ? fmt(c, "llama.cpp step at %.0f%%", 100 * roof_ms / llama_step) : no_llama, "-",
        fmt(d, "%.3f GB of weights read per token; %s%s", (double)info->weight_bytes * 1e-9,
            info->huge_pages ? "weights in 2 MiB pages" : "weights in 4 KiB file pages",
            info->repacked ? ", Q8_0 repacked for the VNNI kernel" : ""));
}

/* ---- the run ---- */

static int one_rep(const bench_opts *o, fm_engine *e, const fm_engine_info *info, bench_target *bt,
                   bench_e2e *be, bench_e2e *bsamp, bench_stream *bs, fm_pool *pool, int rep,
                   bench_results *r, char *err, size_t errlen) {
    double ms;
    fprintf(stderr, "bench: repetition %d/%d: step, verify, draft, bandwidth\n", rep + 1, o->reps);
    if (bench_target_warm(bt, err, errlen)) return -1;
    if (bench_target_forward_ms(bt, 1, &ms, err, errlen)) return -1;
    bench_samples_add(&r->step, ms);
    if (bench_target_forward_ms(bt, 8, &ms, err, errlen)) return -1;
    bench_samples_add(&r->v8, ms);
    if (bench_target_forward_ms(bt, 17, &ms, err, errlen)) return -1;
    bench_samples_add(&r->v17, ms);
    if (info->has_drafter) {
        if (bench_target_draft_ms(bt, &ms, err, errlen)) return -1;
        bench_samples_add(&r->draft, ms);
    }
    bench_samples_add(&r->bw, bench_stream_read_gbs(bs, pool));
    if (rep >= o->long_reps) return 0;

    fprintf(stderr, "bench: repetition %d/%d: prefill %d, plain and speculative decoding\n", rep + 1,
            o->long_reps, o->prefill);
    if (bench_target_warm(bt, err, errlen)) return -1;
    double tps;
    if (bench_target_prefill_tps(bt, &tps, err, errlen)) return -1;
    bench_samples_add(&r->prefill, tps);
    bench_e2e_result res;
    if (bench_e2e_plain(be, &res, err, errlen)) return -1;
    bench_samples_add(&r->plain_tps, res.tok_s);
    r->plain_mismatch |= !res.identical;
    for (int i = 0; info->has_drafter && i < N_SIM; i++) {
        if (bench_e2e_simulated(be, SIM_MEANS[i], (uint64_t)o->seed * 1000 + (uint64_t)rep, &res, err,
                                errlen))
            return -1;
        bench_samples_add(&r->sim_tps[i], res.tok_s);
        bench_samples_add(&r->sim_acc[i], res.mean_accepted);
        bench_samples_add(&r->sim_rounds[i], res.rounds);
        bench_samples_add(&r->sim_plain[i], res.plain_steps);
        r->sim_mismatch[i] |= !res.identical;
    }
    if (bench_e2e_plain(bsamp, &res, err, errlen)) return -1;
    bench_samples_add(&r->samp_plain_tps, res.tok_s);
    r->samp_mismatch |= !res.identical;
    if (info->has_drafter) {
        if (bench_e2e_simulated(bsamp, SAMPLED_SIM, (uint64_t)o->seed * 1000 + (uint64_t)rep, &res, err,
                                errlen))
            return -1;
        bench_samples_add(&r->samp_sim_tps, res.tok_s);
        bench_samples_add(&r->samp_sim_acc, res.mean_accepted);
        r->samp_mismatch |= !res.identical;
    }
    if (o->llama_bench && !r->llama_failed) {
        fprintf(stderr, "bench: repetition %d/%d: llama-bench\n", rep + 1, o->long_reps);
        char prompts[64];
        snprintf(prompts, sizeof prompts, "%d,8,17", o->prefill);
        if (bench_llama_run(&r->llama, o->llama_bench, o->eng.model, info->n_threads, prompts, o->gen, 1,
                            r->llama_error, sizeof r->llama_error)) {
            r->llama_failed = 1;
            fprintf(stderr, "flashmap " CMD ": llama-bench failed: %s\n", r->llama_error);
        }
    }
    (void)e;
    return 0;
}

/* The command line, quoted for a shell where needed. */
static void command_line(int argc, char **argv, char *out, size_t outlen) {
    size_t used = (size_t)snprintf(out, outlen, "flashmap");
    for (int i = 0; i < argc && used < outlen; i++) {
        const char *a = argv[i];
        const int plain =
            a[0] && strspn(a, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./=,:+@%") ==
                        strlen(a);
        used += (size_t)snprintf(out + used, outlen - used, plain ? " %s" : " '%s'", a);
    }
}

static int write_report(const bench_opts *o, const fm_engine_info *info, const bench_results *r,
                        const table *t, const char *cmdline) {
    FILE *f = fopen(o->out, "a");
    if (!f) {
        fprintf(stderr, "flashmap " CMD ": %s: cannot open for appending\n", o->out);
        return -1;
    }
    char machine[1024], when[64];
    bench_machine_describe(machine, sizeof machine);
    time_t now = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%d %H:%M UTC", gmtime(&now));
    fprintf(f, "### flashmap bench, %s\n\n", when);
    fprintf(f, "- Machine: %s\n", machine);
    fprintf(f,
            "- flashmap: %s kernels, %d threads; target %d layers, dim %d, %d/%d heads of %d, ffn %d, vocab "
            "%d, %s\n",
            info->isa, info->n_threads, info->n_layers, info->dim, info->n_heads, info->n_kv_heads,
            info->head_dim, info->ffn, info->vocab, info->weight_type);
    if (info->has_drafter)
        fprintf(f, "- Drafter: dim %d, %d layers, block %d, %d captured target layers, %s weights\n",
                info->drafter_dim, info->drafter_layers, info->drafter_block, info->drafter_n_capture,
                info->drafter_weight_type);
    if (o->llama_bench)
        fprintf(f, "- llama.cpp: `%s` (build %s)%s%s\n", o->llama_bench,
                r->llama.build_commit[0] ? r->llama.build_commit : "unknown",
                r->llama_failed ? "; FAILED: " : "", r->llama_failed ? r->llama_error : "");
    fprintf(f, "- Command: `%s`\n", cmdline);
    fprintf(
        f,
        "- Method: medians (bandwidth: the best pass); step/verify/draft/bandwidth over %d repetitions, "
        "prefill/end-to-end/llama-bench "
        "over %d, interleaved; verify width %s, fallback %s. SIMULATED rows replace the drafts by the "
        "target's own continuation for k ~ Binomial(block, mean/block) tokens per round (the drafter still "
        "runs in full); their output is compared with plain decoding in the same run.\n\n",
        o->reps, o->long_reps, o->eng.verify ? "fixed" : "adaptive", o->eng.fallback ? "on" : "off");
    table_print(t, f);
    fprintf(f, "\n");
    const int bad = fclose(f) != 0;
    if (bad) fprintf(stderr, "flashmap " CMD ": %s: write failed\n", o->out);
    return bad ? -1 : 0;
}

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    if (parse(argc, argv, &o)) return 2;
    char err[FM_ERRBUF_SIZE];
    fm_engine_params ep;
    cli_engine_params(&o.eng, &ep);
    ep.device = FM_DEVICE_CPU;
    const int need_ctx = o.prompt + o.gen + FM_MAX_BLOCK + 2;
    ep.n_ctx = need_ctx > 1024 ? need_ctx : 1024;
    fm_engine *e = NULL;
    bench_target *bt = NULL;
    bench_e2e *be = NULL, *bsamp = NULL;
    bench_stream *bs = NULL;
    bench_results *r = calloc(1, sizeof *r);
    int32_t *ids = malloc((size_t)o.prefill * sizeof *ids);
    int rc = 1;
    if (!r || !ids) {
        fprintf(stderr, "flashmap " CMD ": out of memory\n");
        goto done;
    }
    fprintf(stderr, "bench: loading %s%s%s\n", ep.model_path, ep.drafter_path ? " and " : "",
            ep.drafter_path ? ep.drafter_path : "");
    if (fm_engine_load(&ep, &e, err, sizeof err)) goto fail;
    fm_engine_info info;
    fm_engine_get_info(e, &info);
    if (o.gen + o.prompt + FM_MAX_BLOCK + 2 > info.n_ctx) {
        fprintf(stderr, "flashmap " CMD ": --prompt %d + --gen %d do not fit the model's context (%d)\n",
                o.prompt, o.gen, info.n_ctx);
        goto done;
    }
    uint64_t rng = (uint64_t)o.seed;
    for (int i = 0; i < o.prefill; i++) ids[i] = (int32_t)(splitmix64(&rng) % (uint64_t)info.vocab);
    if (bench_target_create(e, ids, o.prompt, o.prefill, &bt, err, sizeof err)) goto fail;
    if (bench_e2e_create(e, ids, o.prompt, o.gen, o.eng.verify, o.eng.fallback, &be, err, sizeof err) ||
        bench_e2e_create(e, ids, o.prompt, o.gen, o.eng.verify, o.eng.fallback, &bsamp, err, sizeof err))
        goto fail;
    bench_e2e_set_sampling(bsamp, &SAMPLED);
    bs = bench_stream_create((size_t)o.stream_mib << 20);
    if (!bs) {
        fprintf(stderr, "flashmap " CMD ": cannot allocate the %d MiB bandwidth buffer (--stream-mib)\n",
                o.stream_mib);
        goto done;
    }
    /* The bandwidth probe runs on a pool of the engine's size (the engine's own pool is internal to it). */
    fm_pool *pool = fm_pool_create(info.n_threads);
    if (!pool) {
        fprintf(stderr, "flashmap " CMD ": cannot start %d threads\n", info.n_threads);
        goto done;
    }
    /* Untimed: the plain reference the simulated runs replay, and a first touch of every weight. */
    fprintf(stderr, "bench: reference plain run (%d tokens)\n", o.gen);
    bench_e2e_result ref;
    if (bench_e2e_plain(be, &ref, err, sizeof err) || bench_e2e_plain(bsamp, &ref, err, sizeof err)) {
        fm_pool_free(pool);
        goto fail;
    }
    for (int rep = 0; rep < o.reps; rep++)
        if (one_rep(&o, e, &info, bt, be, bsamp, bs, pool, rep, r, err, sizeof err)) {
            fm_pool_free(pool);
            goto fail;
        }
    fm_pool_free(pool);

    table *t = calloc(1, sizeof *t);
    if (!t) {
        fprintf(stderr, "flashmap " CMD ": out of memory\n");
        goto done;
    }
    build_table(&o, &info, r, t);
    table_print(t, stdout);
    if (o.llama_bench && r->llama_failed) printf("\nllama-bench failed: %s\n", r->llama_error);
    fflush(stdout);
    rc = 0;
    if (o.out) {
        char cmdline[4096];
        command_line(argc, argv, cmdline, sizeof cmdline);
        if (write_report(&o, &info, r, t, cmdline)) rc = 1;
    }
    free(t);
    int mismatch = r->plain_mismatch | r->samp_mismatch;
    for (int i = 0; i < N_SIM; i++) mismatch |= r->sim_mismatch[i];
    if (mismatch) {
        fprintf(stderr,
                "flashmap " CMD ": speculative output differs from plain decoding (MISMATCH above)\n");
        rc = 1;
    }
    if (o.llama_bench && r->llama_failed) rc = 1;
    goto done;
fail:
    fprintf(stderr, "flashmap " CMD ": %s\n", err);
done:
    bench_stream_free(bs);
    bench_e2e_free(be);
    bench_e2e_free(bsamp);
    bench_target_free(bt);
    fm_engine_free(e);
    free(ids);
    free(r);
    return rc;
}
