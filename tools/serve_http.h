/* serve_http.h: the HTTP side of `flashmap serve`, on libmicrohttpd with one thread per connection (a
 * connection thread may wait for its job without holding anyone else up). It reads request bodies up to a
 * limit, hands complete requests to serve_route (serve_routes.c), and offers the routes their ways to answer:
 * a JSON body, or a stream of Server-Sent Events read from a job. */
#ifndef FM_TOOLS_SERVE_HTTP_H
#define FM_TOOLS_SERVE_HTTP_H

#include <microhttpd.h>
#include <stddef.h>

#include "serve_worker.h"

typedef struct {
    serve_worker *worker;
    const char *model; /* the id in /v1/models and in every reply */
    long created;      /* when the server started (unix seconds) */
    int n_ctx;
    size_t max_body;                  /* bytes; a larger body gets 413 */
    serve_sampling_defaults sampling; /* what a request's absent sampling fields take (serve --temp ...) */
} serve_http_config;

typedef struct serve_http serve_http;

/* A listening TCP socket on host:port (port 0: any free one, *bound_port says which); -1 with err. */
int serve_http_listen(const char *host, int port, int *bound_port, char *err, size_t errlen);
/* Serves on listen_fd (taken over) until serve_http_stop. cfg must outlive the server. */
serve_http *serve_http_start(int listen_fd, const serve_http_config *cfg, char *err, size_t errlen);
/* Waits up to ms for the requests in progress to be answered (at shutdown, after the worker stopped, so
 * that their 503s and the ends of their streams reach the clients). */
void serve_http_drain(serve_http *h, int ms);
void serve_http_stop(serve_http *h);

/* ---- for serve_routes.c ---- */

/* Answers one complete request (body: [len] bytes, NUL-terminated). */
enum MHD_Result serve_route(const serve_http_config *cfg, struct MHD_Connection *c, const char *method,
                            const char *url, const char *body, size_t len);
/* Queues a JSON response (allow: an Allow header for 405, or NULL). */
enum MHD_Result serve_http_json(struct MHD_Connection *c, int status, const char *json, const char *allow);
/* Queues a 200 text/event-stream response that reads j's events; takes the caller's reference to j. */
enum MHD_Result serve_http_stream(struct MHD_Connection *c, serve_job *j);
/* 1 when the client closed its side of the connection (so nobody waits for the answer). */
int serve_http_client_gone(struct MHD_Connection *c);

#endif
