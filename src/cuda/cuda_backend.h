/* cuda_backend.h: fm_decode_backend on an NVIDIA GPU (plain C; the CUDA code is in the .cu files beside it).
 * Weights are uploaded once in their stored type (target Q8_0, drafter BF16 or its Q8_0 copy); the target's
 * KV cache, its captured features, the drafter's context cache and all activations stay on the GPU, so a call
 * copies in only token ids and copies out only argmax ids. Only compiled when the build has CUDA
 * (FLASHMAP_HAVE_CUDA).
 */
#ifndef FM_CUDA_BACKEND_H
#define FM_CUDA_BACKEND_H

#include <stddef.h>

#include "decode/decode_backend.h"
#include "drafter/flashmap_drafter.h"
#include "model/qwen3.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when a CUDA device is usable. */
int fm_cuda_available(void);

typedef struct fm_cuda_backend fm_cuda_backend;

/* d may be NULL (no drafter). capture: target layers whose outputs are the drafter's features. The target
 * must be Q8_0 (every matrix), each drafter matrix BF16 or Q8_0. The host model and drafter may be freed
 * after this returns (their weights and precomputed constants are copied). */
int fm_cuda_backend_create(const qwen3_model *m, const fm_drafter *d, int n_ctx, int max_eval,
                           const int *capture, int n_capture, fm_cuda_backend **out, char *err,
                           size_t errlen);
void fm_cuda_backend_free(fm_cuda_backend *b);
fm_decode_backend fm_cuda_backend_ops(fm_cuda_backend *b);

#ifdef __cplusplus
}
#endif

#endif
