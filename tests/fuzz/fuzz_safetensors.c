/* fuzz_safetensors.c: libFuzzer entry for the safetensors reader. Any input must either be refused with an
 * error or open into tensors whose data lies inside the input. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/error.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char err[FM_ERROR_LEN];
    st_file *f = st_open_memory(data, size, "fuzz", err, sizeof err);
    if (!f) return 0;
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < st_n_tensors(f); i++) {
        const st_tensor *t = st_tensor_at(f, i);
        const uint8_t *p = t->data;
        if (p < data || p + t->size > data + size) abort();
        if (t->size) sink ^= p[0] ^ p[t->size - 1];
        if (st_find(f, t->name) != t) abort();
    }
    (void)sink;
    st_close(f);
    return 0;
}
