/* serve_worker.h: the one thread that owns the engine in `flashmap serve`. Connection threads turn requests
 * into jobs and submit them; the worker runs them one at a time in the order they arrived (the engine has a
 * single decoding context), each in a fresh conversation, and fills in the response: the whole JSON body, or
 * Server-Sent Events as tokens come. A job is shared by its connection and the worker (reference counted);
 * either side may cancel it (client gone, shutdown), which ends its generation at the next tokens. */
#ifndef FM_TOOLS_SERVE_WORKER_H
#define FM_TOOLS_SERVE_WORKER_H

#include <stddef.h>

#include "flashmap.h"
#include "serve_request.h"

typedef enum { SERVE_JOB_QUEUED, SERVE_JOB_RUNNING, SERVE_JOB_DONE } serve_job_state;
typedef struct serve_job serve_job;
typedef struct serve_worker serve_worker;

/* Takes over req (it is reset); NULL when out of memory. The caller holds one reference. */
serve_job *serve_job_create(serve_request *req, const char *model);
void serve_job_release(serve_job *j);
void serve_job_cancel(serve_job *j);
int serve_job_is_stream(const serve_job *j);
/* Waits up to ms for the job to reach `until` (or DONE); returns its state. */
serve_job_state serve_job_wait(serve_job *j, serve_job_state until, int ms);
/* Once DONE, or DONE before RUNNING (a refused prompt): the HTTP status and JSON body (owned by the job). */
int serve_job_response(serve_job *j, const char **body);
/* Streaming: copies up to max bytes of pending events, waiting up to ms for some. Returns the count, 0 when
 * none came, -1 at the end of the stream. */
long serve_job_read(serve_job *j, char *buf, size_t max, int ms);

typedef struct {
    int speculative; /* use the engine's drafter */
    int verify;      /* 0 adaptive, else drafts per verify block */
    int fallback;
} serve_worker_params;

serve_worker *serve_worker_start(fm_engine *e, const serve_worker_params *p, char *err, size_t errlen);
/* Queues j (the worker takes its own reference); -1 with a 503 error once the worker is stopping. */
int serve_worker_submit(serve_worker *w, serve_job *j, serve_error *err);
/* Stops taking jobs (later submits get 503), cancels the running one, fails the queued ones with 503 and
 * joins the thread. The connection threads may still call serve_worker_submit until serve_worker_free. */
void serve_worker_stop(serve_worker *w);
void serve_worker_free(serve_worker *w);

#endif
