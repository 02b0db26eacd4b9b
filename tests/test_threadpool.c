/* test_threadpool.c: fm_pool_for visits every index exactly once in contiguous per-worker ranges, for many
 * sizes, grains and pool sizes; nested calls run serially on the calling worker; repeated and concurrent
 * submissions stay correct. */
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "core/threadpool.h"
#include "test_util.h"

#define MAX_N 5000
#define MAX_T 16

typedef struct {
    atomic_int hits[MAX_N];
    atomic_int calls;
    atomic_int bad_thread;
    int size;
    int64_t begin[MAX_T], end[MAX_T]; /* per worker; each worker runs at most one range */
    atomic_int per_thread[MAX_T];
} cover_ctx;

static void cover_fn(void *vctx, int64_t b, int64_t e, int thread) {
    cover_ctx *c = vctx;
    atomic_fetch_add(&c->calls, 1);
    if (thread < 0 || thread >= c->size) {
        atomic_fetch_add(&c->bad_thread, 1);
        return;
    }
    atomic_fetch_add(&c->per_thread[thread], 1);
    c->begin[thread] = b;
    c->end[thread] = e;
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&c->hits[i], 1);
}

static void test_coverage(void) {
    static const int threads[] = {1, 2, 3, 4, 7};
    static const int64_t ns[] = {0, 1, 2, 3, 7, 64, 1000, 4097, MAX_N};
    static const int64_t grains[] = {0, 1, 3, 64, 1000, 6000};
    static cover_ctx c;
    for (size_t ti = 0; ti < sizeof threads / sizeof *threads; ti++) {
        fm_pool *pool = fm_pool_create(threads[ti]);
        CHECK(pool != NULL);
        if (!pool) continue;
        CHECK(fm_pool_size(pool) == threads[ti]);
        for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++)
            for (size_t gi = 0; gi < sizeof grains / sizeof *grains; gi++) {
                int64_t n = ns[ni], g = grains[gi];
                memset(&c, 0, sizeof c);
                c.size = fm_pool_size(pool);
                fm_pool_for(pool, n, g, cover_fn, &c);
                int ok = 1;
                for (int64_t i = 0; i < n; i++) ok &= atomic_load(&c.hits[i]) == 1;
                CHECK_MSG(ok, "threads %d n %lld grain %lld: some index not visited exactly once",
                          threads[ti], (long long)n, (long long)g);
                CHECK(atomic_load(&c.bad_thread) == 0);
                /* At most one range per worker, at most max(1, n / grain) ranges, each >= grain items unless
                 * the whole job is smaller. */
                int64_t eff = g < 1 ? 1 : g, max_ranges = n / eff > 1 ? n / eff : 1, ranges = 0;
                int sizes_ok = 1, contiguous = 1;
                for (int t = 0; t < c.size; t++) {
                    int k = atomic_load(&c.per_thread[t]);
                    if (k > 1) contiguous = 0;
                    if (k == 1) {
                        ranges++;
                        if (c.end[t] - c.begin[t] < (n < eff ? n : eff)) sizes_ok = 0;
                    }
                }
                CHECK_MSG(contiguous, "threads %d n %lld: a worker ran more than one range", threads[ti],
                          (long long)n);
                CHECK_MSG(ranges <= max_ranges, "threads %d n %lld grain %lld: %lld ranges > %lld",
                          threads[ti], (long long)n, (long long)g, (long long)ranges, (long long)max_ranges);
                CHECK_MSG(sizes_ok, "threads %d n %lld grain %lld: a range smaller than the grain",
                          threads[ti], (long long)n, (long long)g);
                if (n > 0 && eff * threads[ti] <= n)
                    CHECK_MSG(ranges == threads[ti], "threads %d n %lld grain %lld: only %lld ranges",
                              threads[ti], (long long)n, (long long)g, (long long)ranges);
            }
        fm_pool_free(pool);
    }
}

static void test_null_and_default(void) {
    static cover_ctx c;
    memset(&c, 0, sizeof c);
    c.size = 1;
    fm_pool_for(NULL, 100, 1, cover_fn, &c);
    CHECK(atomic_load(&c.calls) == 1);
    CHECK(c.begin[0] == 0 && c.end[0] == 100);
    CHECK(fm_pool_size(NULL) == 1);
    fm_pool *p = fm_pool_create(0);
    CHECK(p != NULL);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    CHECK_MSG(fm_pool_size(p) == (int)(cores > 0 ? cores : 1), "size %d vs %ld cores", fm_pool_size(p),
              cores);
    fm_pool_free(p);
    fm_pool_free(NULL);
}

/* Nested: each outer range calls fm_pool_for on the same pool; the inner job must run serially, on the
 * same worker index, and still cover its range. */
typedef struct {
    fm_pool *pool;
    atomic_int inner_hits[256 * 64];
    atomic_int wrong_thread;
    atomic_int inner_calls;
} nest_ctx;

typedef struct {
    nest_ctx *n;
    int64_t row;
    int outer_thread;
} inner_arg;

static void inner_fn(void *v, int64_t b, int64_t e, int thread) {
    inner_arg *ia = v;
    atomic_fetch_add(&ia->n->inner_calls, 1);
    if (thread != ia->outer_thread) atomic_fetch_add(&ia->n->wrong_thread, 1);
    for (int64_t i = b; i < e; i++) atomic_fetch_add(&ia->n->inner_hits[ia->row * 64 + i], 1);
}

static void outer_fn(void *v, int64_t b, int64_t e, int thread) {
    nest_ctx *n = v;
    for (int64_t r = b; r < e; r++) {
        inner_arg ia = {n, r, thread};
        fm_pool_for(n->pool, 64, 1, inner_fn, &ia);
    }
}

static void test_nested(void) {
    static nest_ctx n;
    memset(&n, 0, sizeof n);
    n.pool = fm_pool_create(3);
    fm_pool_for(n.pool, 256, 1, outer_fn, &n);
    int ok = 1;
    for (int i = 0; i < 256 * 64; i++) ok &= atomic_load(&n.inner_hits[i]) == 1;
    CHECK_MSG(ok, "nested: inner indices not visited exactly once");
    CHECK(atomic_load(&n.wrong_thread) == 0);
    CHECK_MSG(atomic_load(&n.inner_calls) == 256, "nested: %d inner calls, expected 256 (serial)",
              atomic_load(&n.inner_calls));
    fm_pool_free(n.pool);
}

/* Many small back-to-back jobs (the pattern of a forward pass), with the sum checked after each. */
typedef struct {
    int64_t *acc; /* [MAX_T] per-thread partial sums */
} sum_ctx;

static void sum_fn(void *v, int64_t b, int64_t e, int thread) {
    sum_ctx *s = v;
    for (int64_t i = b; i < e; i++) s->acc[thread] += i;
}

static void test_repeated(void) {
    fm_pool *p = fm_pool_create(2);
    int64_t acc[MAX_T];
    int bad = 0;
    for (int rep = 0; rep < 5000; rep++) {
        memset(acc, 0, sizeof acc);
        int64_t n = 1 + rep % 300;
        sum_ctx s = {acc};
        fm_pool_for(p, n, 1 + rep % 7, sum_fn, &s);
        int64_t tot = 0;
        for (int t = 0; t < MAX_T; t++) tot += acc[t];
        bad += tot != n * (n - 1) / 2;
    }
    CHECK_MSG(bad == 0, "repeated: %d of 5000 jobs summed wrong", bad);
    fm_pool_free(p);
    /* Parked workers: sleep past the spin window, then submit again. */
    p = fm_pool_create(3);
    for (int rep = 0; rep < 3; rep++) {
        usleep(5000);
        memset(acc, 0, sizeof acc);
        sum_ctx s = {acc};
        fm_pool_for(p, 999, 1, sum_fn, &s);
        int64_t tot = 0;
        for (int t = 0; t < MAX_T; t++) tot += acc[t];
        CHECK(tot == 999 * 998 / 2);
    }
    fm_pool_free(p);
}

/* Two external threads submitting to one pool at once: one gets the pool, the other runs serially. */
typedef struct {
    fm_pool *pool;
    int bad;
} submitter_arg;

static void *submitter(void *v) {
    submitter_arg *a = v;
    int64_t acc[MAX_T];
    for (int rep = 0; rep < 500; rep++) {
        memset(acc, 0, sizeof acc);
        sum_ctx s = {acc};
        fm_pool_for(a->pool, 500, 1, sum_fn, &s);
        int64_t tot = 0;
        for (int t = 0; t < MAX_T; t++) tot += acc[t];
        a->bad += tot != 500 * 499 / 2;
    }
    return NULL;
}

static void test_concurrent_submitters(void) {
    fm_pool *p = fm_pool_create(2);
    submitter_arg a = {p, 0}, b = {p, 0};
    pthread_t th;
    pthread_create(&th, NULL, submitter, &a);
    submitter(&b);
    pthread_join(th, NULL);
    CHECK_MSG(a.bad == 0 && b.bad == 0, "concurrent submitters: %d + %d wrong sums", a.bad, b.bad);
    fm_pool_free(p);
}

int main(void) {
    test_coverage();
    test_null_and_default();
    test_nested();
    test_repeated();
    test_concurrent_submitters();
    return fm_test_report("test_threadpool");
}
