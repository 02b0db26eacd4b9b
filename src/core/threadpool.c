/* threadpool.c: the persistent pthread pool behind fm_pool_for.
 *
 * Protocol (every cross-thread handoff is a C11 atomic with acquire/release, so TSAN sees the order):
 *   - The submitter writes the job fields (fn, ctx, n, n_chunks), then publishes it by a release-increment
 *     of `gen`. Workers acquire-load `gen`; a new value means a new job whose fields are now visible.
 *   - Every worker (1..n-1) acknowledges every job by a release-decrement of `pending`, even when it has no
 *     range, so the submitter may overwrite the job fields once `pending` reaches 0 (acquire).
 *   - Workers spin on `gen` for FM_POOL_SPIN_NS, then park on `wake` under `mu`. The submitter bumps `gen`
 *     before taking `mu`, and a worker re-checks `gen` under `mu` before waiting, so no wake-up is lost.
 *   - Only one job runs at a time: `submit_mu` is try-locked; a second concurrent submitter, a call from
 *     inside a job (nested), a pool of one, or a job of one chunk runs serially on its own thread.
 * Ranges: [0, n) is cut into n_chunks = min(workers, floor(n / grain)) contiguous, near-equal ranges;
 * chunk i goes to worker i, and the caller is worker 0. */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define FM_CPU_RELAX() _mm_pause()
#else
#define FM_CPU_RELAX() ((void)0)
#endif

/* A forward pass issues ops every few microseconds; spinning this long between them avoids a futex wake-up
 * per op, while an idle engine parks within a fraction of a millisecond. */
#define FM_POOL_SPIN_NS 200000
#define FM_POOL_MAX_THREADS 512

typedef struct {
    fm_pool *pool;
    int id; /* 1..n-1; the caller is 0 */
} fm_worker;

struct fm_pool {
    int n;                     /* workers including the caller */
    pthread_t *threads;        /* [n - 1] */
    fm_worker *workers;        /* [n - 1] */
    pthread_mutex_t mu;        /* guards the park/wake handshake only */
    pthread_cond_t wake;       /* signalled when gen moves or stop is set */
    pthread_mutex_t submit_mu; /* one job at a time; try-locked */
    atomic_uint gen;           /* job generation, bumped once per job */
    atomic_int pending;        /* workers that have not yet acknowledged the current job */
    atomic_int stop;
    int n_sleeping; /* under mu */
    /* The current job: written by the submitter before gen is released, read-only for workers until they
     * acknowledge it. */
    fm_task_fn fn;
    void *ctx;
    int64_t n_items;
    int n_chunks;
};

/* Worker index of the current thread while it runs a job (-1 outside jobs); makes nested calls serial and
 * gives them the index of the thread they run on. */
static _Thread_local int tl_worker = -1;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Chunk i of n items split into k near-equal contiguous ranges. */
static void chunk_range(int64_t n, int k, int i, int64_t *begin, int64_t *end) {
    int64_t base = n / k, extra = n % k;
    *begin = i * base + (i < extra ? i : extra);
    *end = *begin + base + (i < extra ? 1 : 0);
}

static void run_chunk(fm_pool *p, int id) {
    if (id >= p->n_chunks) return;
    int64_t b, e;
    chunk_range(p->n_items, p->n_chunks, id, &b, &e);
    if (b < e) {
        tl_worker = id;
        p->fn(p->ctx, b, e, id);
        tl_worker = -1;
    }
}

/* Waits until gen differs from seen or stop is set; returns the new gen. */
static unsigned wait_for_job(fm_pool *p, unsigned seen) {
    uint64_t t0 = now_ns();
    for (unsigned spins = 0;; spins++) {
        unsigned g = atomic_load_explicit(&p->gen, memory_order_acquire);
        if (g != seen || atomic_load_explicit(&p->stop, memory_order_acquire)) return g;
        FM_CPU_RELAX();
        if ((spins & 255) == 255 && now_ns() - t0 > FM_POOL_SPIN_NS) break;
    }
    pthread_mutex_lock(&p->mu);
    p->n_sleeping++;
    unsigned g;
    while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen &&
           !atomic_load_explicit(&p->stop, memory_order_acquire))
        pthread_cond_wait(&p->wake, &p->mu);
    p->n_sleeping--;
    pthread_mutex_unlock(&p->mu);
    return g;
}

static void *worker_main(void *arg) {
    fm_worker *w = arg;
    fm_pool *p = w->pool;
    unsigned seen = 0; /* gen starts at 0 and the pool is built before any job */
    for (;;) {
        seen = wait_for_job(p, seen);
        if (atomic_load_explicit(&p->stop, memory_order_acquire)) break;
        run_chunk(p, w->id);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
    return NULL;
}

static int online_cores(void) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    return c > 0 ? (int)c : 1;
}

fm_pool *fm_pool_create(int n_threads) {
    if (n_threads <= 0) n_threads = online_cores();
    if (n_threads > FM_POOL_MAX_THREADS) n_threads = FM_POOL_MAX_THREADS;
    fm_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n = 1;
    atomic_init(&p->gen, 0);
    atomic_init(&p->pending, 0);
    atomic_init(&p->stop, 0);
    pthread_mutex_init(&p->mu, NULL);
    pthread_mutex_init(&p->submit_mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        p->workers = calloc((size_t)n_threads - 1, sizeof *p->workers);
        if (!p->threads || !p->workers) {
            fm_pool_free(p);
            return NULL;
        }
        for (int i = 1; i < n_threads; i++) {
            p->workers[i - 1] = (fm_worker){p, i};
            if (pthread_create(&p->threads[i - 1], NULL, worker_main, &p->workers[i - 1]) != 0) break;
            p->n = i + 1; /* fewer threads than asked is still a working pool */
        }
    }
    return p;
}

void fm_pool_free(fm_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store_explicit(&pool->stop, 1, memory_order_release);
    pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i - 1], NULL);
    pthread_cond_destroy(&pool->wake);
    pthread_mutex_destroy(&pool->mu);
    pthread_mutex_destroy(&pool->submit_mu);
    free(pool->threads);
    free(pool->workers);
    free(pool);
}

int fm_pool_size(const fm_pool *pool) {
    return pool ? pool->n : 1;
}

void fm_pool_for(fm_pool *pool, int64_t n, int64_t grain, fm_task_fn fn, void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    int self = tl_worker >= 0 ? tl_worker : 0;
    int64_t max_chunks = n / grain; /* floor: every range gets at least grain items */
    int k = pool ? pool->n : 1;
    if (max_chunks < k) k = (int)max_chunks;
    if (!pool || k <= 1 || tl_worker >= 0 || pthread_mutex_trylock(&pool->submit_mu) != 0) {
        fn(ctx, 0, n, self);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    pool->n_items = n;
    pool->n_chunks = k;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    pthread_mutex_lock(&pool->mu);
    if (pool->n_sleeping) pthread_cond_broadcast(&pool->wake);
    pthread_mutex_unlock(&pool->mu);

    run_chunk(pool, 0);

    for (unsigned spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        FM_CPU_RELAX();
        if (spins > (1u << 14)) sched_yield(); /* a worker was descheduled: let it run */
    }
    pthread_mutex_unlock(&pool->submit_mu);
}
