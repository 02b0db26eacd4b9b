/* serve_http.c: libmicrohttpd plumbing for `flashmap serve` (see serve_http.h).
 *
 * The listening socket is made here rather than by libmicrohttpd so that a port in use is reported as such
 * (MHD_start_daemon only says it failed). A streaming response's reader runs in its connection's thread and
 * blocks until the worker has events; while it waits it checks that the client is still there, and sends an
 * SSE comment now and then so libmicrohttpd's idle timeout does not close a stream whose prefill is long. */
#include "serve_http.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CONNECTION_LIMIT 64
#define IDLE_TIMEOUT_S 60 /* a connection with no traffic for this long is closed */
#define KEEPALIVE_S 15    /* a stream with no event for this long gets an SSE comment */
#define POLL_MS 250       /* how often waiting threads look at their client */

struct serve_http {
    struct MHD_Daemon *d;
    const serve_http_config *cfg;
    atomic_int in_flight; /* requests begun and not yet answered */
};

/* One request's body as it arrives. */
typedef struct {
    char *body; /* [len] + NUL */
    size_t len, cap;
    int too_large;
} conn_req;

int serve_http_listen(const char *host, int port, int *bound_port, char *err, size_t errlen) {
    char port_s[16];
    snprintf(port_s, sizeof port_s, "%d", port);
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int rc = getaddrinfo(host, port_s, &hints, &res);
    if (rc) {
        snprintf(err, errlen, "cannot resolve host '%s': %s", host, gai_strerror(rc));
        return -1;
    }
    int fd = -1, saved = 0;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            saved = errno;
            continue;
        }
        const int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 64)) {
            saved = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    if (fd < 0) {
        snprintf(err, errlen, "cannot listen on %s:%d: %s%s", host, port, strerror(saved),
                 saved == EADDRINUSE ? " (another server runs there: pick another --port)" : "");
        return -1;
    }
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    *bound_port = port;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0) {
        char serv[16];
        if (getnameinfo((struct sockaddr *)&ss, sl, NULL, 0, serv, sizeof serv, NI_NUMERICSERV) == 0)
            *bound_port = atoi(serv);
    }
    return fd;
}

enum MHD_Result serve_http_json(struct MHD_Connection *c, int status, const char *json, const char *allow) {
    static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\"}}";
    if (!json) {
        status = 500;
        json = oom;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(json), (void *)json, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int fd_gone(int fd) {
    struct pollfd p = {.fd = fd, .events = POLLRDHUP};
    return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

int serve_http_client_gone(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci && fd_gone(ci->connect_fd);
}

typedef struct {
    serve_job *job;
    int fd;
    double last; /* when the client was last sent something */
} sse_reader;

static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    sse_reader *s = cls;
    static const char keepalive[] = ": keep-alive\n\n";
    for (;;) {
        const long n = serve_job_read(s->job, buf, max, POLL_MS);
        if (n < 0) return MHD_CONTENT_READER_END_OF_STREAM;
        if (n > 0) {
            s->last = now_s();
            return (ssize_t)n;
        }
        if (fd_gone(s->fd)) {
            serve_job_cancel(s->job);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
        if (now_s() - s->last > KEEPALIVE_S && max >= sizeof keepalive - 1) {
            memcpy(buf, keepalive, sizeof keepalive - 1);
            s->last = now_s();
            return (ssize_t)(sizeof keepalive - 1);
        }
    }
}

/* The response is gone (sent, or its connection closed): a generation nobody reads stops. */
static void sse_free(void *cls) {
    sse_reader *s = cls;
    serve_job_cancel(s->job);
    serve_job_release(s->job);
    free(s);
}

enum MHD_Result serve_http_stream(struct MHD_Connection *c, serve_job *j) {
    sse_reader *s = calloc(1, sizeof *s);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!s || !ci) {
        free(s);
        serve_job_cancel(j);
        serve_job_release(j);
        return MHD_NO;
    }
    *s = (sse_reader){.job = j, .fd = ci->connect_fd, .last = now_s()};
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, sse_read, s, sse_free);
    if (!r) {
        sse_free(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ret = MHD_queue_response(c, 200, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result too_large(struct MHD_Connection *c, const serve_http_config *cfg) {
    serve_error e;
    serve_error_set(&e, 413, "invalid_request_error", NULL, "the request body is larger than %zu bytes",
                    cfg->max_body);
    char *json = serve_openai_error(&e);
    enum MHD_Result ret = serve_http_json(c, 413, json, NULL);
    free(json);
    return ret;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size,
                                  void **con_cls) {
    (void)version;
    serve_http *h = cls;
    conn_req *r = *con_cls;
    if (!r) {
        if (!(r = calloc(1, sizeof *r))) return MHD_NO;
        *con_cls = r;
        atomic_fetch_add(&h->in_flight, 1);
        /* A declared length over the limit is refused before the body is read. */
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > h->cfg->max_body) {
            r->too_large = 1;
            return too_large(c, h->cfg);
        }
        return MHD_YES;
    }
    if (*upload_size) {
        const size_t n = *upload_size;
        *upload_size = 0;
        if (r->too_large) return MHD_YES; /* read and dropped, answered at the end */
        if (r->len + n > h->cfg->max_body) {
            r->too_large = 1;
            free(r->body);
            r->body = NULL;
            r->len = r->cap = 0;
            return MHD_YES;
        }
        if (r->len + n + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 4096;
            while (cap < r->len + n + 1) cap *= 2;
            char *b = realloc(r->body, cap);
            if (!b) return MHD_NO;
            r->body = b;
            r->cap = cap;
        }
        memcpy(r->body + r->len, upload, n);
        r->len += n;
        r->body[r->len] = 0;
        return MHD_YES;
    }
    if (r->too_large) return too_large(c, h->cfg);
    return serve_route(h->cfg, c, method, url, r->body ? r->body : "", r->len);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode t) {
    (void)c, (void)t;
    serve_http *h = cls;
    conn_req *r = *con_cls;
    if (!r) return;
    atomic_fetch_sub(&h->in_flight, 1);
    free(r->body);
    free(r);
    *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
    (void)cls;
    char line[512];
    vsnprintf(line, sizeof line, fmt, ap);
    line[strcspn(line, "\n")] = 0;
    fprintf(stderr, "flashmap serve: http: %s\n", line);
}

serve_http *serve_http_start(int listen_fd, const serve_http_config *cfg, char *err, size_t errlen) {
    serve_http *h = calloc(1, sizeof *h);
    if (!h) {
        close(listen_fd);
        snprintf(err, errlen, "out of memory");
        return NULL;
    }
    h->cfg = cfg;
    const unsigned flags =
        MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG;
    h->d =
        MHD_start_daemon(flags, 0, NULL, NULL, on_request, h, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL,
                         MHD_OPTION_LISTEN_SOCKET, listen_fd, MHD_OPTION_CONNECTION_LIMIT,
                         (unsigned)CONNECTION_LIMIT, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)IDLE_TIMEOUT_S,
                         MHD_OPTION_NOTIFY_COMPLETED, on_completed, h, MHD_OPTION_END);
    if (!h->d) {
        close(listen_fd);
        free(h);
        snprintf(err, errlen, "cannot start the HTTP server (libmicrohttpd)");
        return NULL;
    }
    return h;
}

void serve_http_drain(serve_http *h, int ms) {
    for (int waited = 0; h && atomic_load(&h->in_flight) > 0 && waited < ms; waited += 10) usleep(10000);
}

void serve_http_stop(serve_http *h) {
    if (!h) return;
    MHD_stop_daemon(h->d);
    free(h);
}
