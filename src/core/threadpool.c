/* Serial placeholder until the pool lands (helper task); keeps the tree building. */
#include "core/threadpool.h"

#include <stdlib.h>

struct fm_pool {
    int n;
};
fm_pool *fm_pool_create(int n_threads) {
    fm_pool *p = calloc(1, sizeof *p);
    if (p) p->n = n_threads > 0 ? n_threads : 1;
    return p;
}
void fm_pool_free(fm_pool *pool) { free(pool); }
int fm_pool_size(const fm_pool *pool) { return pool ? pool->n : 1; }
void fm_pool_for(fm_pool *pool, int64_t n, int64_t grain, fm_task_fn fn, void *ctx) {
    (void)pool;
    (void)grain;
    if (n > 0) fn(ctx, 0, n, 0);
}
