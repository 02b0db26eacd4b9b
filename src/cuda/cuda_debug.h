/* cuda_debug.h: read-back and timing hooks of the CUDA backend for device tests and benchmarks (not used by
 * the engine). Plain C. */
#ifndef FM_CUDA_DEBUG_H
#define FM_CUDA_DEBUG_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Logits of the last eval that asked for argmax: rows [rows][vocab] (1 row for last-row evals). */
int fm_cuda_debug_logits(fm_cuda_backend *b, float *out, int rows);
/* Captured features of the last eval: [rows][n_capture * dim]. */
int fm_cuda_debug_features(fm_cuda_backend *b, float *out, int rows);
/* The last draft's head outputs [block][target_dim]. */
int fm_cuda_debug_draft_head(fm_cuda_backend *b, float *out);
/* 0: no CUDA graphs (every kernel launched each call); 1 (default): graphs for evals of up to 32 rows. */
void fm_cuda_debug_set_graphs(fm_cuda_backend *b, int on);
/* Device-to-device copy bandwidth in GB/s (bytes read + written), median of reps copies of `bytes`. */
double fm_cuda_debug_copy_bandwidth(size_t bytes, int reps);
/* Device name and driver version into buf. */
void fm_cuda_debug_device_name(char *buf, size_t len);
/* Bytes of device weights the target reads per step (quants + scales of every matrix + lm_head). */
uint64_t fm_cuda_debug_step_bytes(const fm_cuda_backend *b);
/* Synchronises the device (for host-side timing). */
void fm_cuda_debug_sync(void);

#ifdef __cplusplus
}
#endif

#endif
