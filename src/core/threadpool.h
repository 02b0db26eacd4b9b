/* threadpool.h: a persistent pthread pool. Workers spin briefly then park on a condition variable, so
 * back-to-back ops (a forward pass is hundreds of them) pay no wake-up cost, and an idle engine burns no CPU.
 * The calling thread takes part as worker 0. Small jobs and calls from inside a job run serially. */
#ifndef FM_CORE_THREADPOOL_H
#define FM_CORE_THREADPOOL_H

#include <stdint.h>

typedef struct fm_pool fm_pool;

/* fn processes items [begin, end) on worker `thread` (0 <= thread < fm_pool_size). */
typedef void (*fm_task_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* n_threads <= 0 means one per online core. Returns NULL only when no thread could be started. */
fm_pool *fm_pool_create(int n_threads);
void fm_pool_free(fm_pool *pool);
int fm_pool_size(const fm_pool *pool);

/* Splits [0, n) into contiguous ranges of at least `grain` items, one range per worker at most, and runs
 * fn on them; returns when all are done. A NULL pool runs fn(ctx, 0, n, 0) on the caller.
 * Runs serially as fn(ctx, 0, n, self) when n < 2 * grain, when called from inside a job (self = the index of
 * the worker making the call, so per-worker scratch stays private), or while another thread's job holds the
 * pool (self = 0: such a caller must not share per-worker scratch with the pool's jobs). */
void fm_pool_for(fm_pool *pool, int64_t n, int64_t grain, fm_task_fn fn, void *ctx);

#endif
