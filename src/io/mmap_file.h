/* mmap_file.h: a whole file mapped read-only (MAP_PRIVATE), for the model readers. The mapping lives until
 * fm_mmap_close; an empty file is represented by data == NULL, size == 0 (mmap refuses zero lengths). */
#ifndef FM_IO_MMAP_FILE_H
#define FM_IO_MMAP_FILE_H

#include <stddef.h>

#include "core/threadpool.h"

typedef struct {
    void *data;   /* [size] bytes, read-only; NULL when size == 0 */
    size_t size;  /* bytes */
    int resident; /* 1 after fm_mmap_make_resident moved it into anonymous huge pages */
    int fd;       /* the open file while data != NULL */
} fm_mmap_file;

/* Maps path; `willneed` asks the kernel to start reading it ahead. On failure returns -1 with one line
 * naming the file and the reason (missing, not a regular file, too large for this address space...). */
int fm_mmap_open(const char *path, int willneed, fm_mmap_file *out, char *err, size_t errlen);
void fm_mmap_close(fm_mmap_file *m);

/* Replaces the mapping, at the same addresses, by an anonymous copy in transparent huge pages (read-only).
 * A decode step streams every weight once; with 4 KiB file pages that costs a TLB miss per page and the
 * kernel may drop idle pages, with 2 MiB pages neither (about 8 % faster steps measured, bench/RESULTS.md).
 * Costs a copy of the file in memory (the page cache copy stays reclaimable). Returns 1 when done, 0 when
 * not (no THP, no memory, or an unaligned mapping): the file mapping then stays, which is always correct.
 * The pool's threads read in parallel (NULL: the caller alone). */
int fm_mmap_make_resident(fm_mmap_file *m, fm_pool *pool);
/* Makes a resident copy writable (1) or read-only again (0), for rearranging weights in place; the file is
 * never written (the copy is anonymous memory). 0 on success, -1 when the mapping is not resident. */
int fm_mmap_set_writable(fm_mmap_file *m, int writable);

#endif
