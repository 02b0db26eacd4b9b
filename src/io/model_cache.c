/* model_cache.c: pinned default sources, cache paths, completion markers, the per-file lock and the pull
 * sequence (lock -> resume/download -> size -> sha256 -> rename -> marker). See model_cache.h for the layout
 * and the invariants; docs/CACHE.md for the user's view. */
#include "io/model_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "io/sha256.h"

#define HF_DEFAULT_ENDPOINT "https://huggingface.co"
#define MARKER_MAGIC "flashmap-cache-marker 1"

/* Pinned defaults. Target: Qwen's own Q8_0 conversion at commit bc640142 (size and sha256 as the hub's tree
 * listing states them at that commit). Drafter: the FlashMap checkpoint; its sha256 is not pinned and comes
 * from the hub's X-Linked-Etag at download time; config.json is small and may be any size. */
static const fm_cache_source default_target[] = {
    {"Qwen/Qwen3-4B-GGUF", "bc640142c66e1fdd12af0bd68f40445458f3869b", "Qwen3-4B-Q8_0.gguf", 4280404704LL,
     "8c2f07f26af9747e41988551106f149b03eb9b5cb6df636027b6bf6278473300"},
};
static const fm_cache_source default_drafter[] = {
    {"j-shen/FlashMap-Qwen3-4B", "4e8d6a39a84ad108c5b60cb59072eb3f968c98cd", "model.safetensors", 949897866LL,
     NULL},
    {"j-shen/FlashMap-Qwen3-4B", "4e8d6a39a84ad108c5b60cb59072eb3f968c98cd", "config.json", -1, NULL},
};

size_t fm_cache_default_sources(fm_cache_kind kind, const fm_cache_source **srcs) {
    if (kind == FM_CACHE_TARGET) {
        *srcs = default_target;
        return sizeof default_target / sizeof default_target[0];
    }
    *srcs = default_drafter;
    return sizeof default_drafter / sizeof default_drafter[0];
}

int fm_cache_dir(char *out, size_t outlen, char *err, size_t errlen) {
    const char *v = getenv("FLASHMAP_CACHE");
    int n;
    if (v && v[0]) {
        n = snprintf(out, outlen, "%s", v);
    } else if ((v = getenv("XDG_CACHE_HOME")) && v[0]) {
        n = snprintf(out, outlen, "%s/flashmap", v);
    } else if ((v = getenv("HOME")) && v[0]) {
        n = snprintf(out, outlen, "%s/.cache/flashmap", v);
    } else {
        return fm_set_error(err, errlen,
                            "cannot place the model cache: set FLASHMAP_CACHE (HOME is not set)");
    }
    if (n < 0 || (size_t)n >= outlen) return fm_set_error(err, errlen, "cache path too long: %s", v);
    return 0;
}

/* One path component of a repo, revision or file name: [A-Za-z0-9._+-]+, not "." or "..". */
static int name_part_ok(const char *s, size_t n) {
    if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.')) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
              c == '_' || c == '-' || c == '+'))
            return 0;
    }
    return 1;
}

/* Names split on '/' into at least min_parts and at most max_parts valid components. */
static int path_ok(const char *s, int min_parts, int max_parts) {
    int parts = 0;
    while (1) {
        const char *slash = strchr(s, '/');
        size_t n = slash ? (size_t)(slash - s) : strlen(s);
        if (!name_part_ok(s, n)) return 0;
        parts++;
        if (!slash) break;
        s = slash + 1;
    }
    return parts >= min_parts && parts <= max_parts;
}

static int source_check(const fm_cache_source *src, char *err, size_t errlen) {
    if (!src->repo || !path_ok(src->repo, 2, 2))
        return fm_set_error(err, errlen, "bad repository name '%s': expected OWNER/NAME of [A-Za-z0-9._+-]",
                            src->repo ? src->repo : "");
    if (!src->revision || !path_ok(src->revision, 1, 1))
        return fm_set_error(err, errlen,
                            "bad revision '%s': expected a commit or a branch name of [A-Za-z0-9._+-]",
                            src->revision ? src->revision : "");
    if (!src->file || !path_ok(src->file, 1, 16))
        return fm_set_error(err, errlen,
                            "bad file name '%s': expected a relative path of [A-Za-z0-9._+-] parts",
                            src->file ? src->file : "");
    if (src->sha256 && !fm_fetch_is_sha256_hex(src->sha256))
        return fm_set_error(err, errlen, "bad sha256 '%s': expected 64 hex digits", src->sha256);
    return 0;
}

int fm_cache_file_path(const char *cache_dir, const fm_cache_source *src, char *out, size_t outlen, char *err,
                       size_t errlen) {
    if (source_check(src, err, errlen)) return -1;
    const char *slash = strchr(src->repo, '/');
    int n = snprintf(out, outlen, "%s/%.*s--%s/%s/%s", cache_dir, (int)(slash - src->repo), src->repo,
                     slash + 1, src->revision, src->file);
    if (n < 0 || (size_t)n >= outlen - 16) /* room for the .partial/.complete/.lock suffixes */
        return fm_set_error(err, errlen, "cache path too long for %s", src->file);
    return 0;
}

int fm_cache_url(const fm_cache_source *src, char *out, size_t outlen, char *err, size_t errlen) {
    if (source_check(src, err, errlen)) return -1;
    const char *base = getenv("HF_ENDPOINT");
    if (!base || !base[0]) base = HF_DEFAULT_ENDPOINT;
    size_t blen = strlen(base);
    while (blen && base[blen - 1] == '/') blen--;
    int n =
        snprintf(out, outlen, "%.*s/%s/resolve/%s/%s", (int)blen, base, src->repo, src->revision, src->file);
    if (n < 0 || (size_t)n >= outlen) return fm_set_error(err, errlen, "URL too long for %s", src->file);
    return 0;
}

/* ---- markers ---- */

typedef struct marker {
    char repo[256], file[512], revision[128], commit[128], sha256[80];
    int64_t size;
} marker;

static int marker_read(const char *path, marker *m) {
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s.complete", path);
    FILE *f = fopen(mpath, "r");
    if (!f) return -1;
    memset(m, 0, sizeof *m);
    m->size = -1;
    char line[1024];
    int magic = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\r\n")] = '\0';
        char *sp = strchr(line, ' ');
        if (!strcmp(line, MARKER_MAGIC)) magic = 1;
        if (!sp) continue;
        *sp = '\0';
        const char *v = sp + 1;
        if (!strcmp(line, "repo"))
            snprintf(m->repo, sizeof m->repo, "%s", v);
        else if (!strcmp(line, "file"))
            snprintf(m->file, sizeof m->file, "%s", v);
        else if (!strcmp(line, "revision"))
            snprintf(m->revision, sizeof m->revision, "%s", v);
        else if (!strcmp(line, "commit"))
            snprintf(m->commit, sizeof m->commit, "%s", v);
        else if (!strcmp(line, "sha256"))
            snprintf(m->sha256, sizeof m->sha256, "%s", v);
        else if (!strcmp(line, "size"))
            m->size = strtoll(v, NULL, 10);
    }
    fclose(f);
    return magic ? 0 : -1;
}

int fm_cache_is_complete(const char *path, const fm_cache_source *src) {
    marker m;
    struct stat sb;
    if (marker_read(path, &m) != 0 || stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return 0;
    if (strcmp(m.revision, src->revision) || strcmp(m.repo, src->repo) || strcmp(m.file, src->file)) return 0;
    if (m.size < 0 || m.size != (int64_t)sb.st_size) return 0;
    if (src->size >= 0 && m.size != src->size) return 0;
    /* A pinned sha256 must have been the one verified. */
    if (src->sha256 && strcasecmp(m.sha256, src->sha256)) return 0;
    return 1;
}

static int fsync_dir_of(const char *path) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) return 0;
    *slash = '\0';
    int fd = open(dir[0] ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Writes the marker through a temp file: write, fsync, rename, fsync the folder. */
static int marker_write(const char *path, const fm_cache_source *src, const char *commit, int64_t size,
                        const char *sha, char *err, size_t errlen) {
    char mpath[4200], tpath[4200];
    snprintf(mpath, sizeof mpath, "%s.complete", path);
    snprintf(tpath, sizeof tpath, "%s.complete.tmp", path);
    char buf[2048];
    int n = snprintf(
        buf, sizeof buf, MARKER_MAGIC "\nrepo %s\nfile %s\nrevision %s\ncommit %s\nsize %lld\nsha256 %s\n",
        src->repo, src->file, src->revision, commit[0] ? commit : "-", (long long)size, sha[0] ? sha : "-");
    int fd = open(tpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return fm_set_error(err, errlen, "cannot create %s: %s", tpath, strerror(errno));
    int ok = n > 0 && (size_t)n < sizeof buf && write(fd, buf, (size_t)n) == n && fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0) ok = 0;
    if (!ok) {
        unlink(tpath);
        return fm_set_error(err, errlen, "cannot write %s: %s", tpath, strerror(e));
    }
    if (rename(tpath, mpath) != 0) {
        e = errno;
        unlink(tpath);
        return fm_set_error(err, errlen, "cannot rename %s to %s: %s", tpath, mpath, strerror(e));
    }
    if (fsync_dir_of(mpath) != 0)
        return fm_set_error(err, errlen, "cannot fsync the folder of %s: %s", mpath, strerror(errno));
    return 0;
}

/* ---- helpers ---- */

static int mkdir_parents(const char *path, char *err, size_t errlen) {
    char buf[4200];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return fm_set_error(err, errlen, "cannot create %s: %s", buf, strerror(errno));
        *p = '/';
    }
    return 0;
}

static void say(const fm_pull_opts *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(const fm_pull_opts *o, const char *fmt, ...) {
    if (!o->notice) return;
    char msg[FM_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    o->notice(o->cb_ctx, msg);
}

/* sha256 of a whole file into hex; progress through the pull's callback; stops on cancel (returns 1). */
static int hash_file(const char *path, const fm_pull_opts *o, char hex[65], char *err, size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return fm_set_error(err, errlen, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    int64_t total = fstat(fd, &sb) == 0 ? (int64_t)sb.st_size : -1;
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return fm_set_error(err, errlen, "out of memory hashing %s", path);
    }
    fm_sha256 h;
    fm_sha256_init(&h);
    int64_t done = 0;
    int rc = 0;
    for (;;) {
        if (o->cancel && *o->cancel) {
            rc = 1;
            break;
        }
        ssize_t r = read(fd, buf, CHUNK);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            rc = fm_set_error(err, errlen, "cannot read %s: %s", path, strerror(errno));
            break;
        }
        if (r == 0) break;
        fm_sha256_update(&h, buf, (size_t)r);
        done += r;
        if (o->progress) o->progress(o->cb_ctx, done, total);
    }
    free(buf);
    close(fd);
    uint8_t d[32];
    fm_sha256_final(&h, d); /* also on failure: it releases the context */
    if (rc == 0) fm_sha256_hex(d, hex);
    return rc;
}

/* Takes the exclusive lock on <path>.lock, waiting (with a notice) when another pull holds it. Returns the
 * fd, -1 on error, -2 when cancelled while waiting. */
static int lock_take(const char *path, const fm_pull_opts *o, char *err, size_t errlen) {
    char lpath[4200];
    snprintf(lpath, sizeof lpath, "%s.lock", path);
    int fd = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return fm_set_error(err, errlen, "cannot open lock %s: %s", lpath, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) return fd;
    if (errno != EWOULDBLOCK) {
        int e = errno;
        close(fd);
        return fm_set_error(err, errlen, "cannot lock %s: %s", lpath, strerror(e));
    }
    say(o, "another flashmap pull is downloading %s; waiting for it (lock %s)", path, lpath);
    while (flock(fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            int e = errno;
            close(fd);
            return fm_set_error(err, errlen, "cannot lock %s: %s", lpath, strerror(e));
        }
        if (o->cancel && *o->cancel) {
            close(fd);
            fm_set_error(err, errlen, "interrupted while waiting for the lock %s", lpath);
            return -2;
        }
    }
    return fd;
}

/* The body of a pull once the lock is held. */
static int pull_locked(const fm_cache_source *src, const fm_pull_opts *o, const char *path,
                       fm_pull_result *res, char *err, size_t errlen) {
    char partial[4200], mpath[4200], url[8192];
    snprintf(partial, sizeof partial, "%s.partial", path);
    snprintf(mpath, sizeof mpath, "%s.complete", path);
    if (fm_cache_is_complete(path, src)) {
        res->already_complete = 1;
        return 0;
    }
    /* Never trust a final name without a valid marker: verify it again as a partial. */
    struct stat sb;
    unlink(mpath);
    if (stat(path, &sb) == 0) {
        if (access(partial, F_OK) != 0) {
            say(o, "%s has no valid completion marker; verifying it again", path);
            if (rename(path, partial) != 0)
                return fm_set_error(err, errlen, "cannot rename %s: %s", path, strerror(errno));
        } else if (unlink(path) != 0) {
            return fm_set_error(err, errlen, "cannot remove unverified %s: %s", path, strerror(errno));
        }
    }
    if (fm_cache_url(src, url, sizeof url, err, errlen)) return -1;
    fm_fetch_opts fo = {.url = url,
                        .partial_path = partial,
                        .auth_header = o->auth_header,
                        .expect_size = src->size,
                        .expect_sha256 = src->sha256,
                        .connect_timeout_s = o->connect_timeout_s,
                        .stall_timeout_s = o->stall_timeout_s,
                        .cancel = o->cancel,
                        .progress = o->progress,
                        .notice = o->notice,
                        .cb_ctx = o->cb_ctx};
    fm_fetch_result fr;
    int rc = fm_fetch_to_partial(&fo, &fr, err, errlen);
    res->received = fr.received;
    snprintf(res->commit, sizeof res->commit, "%s", fr.repo_commit);
    if (rc != 0) {
        res->interrupted = fr.interrupted;
        if (stat(partial, &sb) == 0 && sb.st_size == 0)
            unlink(partial); /* nothing to resume (404, 5xx, pins) */
        return -1;
    }
    if (stat(partial, &sb) != 0)
        return fm_set_error(err, errlen, "cannot stat %s: %s", partial, strerror(errno));
    int64_t have = (int64_t)sb.st_size;
    int64_t expect = src->size >= 0 ? src->size : fr.total;
    if (expect >= 0 && have < expect)
        return fm_set_error(
            err, errlen, "incomplete download of %s: %lld of %lld bytes (partial kept; pull again to resume)",
            url, (long long)have, (long long)expect);
    if (expect >= 0 && have > expect) {
        unlink(partial);
        return fm_set_error(err, errlen, "download of %s is %lld bytes, expected %lld (discarded)", url,
                            (long long)have, (long long)expect);
    }
    const char *want = src->sha256 ? src->sha256 : (fr.sha256[0] ? fr.sha256 : NULL);
    if (src->sha256 && fr.sha256[0] && strcasecmp(src->sha256, fr.sha256))
        return fm_set_error(err, errlen, "the hub announces sha256 %s for %s but the pinned sha256 is %s",
                            fr.sha256, url, src->sha256);
    char got[65] = "";
    if (want) {
        say(o, "verifying sha256 of %s", partial);
        int hr = hash_file(partial, o, got, err, errlen);
        if (hr == 1) {
            res->interrupted = 1;
            return fm_set_error(
                err, errlen, "interrupted while verifying %s (download complete; the next pull verifies it)",
                partial);
        }
        if (hr != 0) return -1;
        if (strcasecmp(got, want)) {
            unlink(partial);
            return fm_set_error(
                err, errlen, "sha256 mismatch for %s: expected %s, got %s (download discarded; pull again)",
                path, want, got);
        }
    }
    int fd = open(partial, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fsync(fd) != 0) {
        int e = errno;
        if (fd >= 0) close(fd);
        return fm_set_error(err, errlen, "cannot fsync %s: %s", partial, strerror(e));
    }
    close(fd);
    if (rename(partial, path) != 0)
        return fm_set_error(err, errlen, "cannot rename %s to %s: %s", partial, path, strerror(errno));
    if (fsync_dir_of(path) != 0)
        return fm_set_error(err, errlen, "cannot fsync the folder of %s: %s", path, strerror(errno));
    if (marker_write(path, src, fr.repo_commit, have, got, err, errlen)) return -1;
    res->size = have;
    snprintf(res->sha256, sizeof res->sha256, "%s", got);
    return 0;
}

int fm_cache_pull(const fm_cache_source *src, const fm_pull_opts *o, fm_pull_result *res, char *err,
                  size_t errlen) {
    memset(res, 0, sizeof *res);
    char dir[4096];
    const char *cache = o->cache_dir;
    if (!cache) {
        if (fm_cache_dir(dir, sizeof dir, err, errlen)) return -1;
        cache = dir;
    }
    if (fm_cache_file_path(cache, src, res->path, sizeof res->path, err, errlen)) return -1;
    if (fm_cache_is_complete(res->path, src)) {
        res->already_complete = 1;
    } else {
        if (mkdir_parents(res->path, err, errlen)) return -1;
        int lfd = lock_take(res->path, o, err, errlen);
        if (lfd == -2) res->interrupted = 1;
        if (lfd < 0) return -1;
        int rc = pull_locked(src, o, res->path, res, err, errlen);
        close(lfd); /* releases the flock */
        if (rc != 0) return -1;
    }
    if (res->already_complete) {
        marker m;
        if (marker_read(res->path, &m) == 0) {
            res->size = m.size;
            snprintf(res->sha256, sizeof res->sha256, "%.64s", strcmp(m.sha256, "-") ? m.sha256 : "");
            snprintf(res->commit, sizeof res->commit, "%.64s", strcmp(m.commit, "-") ? m.commit : "");
        }
    }
    return 0;
}

int fm_cache_resolve_default(fm_cache_kind kind, char *path, size_t pathlen, char *err, size_t errlen) {
    const fm_cache_source *srcs;
    size_t n = fm_cache_default_sources(kind, &srcs);
    const char *what = kind == FM_CACHE_TARGET ? "target" : "drafter";
    const char *flag = kind == FM_CACHE_TARGET ? "-m" : "-d";
    char cache[4096], file[4200];
    if (fm_cache_dir(cache, sizeof cache, err, errlen)) return -1;
    for (size_t i = 0; i < n; i++) {
        if (fm_cache_file_path(cache, &srcs[i], file, sizeof file, err, errlen)) return -1;
        if (fm_cache_is_complete(file, &srcs[i])) continue;
        char partial[4300];
        struct stat sb;
        snprintf(partial, sizeof partial, "%s.partial", file);
        if (stat(partial, &sb) == 0)
            return fm_set_error(
                err, errlen,
                "the default %s %s (%s) is only partly downloaded (%lld bytes in %s): run `flashmap pull "
                "--%s` to resume it, or pass %s FILE",
                what, srcs[i].file, srcs[i].repo, (long long)sb.st_size, partial, what, flag);
        return fm_set_error(
            err, errlen,
            "the default %s %s (%s at %.12s) is not in the cache %s: run `flashmap pull --%s`, or pass "
            "%s FILE",
            what, srcs[i].file, srcs[i].repo, srcs[i].revision, cache, what, flag);
    }
    if (fm_cache_file_path(cache, &srcs[0], file, sizeof file, err, errlen)) return -1;
    if (kind == FM_CACHE_DRAFTER)
        *strrchr(file, '/') = '\0'; /* the folder holding model.safetensors + config.json */
    if (strlen(file) >= pathlen) return fm_set_error(err, errlen, "path buffer too small for %s", file);
    snprintf(path, pathlen, "%s", file);
    return 0;
}
