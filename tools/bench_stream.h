/* bench_stream.h: a STREAM-like read-bandwidth probe: the pool's threads each sum their slice of a buffer far
 * larger than the caches, so the figure is what a decode step (which streams every weight once) can reach. */
#ifndef FM_TOOLS_BENCH_STREAM_H
#define FM_TOOLS_BENCH_STREAM_H

#include <stddef.h>

#include "core/threadpool.h"

typedef struct bench_stream bench_stream;

/* bytes: buffer size (rounded down to whole 4 KiB pages); the buffer is written once so its pages exist. NULL
 * when it cannot be allocated. */
bench_stream *bench_stream_create(size_t bytes);
void bench_stream_free(bench_stream *s);
size_t bench_stream_bytes(const bench_stream *s);
/* One pass over the whole buffer with every thread of the pool; returns GB/s (1e9 bytes per second). */
double bench_stream_read_gbs(bench_stream *s, fm_pool *pool);

#endif
