/* serve_routes.c: the endpoints of `flashmap serve`: GET /health, GET /v1/models, POST /v1/completions and
 * POST /v1/chat/completions. A generation request is checked here (400 before it waits in the queue), then
 * becomes a job for the worker; its connection thread waits for the answer, and gives up (cancelling the job)
 * if the client leaves. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve_http.h"

#define POLL_MS 250 /* how often a waiting connection looks at its client */

static enum MHD_Result reply_error(struct MHD_Connection *c, const char *method, const char *url,
                                   const serve_error *e, const char *allow) {
    fprintf(stderr, "flashmap serve: %s %s -> %d: %s\n", method, url, e->status, e->message);
    char *json = serve_openai_error(e);
    enum MHD_Result ret = serve_http_json(c, e->status, json, allow);
    free(json);
    return ret;
}

static enum MHD_Result generate(const serve_http_config *cfg, struct MHD_Connection *c, serve_kind kind,
                                const char *method, const char *url, const char *body, size_t len) {
    serve_request req;
    serve_error err;
    if (serve_request_parse(kind, body, len, &cfg->sampling, &req, &err))
        return reply_error(c, method, url, &err, NULL);
    serve_job *j = serve_job_create(&req, cfg->model);
    if (!j) {
        serve_request_free(&req);
        serve_error_set(&err, 500, "server_error", NULL, "out of memory");
        return reply_error(c, method, url, &err, NULL);
    }
    if (serve_worker_submit(cfg->worker, j, &err)) {
        serve_job_release(j);
        return reply_error(c, method, url, &err, NULL);
    }
    /* A stream starts once the worker has taken the prompt (a refused prompt still gets its status). */
    const serve_job_state until = serve_job_is_stream(j) ? SERVE_JOB_RUNNING : SERVE_JOB_DONE;
    serve_job_state st;
    while ((st = serve_job_wait(j, until, POLL_MS)) < until && st != SERVE_JOB_DONE) {
        if (serve_http_client_gone(c)) {
            serve_job_cancel(j);
            serve_job_release(j);
            return MHD_NO;
        }
    }
    const char *json = NULL;
    const int status = serve_job_response(j, &json);
    if (serve_job_is_stream(j) && !json) return serve_http_stream(c, j); /* takes our reference */
    if (status != 200) fprintf(stderr, "flashmap serve: %s %s -> %d\n", method, url, status);
    enum MHD_Result ret = serve_http_json(c, status, json, NULL);
    serve_job_release(j);
    return ret;
}

enum MHD_Result serve_route(const serve_http_config *cfg, struct MHD_Connection *c, const char *method,
                            const char *raw_url, const char *body, size_t len) {
    /* The path as it goes into messages and the log: short, no control characters (it arrives unescaped). */
    char url[256];
    snprintf(url, sizeof url, "%s", raw_url);
    for (char *u = url; *u; u++)
        if ((unsigned char)*u < 0x20 || *u == 0x7f) *u = '?';
    static const struct {
        const char *path, *method;
        int kind; /* -1: GET endpoint, else the serve_kind of a generation */
    } routes[] = {
        {"/health", "GET", -1},
        {"/v1/models", "GET", -1},
        {"/v1/completions", "POST", SERVE_COMPLETION},
        {"/v1/chat/completions", "POST", SERVE_CHAT},
    };
    serve_error err;
    for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++) {
        if (strcmp(url, routes[i].path)) continue;
        const int get = routes[i].kind < 0;
        if (strcmp(method, routes[i].method) && !(get && !strcmp(method, "HEAD"))) {
            serve_error_set(&err, 405, "invalid_request_error", NULL, "%s takes %s, not %s", url,
                            routes[i].method, method);
            return reply_error(c, method, url, &err, get ? "GET, HEAD" : "POST");
        }
        if (!get) return generate(cfg, c, (serve_kind)routes[i].kind, method, url, body, len);
        char *json = i == 0 ? strdup("{\"status\":\"ok\"}")
                            : serve_openai_models(cfg->model, cfg->created, cfg->n_ctx);
        enum MHD_Result ret = serve_http_json(c, 200, json, NULL);
        free(json);
        return ret;
    }
    serve_error_set(&err, 404, "invalid_request_error", NULL,
                    "no endpoint %s %s (there are GET /health, GET /v1/models, POST /v1/completions and POST "
                    "/v1/chat/completions)",
                    method, url);
    err.code = "not_found";
    return reply_error(c, method, url, &err, NULL);
}
