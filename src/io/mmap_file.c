/* mmap_file.c: read-only whole-file mapping (see mmap_file.h). */
#include "io/mmap_file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

int fm_mmap_open(const char *path, int willneed, fm_mmap_file *out, char *err, size_t errlen) {
    out->data = NULL;
    out->size = 0;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fm_set_error(err, errlen, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return fm_set_error(err, errlen, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return fm_set_error(err, errlen, "%s: not a regular file", path);
    }
    if ((uint64_t)st.st_size > (uint64_t)SIZE_MAX) {
        close(fd);
        return fm_set_error(err, errlen, "%s: file of %lld bytes does not fit in the address space", path,
                            (long long)st.st_size);
    }
    if (st.st_size == 0) { /* nothing to map; callers see an empty image */
        close(fd);
        return 0;
    }
    void *p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd); /* the mapping keeps the file referenced */
    if (p == MAP_FAILED) return fm_set_error(err, errlen, "%s: cannot map: %s", path, strerror(e));
    if (willneed) (void)madvise(p, (size_t)st.st_size, MADV_WILLNEED); /* advisory: failure is harmless */
    out->data = p;
    out->size = (size_t)st.st_size;
    return 0;
}

void fm_mmap_close(fm_mmap_file *m) {
    if (m->data) munmap(m->data, m->size);
    m->data = NULL;
    m->size = 0;
}
