/* fetch.h: download one URL into a partial file with libcurl, resuming from the bytes already there.
 *
 * Invariants:
 * - Bytes only ever go into opts->partial_path; this module never names or renames a final file (the
 *   cache, model_cache.c, verifies and renames). On every failure the partial is kept as it is, so the
 *   next call resumes with `Range: bytes=N-` from its size.
 * - A 206 answer must start exactly at N (Content-Range); a 200 answer to a Range request means the
 *   server ignored it, and the partial is truncated and refilled from byte 0.
 * - Redirects are followed (the hub sends LFS files to a CDN). An Authorization header is sent to the
 *   first host only: libcurl drops custom auth headers when a redirect changes host or port.
 * - Hub metadata (X-Linked-Etag / X-Linked-Size / X-Repo-Commit) is read from whichever response in the
 *   redirect chain carries it; a plain ETag counts as a sha256 only when it is 64 hex digits (the hub's
 *   LFS ETag; small git files have a 40-digit git blob id instead).
 * - Expected size / sha256, when given, are checked against the server's headers before any body byte is
 *   written, so a wrong server or a wrong pin fails fast instead of after gigabytes.
 * Library code: no printing; progress and notices go through callbacks. */
#ifndef FM_IO_FETCH_H
#define FM_IO_FETCH_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

/* Progress: bytes of the whole file present so far (resume offset included) and the file's total size
 * (-1 when unknown). Called from inside the transfer, often; the caller throttles its display. */
typedef void (*fm_fetch_progress_fn)(void *ctx, int64_t have, int64_t total);
/* Notices: one human-readable line without newline ("resuming at ...", "server ignored Range ..."). */
typedef void (*fm_fetch_notice_fn)(void *ctx, const char *msg);

typedef struct fm_fetch_opts {
    const char *url;                     /* http(s) URL */
    const char *partial_path;            /* file the bytes go to; created when absent, appended to */
    const char *auth_header;             /* e.g. "Authorization: Bearer hf_..."; NULL for none */
    int64_t expect_size;                 /* full file size when pinned, else -1 */
    const char *expect_sha256;           /* 64 lowercase hex digits when pinned, else NULL */
    double connect_timeout_s;            /* <= 0: 30 s */
    double stall_timeout_s;              /* abort when under 1 byte/s for this long; <= 0: 60 s */
    const volatile sig_atomic_t *cancel; /* when non-NULL and nonzero, the transfer stops (SIGINT) */
    fm_fetch_progress_fn progress;
    fm_fetch_notice_fn notice;
    void *cb_ctx;
} fm_fetch_opts;

typedef struct fm_fetch_result {
    int64_t have;  /* size of the partial file when the call returned */
    int64_t total; /* full size as the server stated it (Content-Range / length / X-Linked-Size), or -1 */
    int64_t resumed_from; /* offset the (last) request asked for with Range, 0 when none */
    int64_t received;     /* body bytes written by this call */
    int restarted;        /* 1 when the partial was discarded because the server ignored Range */
    int interrupted;      /* 1 when *cancel stopped the transfer (the partial is kept) */
    char sha256[65];      /* hub's sha256 from X-Linked-Etag or a 64-hex ETag; "" when none */
    char repo_commit[65]; /* hub's X-Repo-Commit; "" when none */
    long http_status;     /* status of the final response, 0 when none arrived */
} fm_fetch_result;

/* Downloads opts->url into opts->partial_path. Returns 0 when the server delivered the whole body
 * (the caller still checks size and sha256), -1 with one line in err otherwise (res->interrupted tells a
 * cancel apart from a failure). When expect_size is known and the partial already holds that many bytes,
 * no request is made. */
int fm_fetch_to_partial(const fm_fetch_opts *opts, fm_fetch_result *res, char *err, size_t errlen);

/* Reports whether s is exactly 64 hex digits (a sha256 as the hub writes it). */
int fm_fetch_is_sha256_hex(const char *s);

#endif
