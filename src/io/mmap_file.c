/* mmap_file.c: read-only whole-file mapping (see mmap_file.h). */
#include "io/mmap_file.h"

#include <errno.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

enum { HUGE_PAGE = 2u << 20, READ_CHUNK = 64u << 20 };

/* An address range of `size` bytes starting on a huge-page boundary (reserved, no access), or NULL. */
static void *reserve_aligned(size_t size) {
    if (size > SIZE_MAX - HUGE_PAGE) return NULL;
    char *r = mmap(NULL, size + HUGE_PAGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)r + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (a > r) munmap(r, (size_t)(a - r));
    if (a + size < r + size + HUGE_PAGE) munmap(a + size, (size_t)(r + size + HUGE_PAGE - (a + size)));
    return a;
}

/* Whether the kernel gives anonymous memory transparent huge pages on request. */
static int thp_available(void) {
    char buf[128] = "";
    int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    return strstr(buf, "[always]") || strstr(buf, "[madvise]");
}

typedef struct {
    int fd;
    char *dst;
    size_t size;
    atomic_int failed;
} read_job;

static void read_chunks(void *p, int64_t begin, int64_t end, int thread) {
    (void)thread;
    read_job *j = p;
    for (int64_t c = begin; c < end; c++) {
        size_t off = (size_t)c * READ_CHUNK, stop = off + READ_CHUNK < j->size ? off + READ_CHUNK : j->size;
        while (off < stop) {
            const ssize_t got = pread(j->fd, j->dst + off, stop - off, (off_t)off);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) {
                atomic_store(&j->failed, 1);
                return;
            }
            off += (size_t)got;
        }
    }
}

int fm_mmap_make_resident(fm_mmap_file *m, fm_pool *pool) {
    if (!m->data || m->resident || !thp_available() || ((uintptr_t)m->data & (HUGE_PAGE - 1))) return 0;
    const size_t len = (m->size + 4095) & ~(size_t)4095; /* the mapping's length in whole pages */
    char *q = reserve_aligned(len);
    if (!q) return 0;
    if (mmap(q, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        munmap(q, len);
        return 0;
    }
    (void)madvise(q, len, MADV_HUGEPAGE);
    /* pread, not a copy from the mapping: no 4 KiB faults on the file pages, which are never touched. The
     * pool's threads share the work (page zeroing and copying are per-core costs). */
    read_job job = {m->fd, q, m->size, 0};
    fm_pool_for(pool, (int64_t)((m->size + READ_CHUNK - 1) / READ_CHUNK), 1, read_chunks, &job);
    if (atomic_load(&job.failed)) {
        munmap(q, len);
        return 0;
    }
    /* Same addresses as before: every pointer into the file stays valid. */
    if (mprotect(q, len, PROT_READ) != 0 ||
        mremap(q, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, m->data) == MAP_FAILED) {
        munmap(q, len);
        return 0;
    }
    m->resident = 1;
    return 1;
}

int fm_mmap_set_writable(fm_mmap_file *m, int writable) {
    if (!m->resident) return -1;
    const size_t len = (m->size + 4095) & ~(size_t)4095;
    return mprotect(m->data, len, writable ? PROT_READ | PROT_WRITE : PROT_READ) == 0 ? 0 : -1;
}

int fm_mmap_open(const char *path, int willneed, fm_mmap_file *out, char *err, size_t errlen) {
    out->data = NULL;
    out->size = 0;
    out->resident = 0;
    out->fd = -1;
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
    /* Mapped at a 2 MiB-aligned address, so that fm_mmap_make_resident can later put huge pages there. */
    void *p = MAP_FAILED, *at = reserve_aligned((size_t)st.st_size);
    if (at) p = mmap(at, (size_t)st.st_size, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (p == MAP_FAILED) {
        if (at) munmap(at, (size_t)st.st_size);
        p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    }
    int e = errno;
    if (p == MAP_FAILED) {
        close(fd);
        return fm_set_error(err, errlen, "%s: cannot map: %s", path, strerror(e));
    }
    out->fd = fd;                                                      /* kept for fm_mmap_make_resident */
    if (willneed) (void)madvise(p, (size_t)st.st_size, MADV_WILLNEED); /* advisory: failure is harmless */
    out->data = p;
    out->size = (size_t)st.st_size;
    return 0;
}

void fm_mmap_close(fm_mmap_file *m) {
    if (m->data) { /* only an opened mapping owns its fd (a zeroed struct must not close fd 0) */
        munmap(m->data, m->size);
        close(m->fd);
    }
    m->fd = -1;
    m->data = NULL;
    m->size = 0;
}
