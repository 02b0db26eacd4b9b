/* model_cache.h: the local model cache that `flashmap pull` fills and `flashmap generate` reads.
 *
 * Layout (docs/CACHE.md):
 *   <cache>/<owner>--<name>/<revision>/<file>            the file, only ever renamed there when verified
 *   <cache>/<owner>--<name>/<revision>/<file>.partial    bytes downloaded so far (resumable)
 *   <cache>/<owner>--<name>/<revision>/<file>.complete   the marker: revision, commit, size, sha256
 *   <cache>/<owner>--<name>/<revision>/<file>.lock       flock(2) taken by the pull that owns the file
 * <cache> is $FLASHMAP_CACHE, else $XDG_CACHE_HOME/flashmap, else $HOME/.cache/flashmap.
 *
 * Invariants:
 * - A file is complete only when its marker exists, names the expected revision and the file's size, and the
 *   file on disk has that size. The marker is written (temp + fsync + rename + fsync of the folder) only
 * after the size check and, when a sha256 is known (pinned or announced by the hub), the sha256 check.
 * - A file found under its final name without a marker is never trusted: the next pull moves it back to
 *   .partial and verifies it again.
 * - One pull at a time per file (flock on .lock); a second pull waits and then finds the file complete. */
#ifndef FM_IO_MODEL_CACHE_H
#define FM_IO_MODEL_CACHE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "io/fetch.h"

typedef enum fm_cache_kind { FM_CACHE_TARGET, FM_CACHE_DRAFTER } fm_cache_kind;

/* One file of one repository at one revision. size -1 and sha256 NULL mean "not pinned". */
typedef struct fm_cache_source {
    const char *repo;     /* "owner/name" */
    const char *revision; /* a 40-hex commit (pinned) or a branch/tag such as "main" (not pinned) */
    const char *file;     /* path inside the repository */
    int64_t size;         /* bytes, or -1 */
    const char *sha256;   /* 64 lowercase hex digits, or NULL */
} fm_cache_source;

/* The pinned default files of a kind: the target is one GGUF; the drafter is model.safetensors and
 * config.json. Returns the number of entries written to *srcs (a static table). */
size_t fm_cache_default_sources(fm_cache_kind kind, const fm_cache_source **srcs);

/* The cache folder per the environment (not created). */
int fm_cache_dir(char *out, size_t outlen, char *err, size_t errlen);

/* <cache>/<owner>--<name>/<revision>/<file>, after validating repo, revision and file names. */
int fm_cache_file_path(const char *cache_dir, const fm_cache_source *src, char *out, size_t outlen, char *err,
                       size_t errlen);

/* The download URL: ${HF_ENDPOINT:-https://huggingface.co}/<repo>/resolve/<revision>/<file>. */
int fm_cache_url(const fm_cache_source *src, char *out, size_t outlen, char *err, size_t errlen);

/* 1 when path is complete for src (marker present and consistent, size matches), else 0. */
int fm_cache_is_complete(const char *path, const fm_cache_source *src);

typedef struct fm_pull_opts {
    const char *cache_dir;               /* NULL: fm_cache_dir() */
    const char *auth_header;             /* "Authorization: Bearer ..." or NULL */
    double connect_timeout_s;            /* <= 0: default (30 s) */
    double stall_timeout_s;              /* <= 0: default (60 s) */
    const volatile sig_atomic_t *cancel; /* SIGINT flag, may be NULL */
    fm_fetch_progress_fn progress;       /* transfer and hashing progress */
    fm_fetch_notice_fn notice;           /* lines such as "waiting for another pull of ..." */
    void *cb_ctx;
} fm_pull_opts;

typedef struct fm_pull_result {
    char path[4096];      /* the final file (valid when the pull succeeded) */
    int already_complete; /* 1 when nothing had to be done */
    int interrupted;      /* 1 when opts->cancel stopped the pull (partial kept) */
    int64_t size;         /* bytes of the final file */
    int64_t received;     /* bytes downloaded by this call */
    char sha256[65];      /* the verified sha256, "" when none was known */
    char commit[65];      /* the resolved commit (X-Repo-Commit), "" when unknown */
} fm_pull_result;

/* Brings src into the cache: lock, resume or download, check size and sha256, rename, mark. */
int fm_cache_pull(const fm_cache_source *src, const fm_pull_opts *opts, fm_pull_result *res, char *err,
                  size_t errlen);

/* The local path of the default target (the .gguf file) or drafter (the folder holding model.safetensors
 * and config.json) when every file of it is complete; else -1 with an error telling the user to run
 * `flashmap pull`. */
int fm_cache_resolve_default(fm_cache_kind kind, char *path, size_t pathlen, char *err, size_t errlen);

#endif
