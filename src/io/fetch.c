/* fetch.c: one URL into one partial file over libcurl's easy interface, resumable.
 *
 * Flow of one attempt: open the partial, take its size N, GET with `Range: bytes=N-` (when N > 0),
 * follow redirects, and decide at the first body byte of the final response:
 *   200 -> the server ignored the Range (or N was 0): truncate to 0 and take the whole body;
 *   206 -> Content-Range must start at N, else the attempt is abandoned and retried once from 0;
 *   416 -> "bytes * /TOTAL": when TOTAL == N the partial already holds everything;
 *   >= 400 -> the body is discarded and the status becomes the error.
 * Sizes and the sha256 announced by the headers are compared with the caller's pins at that moment.
 * Errors leave the partial as written so far; write(2) is used directly, so a killed process loses nothing
 * that the kernel accepted. */
#include "io/fetch.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

typedef struct fetch_state {
    const fm_fetch_opts *o;
    fm_fetch_result *res;
    int fd;
    int64_t offset;  /* partial size when the request was made (the Range start) */
    int64_t written; /* partial size now */
    int began;       /* the final response's body has started */
    int nresponses;  /* status lines seen (1 = the first hop) */
    /* fields of the current response; reset at each status line */
    long status;
    int cr_seen;
    int64_t cr_start, cr_total; /* Content-Range start and total; total -1 for "*" */
    int64_t content_length;
    /* hub metadata, kept across redirect hops */
    char linked_etag[80];
    char first_etag[80];
    int64_t linked_size;
    char repo_commit[65];
    /* outcome */
    int http_error;
    int range_mismatch;
    int write_errno;
    int stalled;                  /* no byte arrived for stall_timeout_s */
    double last_progress_t;       /* monotonic time of the last received byte (or of the start) */
    curl_off_t last_dlnow;        /* bytes received as of last_progress_t */
    char abort_msg[FM_ERROR_LEN]; /* why a callback stopped the transfer */
} fetch_state;

int fm_fetch_is_sha256_hex(const char *s) {
    if (!s) return 0;
    for (int i = 0; i < 64; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f') || (s[i] >= 'A' && s[i] <= 'F')))
            return 0;
    return s[64] == '\0';
}

/* Copies an ETag value without W/ and quotes, lowercased, into out. */
static void etag_normalize(const char *v, char *out, size_t outlen) {
    if (!strncmp(v, "W/", 2)) v += 2;
    size_t n = strlen(v);
    if (n >= 2 && v[0] == '"' && v[n - 1] == '"') {
        v++;
        n -= 2;
    }
    if (n >= outlen) n = outlen - 1;
    for (size_t i = 0; i < n; i++) out[i] = (char)((v[i] >= 'A' && v[i] <= 'Z') ? v[i] + 32 : v[i]);
    out[n] = '\0';
}

static int64_t parse_i64(const char *s) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0) return -1;
    return (int64_t)v;
}

/* Content-Range: "bytes START-END/TOTAL", or "bytes *" + "/TOTAL" on a 416; TOTAL may be "*". */
static void parse_content_range(fetch_state *st, const char *v) {
    if (strncasecmp(v, "bytes", 5)) return;
    v += 5;
    while (*v == ' ' || *v == '=') v++;
    st->cr_seen = 1;
    st->cr_start = -1;
    st->cr_total = -1;
    if (*v != '*') {
        char *end;
        st->cr_start = strtoll(v, &end, 10);
        if (end == v) st->cr_start = -1;
    }
    const char *slash = strchr(v, '/');
    if (slash && slash[1] != '*') st->cr_total = parse_i64(slash + 1);
}

static size_t header_cb(char *buf, size_t size, size_t nitems, void *ud) {
    fetch_state *st = ud;
    size_t n = size * nitems;
    char line[1024];
    size_t len = n < sizeof line - 1 ? n : sizeof line - 1;
    memcpy(line, buf, len);
    line[len] = '\0';
    while (len && (line[len - 1] == '\r' || line[len - 1] == '\n' || line[len - 1] == ' '))
        line[--len] = '\0';
    if (!strncmp(line, "HTTP/", 5)) {
        const char *sp = strchr(line, ' ');
        st->status = sp ? strtol(sp + 1, NULL, 10) : 0;
        st->nresponses++;
        st->cr_seen = 0;
        st->cr_start = st->cr_total = -1;
        st->content_length = -1;
        return n;
    }
    char *colon = strchr(line, ':');
    if (!colon) return n;
    *colon = '\0';
    const char *v = colon + 1;
    while (*v == ' ' || *v == '\t') v++;
    if (!strcasecmp(line, "content-range")) {
        parse_content_range(st, v);
    } else if (!strcasecmp(line, "content-length")) {
        st->content_length = parse_i64(v);
    } else if (!strcasecmp(line, "x-linked-etag")) {
        etag_normalize(v, st->linked_etag, sizeof st->linked_etag);
    } else if (!strcasecmp(line, "etag") && st->nresponses == 1) {
        etag_normalize(v, st->first_etag, sizeof st->first_etag);
    } else if (!strcasecmp(line, "x-linked-size")) {
        st->linked_size = parse_i64(v);
    } else if (!strcasecmp(line, "x-repo-commit")) {
        snprintf(st->repo_commit, sizeof st->repo_commit, "%s", v);
    }
    return n;
}

static void notice(const fetch_state *st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void notice(const fetch_state *st, const char *fmt, ...) {
    if (!st->o->notice) return;
    char msg[FM_ERROR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    st->o->notice(st->o->cb_ctx, msg);
}

/* Copies the hub's sha256 (X-Linked-Etag, else a 64-hex ETag of the first hop) and commit into the result. */
static void record_hub_meta(fetch_state *st) {
    const char *sha = fm_fetch_is_sha256_hex(st->linked_etag)  ? st->linked_etag
                      : fm_fetch_is_sha256_hex(st->first_etag) ? st->first_etag
                                                               : "";
    snprintf(st->res->sha256, sizeof st->res->sha256, "%.64s", sha);
    snprintf(st->res->repo_commit, sizeof st->res->repo_commit, "%s", st->repo_commit);
}

/* Called at the first body byte of the final response: decides between restart, resume and error,
 * and checks the announced size and sha256 against the pins. Returns 0 to go on, -1 to stop. */
static int begin_body(fetch_state *st) {
    const fm_fetch_opts *o = st->o;
    fm_fetch_result *res = st->res;
    st->began = 1;
    res->http_status = st->status;
    int64_t total = -1;
    if (st->status >= 300 || st->status < 200) {
        st->http_error = 1;
        return 0; /* body discarded; the status becomes the error after the transfer */
    }
    if (st->status == 200) {
        if (st->offset > 0) {
            notice(st, "server ignored the Range request; restarting %s from byte 0", o->partial_path);
            if (ftruncate(st->fd, 0) != 0 || lseek(st->fd, 0, SEEK_SET) != 0) {
                st->write_errno = errno;
                return -1;
            }
            res->restarted = 1;
            st->offset = 0;
            st->written = 0;
        }
        total = st->content_length;
    } else if (st->status == 206) {
        if (!st->cr_seen || st->cr_start != st->offset) {
            st->range_mismatch = 1;
            snprintf(st->abort_msg, sizeof st->abort_msg,
                     "server answered Range bytes=%lld- with Content-Range starting at %lld for %s",
                     (long long)st->offset, (long long)st->cr_start, o->url);
            return -1;
        }
        total = st->cr_total;
    } else {
        snprintf(st->abort_msg, sizeof st->abort_msg, "unexpected HTTP status %ld from %s", st->status,
                 o->url);
        return -1;
    }
    if (total >= 0 && st->linked_size >= 0 && total != st->linked_size) {
        snprintf(st->abort_msg, sizeof st->abort_msg,
                 "inconsistent sizes from %s: X-Linked-Size %lld but the response holds %lld bytes", o->url,
                 (long long)st->linked_size, (long long)total);
        return -1;
    }
    if (total < 0) total = st->linked_size;
    if (total >= 0 && o->expect_size >= 0 && total != o->expect_size) {
        snprintf(st->abort_msg, sizeof st->abort_msg,
                 "size mismatch for %s: server has %lld bytes, expected %lld", o->url, (long long)total,
                 (long long)o->expect_size);
        return -1;
    }
    res->total = total;
    record_hub_meta(st);
    const char *sha = res->sha256;
    if (sha[0] && o->expect_sha256 && strcasecmp(sha, o->expect_sha256)) {
        snprintf(st->abort_msg, sizeof st->abort_msg,
                 "sha256 mismatch for %s: server announces %s, expected %s", o->url, sha, o->expect_sha256);
        return -1;
    }
    if (st->offset > 0) notice(st, "resuming %s at byte %lld", o->partial_path, (long long)st->offset);
    return 0;
}

static size_t write_cb(char *ptr, size_t size, size_t nmemb, void *ud) {
    fetch_state *st = ud;
    size_t n = size * nmemb;
    if (!st->began && begin_body(st) != 0) return 0;
    if (st->http_error) return n;
    if (st->res->total >= 0 && st->written + (int64_t)n > st->res->total) {
        snprintf(st->abort_msg, sizeof st->abort_msg, "server sent more than the announced %lld bytes for %s",
                 (long long)st->res->total, st->o->url);
        return 0;
    }
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(st->fd, ptr + done, n - done);
        if (w < 0) {
            if (errno == EINTR) continue;
            st->write_errno = errno;
            return 0;
        }
        done += (size_t)w;
    }
    st->written += (int64_t)n;
    st->res->received += (int64_t)n;
    return n;
}

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double stall_limit_s(const fm_fetch_opts *o) {
    return o->stall_timeout_s > 0 ? o->stall_timeout_s : 60.0;
}

/* curl calls this at least about once a second, also while no data flows: the place for cancel and for the
 * stall check (our own, because curl's low-speed check averages over several seconds). */
static int xferinfo_cb(void *ud, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    (void)dltotal, (void)ultotal, (void)ulnow;
    fetch_state *st = ud;
    if (st->o->cancel && *st->o->cancel) return 1;
    double t = mono_s();
    if (dlnow != st->last_dlnow) {
        st->last_dlnow = dlnow;
        st->last_progress_t = t;
    } else if (t - st->last_progress_t > stall_limit_s(st->o)) {
        st->stalled = 1;
        return 1;
    }
    if (st->began && !st->http_error && st->o->progress)
        st->o->progress(st->o->cb_ctx, st->written, st->res->total);
    return 0;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init_once(void) {
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Turns a finished attempt into 0 (body complete), 1 (retry from 0) or -1 (err set). */
static int attempt_outcome(fetch_state *st, CURLcode rc, const char *curl_err, char *err, size_t errlen) {
    const fm_fetch_opts *o = st->o;
    fm_fetch_result *res = st->res;
    long long have = (long long)st->written;
    if (st->status && !res->http_status) res->http_status = st->status;
    if (rc == CURLE_OK && !st->began) {
        /* An empty body never reaches write_cb: a 200 with nothing, or an error status. */
        res->http_status = st->status;
        if (st->status == 200 && st->offset > 0) {
            if (ftruncate(st->fd, 0) != 0) st->write_errno = errno;
            st->written = 0;
            res->restarted = 1;
        }
        if (st->status >= 300 || st->status < 200) st->http_error = 1;
        if (st->status == 200) res->total = st->content_length >= 0 ? st->content_length : 0;
    }
    if (st->http_error || (rc == CURLE_OK && st->status >= 400)) {
        long s = st->status;
        if (s == 416 && st->cr_total >= 0 && st->cr_total == st->offset) {
            res->total = st->offset; /* the partial already holds the whole file */
            return 0;
        }
        if (s == 416) {
            notice(st, "server refused Range bytes=%lld- (file has %lld bytes); restarting from 0",
                   (long long)st->offset, (long long)st->cr_total);
            return 1;
        }
        if (s == 404) return fm_set_error(err, errlen, "not found: %s", o->url);
        if (s == 401 || s == 403)
            return fm_set_error(err, errlen, "access denied (HTTP %ld) for %s (set HF_TOKEN for gated repos)",
                                s, o->url);
        if (s >= 500)
            return fm_set_error(err, errlen, "server error HTTP %ld from %s (try again later; partial kept)",
                                s, o->url);
        return fm_set_error(err, errlen, "HTTP %ld from %s", s, o->url);
    }
    if (rc == CURLE_OK) return 0;
    if (st->range_mismatch) {
        notice(st, "%s; restarting from 0", st->abort_msg);
        return 1;
    }
    if (o->cancel && *o->cancel) {
        res->interrupted = 1;
        return fm_set_error(err, errlen, "interrupted; %lld bytes kept in %s", have, o->partial_path);
    }
    if (st->write_errno)
        return fm_set_error(err, errlen,
                            "cannot write %s: %s (%lld bytes kept; free space and pull again to resume)",
                            o->partial_path, strerror(st->write_errno), have);
    if (st->abort_msg[0]) return fm_set_error(err, errlen, "%s", st->abort_msg);
    if (st->stalled && !st->nresponses)
        return fm_set_error(err, errlen, "no response from %s for %g s (%lld bytes kept)", o->url,
                            stall_limit_s(o), have);
    if (st->stalled)
        return fm_set_error(
            err, errlen, "download stalled: no data for %g s from %s (%lld bytes kept; pull again to resume)",
            stall_limit_s(o), o->url, have);
    if (rc == CURLE_OPERATION_TIMEDOUT)
        return fm_set_error(err, errlen, "timed out connecting to %s: %s", o->url,
                            curl_err[0] ? curl_err : "timeout");
    if (rc == CURLE_PARTIAL_FILE || rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING)
        return fm_set_error(err, errlen,
                            "connection to %s closed early at %lld bytes%s%lld (partial kept; pull again "
                            "to resume)",
                            o->url, have, res->total >= 0 ? " of " : "",
                            (long long)(res->total >= 0 ? res->total : 0));
    return fm_set_error(err, errlen, "download of %s failed: %s", o->url,
                        curl_err[0] ? curl_err : curl_easy_strerror(rc));
}

int fm_fetch_to_partial(const fm_fetch_opts *o, fm_fetch_result *res, char *err, size_t errlen) {
    memset(res, 0, sizeof *res);
    res->total = -1;
    pthread_once(&curl_once, curl_init_once);
    if (curl_init_rc != CURLE_OK)
        return fm_set_error(err, errlen, "libcurl init failed: %s", curl_easy_strerror(curl_init_rc));
    int fd = open(o->partial_path, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return fm_set_error(err, errlen, "cannot open %s: %s", o->partial_path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        return fm_set_error(err, errlen, "cannot stat %s: %s", o->partial_path, strerror(e));
    }
    int64_t offset = sb.st_size;
    if (o->expect_size >= 0 && offset > o->expect_size) {
        /* Longer than the pinned file: it cannot be a prefix of it. */
        if (ftruncate(fd, 0) != 0) {
            int e = errno;
            close(fd);
            return fm_set_error(err, errlen, "cannot truncate %s: %s", o->partial_path, strerror(e));
        }
        offset = 0;
    }
    if (o->expect_size >= 0 && o->expect_sha256 && offset == o->expect_size) {
        /* Fully pinned and all bytes present: the caller's sha256 check decides; no request needed. Without a
         * pinned sha256 the request still goes out (answered 416) to learn the hub's sha256. */
        res->have = res->total = offset;
        close(fd);
        return 0;
    }
    int rcode = -1;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (o->cancel && *o->cancel) {
            res->interrupted = 1;
            rcode = fm_set_error(err, errlen, "interrupted; %lld bytes kept in %s", (long long)offset,
                                 o->partial_path);
            break;
        }
        if (lseek(fd, offset, SEEK_SET) != offset) {
            rcode = fm_set_error(err, errlen, "cannot seek in %s: %s", o->partial_path, strerror(errno));
            break;
        }
        fetch_state st = {.o = o,
                          .res = res,
                          .fd = fd,
                          .offset = offset,
                          .written = offset,
                          .linked_size = -1,
                          .cr_start = -1,
                          .cr_total = -1,
                          .content_length = -1,
                          .last_progress_t = mono_s()};
        res->resumed_from = offset;
        res->total = -1;
        CURL *c = curl_easy_init();
        if (!c) {
            rcode = fm_set_error(err, errlen, "libcurl: cannot create a handle");
            break;
        }
        char curl_err[CURL_ERROR_SIZE] = "";
        char range[48];
        struct curl_slist *hdrs = NULL;
        if (o->auth_header) hdrs = curl_slist_append(hdrs, o->auth_header);
        curl_easy_setopt(c, CURLOPT_URL, o->url);
        curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
        curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
#if LIBCURL_VERSION_NUM >= 0x075500
        curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
        curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
        curl_easy_setopt(c, CURLOPT_UNRESTRICTED_AUTH, 0L);
        curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(c, CURLOPT_USERAGENT, "flashmap/0.1");
        curl_easy_setopt(c, CURLOPT_ERRORBUFFER, curl_err);
        curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                         (long)(1000 * (o->connect_timeout_s > 0 ? o->connect_timeout_s : 30)));
        if (hdrs) curl_easy_setopt(c, CURLOPT_HTTPHEADER, hdrs);
        if (offset > 0) {
            snprintf(range, sizeof range, "%lld-", (long long)offset);
            curl_easy_setopt(c, CURLOPT_RANGE, range);
        }
        curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_cb);
        curl_easy_setopt(c, CURLOPT_HEADERDATA, &st);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, write_cb);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &st);
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, xferinfo_cb);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, &st);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
        CURLcode rc = curl_easy_perform(c);
        curl_easy_cleanup(c);
        curl_slist_free_all(hdrs);
        res->have = st.written;
        int out = attempt_outcome(&st, rc, curl_err, err, errlen);
        res->have = st.written;
        if (out == 1 && attempt == 0) {
            if (ftruncate(fd, 0) != 0) {
                rcode = fm_set_error(err, errlen, "cannot truncate %s: %s", o->partial_path, strerror(errno));
                break;
            }
            offset = 0;
            res->restarted = 1;
            continue;
        }
        if (out == 1)
            out = fm_set_error(err, errlen, "server at %s keeps answering Range requests inconsistently",
                               o->url);
        if (out == 0 && !st.began) record_hub_meta(&st); /* a 416 "already complete" has no body */
        rcode = out;
        break;
    }
    if (close(fd) != 0 && rcode == 0)
        return fm_set_error(err, errlen, "cannot close %s: %s", o->partial_path, strerror(errno));
    return rcode;
}
