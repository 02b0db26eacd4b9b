/* bench_kernels.c: fm_matmul throughput per weight type and ISA level, for the Qwen3-4B MLP shapes
 * (9728x2560 gate/up, 2560x9728 down) and T tokens per call. Prints the best and the median time per call
 * (the machine may be shared: the best is what the kernel can do, the median what a busy machine gave),
 * weight GB/s (bytes of W read per second, each byte once per call) and GFLOP/s (2 * rows * cols * T per
 * call) at the best time and at the median, and the best time relative to T = 1. Usage: bench_kernels
 * [threads=2] [seconds_per_case=0.3] [max_scalar_T=1] [type: f32|f16|bf16|q8_0|q4_k|q5_k|q6_k] [T list, e.g.
 * 1,8,17,64,256 (the default)] [MB of weights to rotate over=128] [shapes, e.g. 9728x2560,2560x9728 (the
 * default),151936x2560 (the lm_head); cols <= 9728]. Weights rotate over enough copies to exceed that size,
 * so they come from DRAM when it exceeds the L3 (as a forward's 4.3 GB do): 128 MB does here, not on the
 * device's Xeon (300 MB of L3), where 1024 or more is needed. On a CPU with AMX-INT8 the AVX-512 level runs
 * twice for Q8_0, AMX on ("avx512+amx": the batches matmul.c gives it) and off. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/threadpool.h"
#include "cpu/cpu_features.h"
#include "cpu/matmul.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static void fill(fm_dtype dt, char *p, size_t bytes) {
    if (fm_dtype_is_k_quant(dt)) { /* random quants and packed scales, small positive f16 d (and dmin) */
        const size_t bb = (size_t)fm_dtype_block_bytes(dt);
        for (size_t i = 0; i < bytes; i++) p[i] = (char)rnd();
        for (size_t b = 0; b < bytes / bb; b++) {
            const uint16_t d = fm_f32_to_f16(0.001f), dmin = fm_f32_to_f16(0.002f);
            char *blk = p + b * bb;
            if (dt == FM_DTYPE_Q6_K) {
                memcpy(blk + offsetof(fm_block_q6_K, d), &d, 2);
            } else {
                memcpy(blk, &d, 2);
                memcpy(blk + 2, &dmin, 2);
            }
        }
    } else if (dt == FM_DTYPE_Q8_0) {
        fm_block_q8_0 *b = (fm_block_q8_0 *)p;
        for (size_t i = 0; i < bytes / sizeof *b; i++) {
            b[i].d = fm_f32_to_f16(0.01f);
            for (int j = 0; j < 32; j++) b[i].qs[j] = (int8_t)(rnd() % 255 - 127);
        }
    } else if (dt == FM_DTYPE_F32) {
        float *f = (float *)p;
        for (size_t i = 0; i < bytes / 4; i++) f[i] = (float)(rnd() % 2000) * 1e-3f - 1.0f;
    } else {
        uint16_t *h = (uint16_t *)p;
        for (size_t i = 0; i < bytes / 2; i++) {
            float v = (float)(rnd() % 2000) * 1e-3f - 1.0f;
            h[i] = dt == FM_DTYPE_F16 ? fm_f32_to_f16(v) : fm_f32_to_bf16(v);
        }
    }
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    double secs = argc > 2 ? atof(argv[2]) : 0.3;
    int max_scalar_T = argc > 3 ? atoi(argv[3]) : 1;
    fm_dtype only = FM_DTYPE_COUNT;
    if (argc > 4 && fm_dtype_parse(argv[4], &only) != 0) {
        fprintf(stderr, "unknown type %s\n", argv[4]);
        return 2;
    }
    int64_t shapes[8][2] = {{9728, 2560}, {2560, 9728}};
    int n_shapes = 2;
    int Ts[16] = {1, 8, 17, 64, 256}, nT = 5;
    if (argc > 5) {
        nT = 0;
        for (const char *p = argv[5]; *p && nT < 16;) {
            char *end;
            const long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > 256) {
                fprintf(stderr, "bad T list %s (1..256, comma-separated)\n", argv[5]);
                return 2;
            }
            Ts[nT++] = (int)v;
            p = *end == ',' ? end + 1 : end;
        }
    }
    const long rot_mb = argc > 6 ? atol(argv[6]) : 128;
    if (rot_mb < 1 || rot_mb > 65536) {
        fprintf(stderr, "bad rotation size %s (1..65536 MB)\n", argv[6]);
        return 2;
    }
    if (argc > 7) {
        n_shapes = 0;
        for (const char *p = argv[7]; *p && n_shapes < 8;) {
            char *end;
            const long long r = strtoll(p, &end, 10);
            const long long c = *end == 'x' ? strtoll(end + 1, &end, 10) : 0;
            if (r < 1 || c < 256 || c % 256 || c > 9728) {
                fprintf(stderr,
                        "bad shape list %s (ROWSxCOLS, comma-separated; cols a multiple of 256, "
                        "at most 9728)\n",
                        argv[7]);
                return 2;
            }
            shapes[n_shapes][0] = r;
            shapes[n_shapes++][1] = c;
            p = *end == ',' ? end + 1 : end;
        }
    }
    int64_t max_rows = 0;
    for (int s = 0; s < n_shapes; s++) max_rows = shapes[s][0] > max_rows ? shapes[s][0] : max_rows;
    fm_pool *pool = fm_pool_create(threads);
    const fm_isa best = fm_cpu_isa_best();
    printf("bench_kernels: %d threads, best ISA %s, %.2f s per case, weights rotating over %ld MB\n",
           fm_pool_size(pool), fm_isa_name(best), secs, rot_mb);
    printf("%-5s %-10s %-11s %4s %9s %9s %8s %9s %9s %7s\n", "type", "isa", "shape", "T", "best ms",
           "median ms", "GB/s", "GFLOP/s", "(median)", "x T=1");
    float *x = malloc(sizeof(float) * 256 * 9728), *y = malloc(sizeof(float) * 256 * (size_t)max_rows);
    for (int i = 0; i < 256 * 9728; i++) x[i] = (float)(rnd() % 2000) * 1e-3f - 1.0f;
    for (int dt = 0; dt < FM_DTYPE_COUNT; dt++) {
        if (only != FM_DTYPE_COUNT && dt != (int)only) continue;
        for (int s = 0; s < n_shapes; s++) {
            const int64_t rows = shapes[s][0], cols = shapes[s][1];
            const size_t bytes = fm_dtype_row_bytes((fm_dtype)dt, cols) * (size_t)rows;
            int ncopies = (int)(((size_t)rot_mb << 20) / bytes) + 1;
            char *data = malloc(bytes * (size_t)ncopies);
            if (!data) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            fill((fm_dtype)dt, data, bytes); /* the copies differ only in where they are */
            for (int c = 1; c < ncopies; c++) memcpy(data + bytes * (size_t)c, data, bytes);
            const int amx0 = fm_cpu_amx(), with_amx = amx0 && dt == FM_DTYPE_Q8_0;
            /* Q8_0 where the engine would repack it (fm_matrix_wants_vnni4): once more in that layout. */
            fm_matrix probe = {(fm_dtype)dt, rows, cols, data, NULL, FM_LAYOUT_ROWS};
            char *data4 = NULL;
            if (fm_matrix_wants_vnni4(&probe) &&
                (data4 = aligned_alloc(64, (bytes * (size_t)ncopies + 63) & ~(size_t)63)) != NULL) {
                memcpy(data4, data, bytes * (size_t)ncopies);
                for (int c = 0; c < ncopies; c++) {
                    fm_matrix wc = probe;
                    wc.data = data4 + bytes * (size_t)c;
                    fm_matrix_repack_vnni4(pool, &wc, data4 + bytes * (size_t)c);
                }
            }
            const int with_v4 = data4 != NULL;
            for (int v = (int)best + with_amx + with_v4; v >= FM_ISA_SCALAR; v--) {
                const int v4 = with_v4 && v == (int)best + with_amx + 1;
                const int lvl = v > (int)best ? (int)best : v, amx = !v4 && v > (int)best;
                const char *src = v4 ? data4 : data;
                fm_cpu_set_isa((fm_isa)lvl);
                fm_cpu_set_amx(amx);
                double t1 = 0;
                for (int ti = 0; ti < nT; ti++) {
                    const int T = Ts[ti];
                    if (lvl == FM_ISA_SCALAR && T > max_scalar_T) continue;
                    fm_matrix w = {(fm_dtype)dt, rows, cols,
                                   src,          NULL, v4 ? FM_LAYOUT_Q8_VNNI4 : FM_LAYOUT_ROWS};
                    fm_matmul(pool, &w, x, T, y, NULL); /* warm-up: workspace, page faults */
                    enum { MAX_REPS = 1 << 16 };
                    static double times[MAX_REPS];
                    int reps = 0;
                    const double t0 = now_s();
                    do {
                        w.data = src + bytes * (size_t)(reps % ncopies);
                        const double c0 = now_s();
                        fm_matmul(pool, &w, x, T, y, NULL);
                        times[reps++] = now_s() - c0;
                    } while (reps < MAX_REPS && (now_s() - t0 < secs || reps < 5));
                    qsort(times, (size_t)reps, sizeof *times, cmp_double);
                    const double t_best = times[0], t_med = times[reps / 2];
                    const double flop = 2.0 * (double)rows * (double)cols * T;
                    if (T == 1) t1 = t_best;
                    char shape[32];
                    snprintf(shape, sizeof shape, "%lldx%lld", (long long)rows, (long long)cols);
                    char ratio[16] = "-";
                    if (t1 > 0) snprintf(ratio, sizeof ratio, "%.2f", t_best / t1);
                    char isa[24];
                    snprintf(isa, sizeof isa, "%s%s", fm_isa_name((fm_isa)lvl),
                             amx  ? "+amx"
                             : v4 ? "+v4"
                                  : "");
                    printf("%-5s %-10s %-11s %4d %9.3f %9.3f %8.1f %9.1f %9.1f %7s\n",
                           fm_dtype_name((fm_dtype)dt), isa, shape, T, t_best * 1e3, t_med * 1e3,
                           (double)bytes / t_best * 1e-9, flop / t_best * 1e-9, flop / t_med * 1e-9, ratio);
                    fflush(stdout);
                }
            }
            fm_cpu_set_isa(best);
            fm_cpu_set_amx(amx0);
            free(data4);
            free(data);
        }
    }
    free(x);
    free(y);
    fm_pool_free(pool);
    fm_matmul_scratch_release();
    return 0;
}
