/* bench_stream.c: the read-bandwidth probe (see bench_stream.h). Each worker sums its contiguous slice with
 * four independent accumulators (AVX2 loads when the CPU has them, else 64-bit words); the sum is kept so the
 * reads cannot be optimised away. Invariant: the slices cover the buffer exactly once per pass. */
#include "bench_stream.h"

#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "bench_util.h"

enum {
    STREAM_ALIGN = 2 << 20, /* 2 MiB: huge pages, as the engine keeps its weights */
    STREAM_CHUNK = 1 << 16 /* bytes per pool item: 64 KiB */,
    STREAM_MAX_WORKERS = 512
};

struct bench_stream {
    unsigned char *buf; /* [bytes], 4 KiB aligned */
    size_t bytes;
    uint64_t sink[STREAM_MAX_WORKERS * 8]; /* per-worker sums, 64 bytes apart: no false sharing */
};

bench_stream *bench_stream_create(size_t bytes) {
    bytes -= bytes % STREAM_CHUNK;
    if (bytes == 0) return NULL;
    bench_stream *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    /* aligned_alloc wants a multiple of the alignment; the probe reads `bytes` of it. */
    s->buf = aligned_alloc(STREAM_ALIGN, (bytes + STREAM_ALIGN - 1) / STREAM_ALIGN * STREAM_ALIGN);
    if (!s->buf) {
        free(s);
        return NULL;
    }
    s->bytes = bytes;
    madvise(s->buf, bytes, MADV_HUGEPAGE); /* a hint: where refused, 4 KiB pages */
    /* Non-zero content so no page is a shared zero page. */
    for (size_t i = 0; i < bytes; i++) s->buf[i] = (unsigned char)(i * 131u + 7u);
    return s;
}

void bench_stream_free(bench_stream *s) {
    if (!s) return;
    free(s->buf);
    free(s);
}

size_t bench_stream_bytes(const bench_stream *s) {
    return s->bytes;
}

__attribute__((target("avx2"))) static uint64_t sum_avx2(const unsigned char *p, size_t n) {
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i < n; i += 128) {
        a0 = _mm256_add_epi64(a0, _mm256_load_si256((const __m256i *)(p + i)));
        a1 = _mm256_add_epi64(a1, _mm256_load_si256((const __m256i *)(p + i + 32)));
        a2 = _mm256_add_epi64(a2, _mm256_load_si256((const __m256i *)(p + i + 64)));
        a3 = _mm256_add_epi64(a3, _mm256_load_si256((const __m256i *)(p + i + 96)));
    }
    const __m256i a = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
    uint64_t w[4];
    _mm256_storeu_si256((__m256i *)w, a);
    return w[0] + w[1] + w[2] + w[3];
}

static uint64_t sum_scalar(const unsigned char *p, size_t n) {
    const uint64_t *q = (const uint64_t *)(const void *)p;
    uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
    for (size_t i = 0; i < n / 8; i += 4) {
        a0 += q[i];
        a1 += q[i + 1];
        a2 += q[i + 2];
        a3 += q[i + 3];
    }
    return a0 + a1 + a2 + a3;
}

typedef struct {
    bench_stream *s;
    int avx2;
} stream_job;

static void stream_task(void *ctx, int64_t begin, int64_t end, int thread) {
    stream_job *j = ctx;
    const unsigned char *p = j->s->buf + (size_t)begin * STREAM_CHUNK;
    const size_t n = (size_t)(end - begin) * STREAM_CHUNK;
    const uint64_t sum = j->avx2 ? sum_avx2(p, n) : sum_scalar(p, n);
    j->s->sink[(thread % STREAM_MAX_WORKERS) * 8] += sum;
}

double bench_stream_read_gbs(bench_stream *s, fm_pool *pool) {
    stream_job j = {.s = s, .avx2 = __builtin_cpu_supports("avx2")};
    const int64_t items = (int64_t)(s->bytes / STREAM_CHUNK);
    /* grain = items / workers: one contiguous slice per worker, as a decode step splits its rows. */
    const int workers = pool ? fm_pool_size(pool) : 1;
    const double t0 = bench_now_s();
    fm_pool_for(pool, items, items / workers, stream_task, &j);
    const double dt = bench_now_s() - t0;
    return (double)s->bytes / dt * 1e-9;
}
