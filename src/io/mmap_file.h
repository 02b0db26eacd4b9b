/* mmap_file.h: a whole file mapped read-only (MAP_PRIVATE), for the model readers. The mapping lives until
 * fm_mmap_close; an empty file is represented by data == NULL, size == 0 (mmap refuses zero lengths). */
#ifndef FM_IO_MMAP_FILE_H
#define FM_IO_MMAP_FILE_H

#include <stddef.h>

typedef struct {
    void *data;  /* [size] bytes, read-only; NULL when size == 0 */
    size_t size; /* bytes */
} fm_mmap_file;

/* Maps path; `willneed` asks the kernel to start reading it ahead. On failure returns -1 with one line
 * naming the file and the reason (missing, not a regular file, too large for this address space...). */
int fm_mmap_open(const char *path, int willneed, fm_mmap_file *out, char *err, size_t errlen);
void fm_mmap_close(fm_mmap_file *m);

#endif
