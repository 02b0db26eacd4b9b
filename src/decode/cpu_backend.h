/* cpu_backend.h: the decoding backend on the CPU: a qwen3_state (KV cache, features) and the drafter. */
#ifndef FM_DECODE_CPU_BACKEND_H
#define FM_DECODE_CPU_BACKEND_H

#include "core/threadpool.h"
#include "decode/decode_backend.h"
#include "drafter/flashmap_drafter.h"
#include "model/qwen3.h"

typedef struct fm_cpu_backend fm_cpu_backend;

/* capture: the target layers the drafter reads (n_capture 0 without a drafter). */
int fm_cpu_backend_create(const qwen3_model *m, fm_drafter *drafter, fm_pool *pool, int n_ctx, int max_eval,
                          const int *capture, int n_capture, fm_cpu_backend **out, char *err, size_t errlen);
void fm_cpu_backend_free(fm_cpu_backend *b);
/* The function table over b (valid while b lives). */
fm_decode_backend fm_cpu_backend_ops(fm_cpu_backend *b);

#endif
