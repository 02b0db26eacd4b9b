"""pull_server.py: a fake Hugging Face hub for tests/test_pull.py (python3 stdlib only).

Serves files at /<repo>/resolve/<revision>/<file> like the hub: Range requests answered 206 with
Content-Range, 416 past the end, and hub metadata headers (X-Linked-Etag = sha256, X-Linked-Size,
X-Repo-Commit). Faults are injected per path through `server.faults[path] = {...}`:
  status: N            answer N (404, 500, ...) with a small body
  redirect: URL        answer 302 to URL (absolute or path), with the hub's X-Linked-* headers
  ignore_range: True   answer 200 with the whole body even when a Range is asked for
  drop_after: N        send headers for the full body, N body bytes, then close the connection
  cl_extra: N          announce N more bytes in Content-Length than are sent, then close
  stall_after: N       send N body bytes, then send nothing until the server stops
  bad_content_range: True  answer a Range request with 206 starting at byte 0
  corrupt: True        flip one byte of the body (the headers still announce the true sha256)
  rate: B              send at about B bytes per second (for interrupt / concurrency tests)
  no_meta: True        send no X-Linked-* / ETag headers
  once: True           the fault applies to the first request only
Every request is logged (method, path, Range, Authorization, Host) in `server.log`, and body bytes sent
are added to `server.bytes_sent[path]`.
"""
import hashlib
import http.server
import threading
import time


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # keep the test output quiet
        pass

    def _fault(self, path):
        srv = self.server
        with srv.lock:
            f = dict(srv.faults.get(path, {}))
            if f.get("once"):
                srv.faults.pop(path, None)
        return f

    def _meta_headers(self, path, data):
        self.send_header("X-Linked-Etag", '"%s"' % hashlib.sha256(data).hexdigest())
        self.send_header("X-Linked-Size", str(len(data)))
        self.send_header("X-Repo-Commit", self.server.commit)

    def do_HEAD(self):
        self.do_GET(head=True)

    def do_GET(self, head=False):
        srv = self.server
        path = self.path.split("?", 1)[0]
        rng = self.headers.get("Range")
        with srv.lock:
            srv.log.append({"method": self.command, "path": path, "range": rng,
                            "auth": self.headers.get("Authorization"), "host": self.headers.get("Host")})
        f = self._fault(path)
        if "status" in f:
            body = b"error %d\n" % f["status"]
            self.send_response(f["status"])
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        data = srv.files.get(path)
        if "redirect" in f:
            target = srv.files.get(f.get("meta_of", ""), data)
            self.send_response(302)
            self.send_header("Location", f["redirect"])
            if target is not None:
                self._meta_headers(path, target)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if data is None:
            body = b"Entry not found"
            self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        true_data = data
        if f.get("corrupt"):
            b = bytearray(data)
            b[len(b) // 2] ^= 0xFF
            data = bytes(b)
        start = 0
        status = 200
        if rng and not f.get("ignore_range"):
            spec = rng.split("=", 1)[1]
            first = spec.split("-", 1)[0]
            start = int(first)
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", "bytes */%d" % len(data))
                if not f.get("no_meta"):
                    self._meta_headers(path, true_data)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            status = 206
            if f.get("bad_content_range"):
                start = 0  # a 206 that does not start where the Range asked
        body = data[start:]
        self.send_response(status)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, len(data) - 1, len(data)))
        if not f.get("no_meta"):
            self._meta_headers(path, true_data)
            self.send_header("ETag", '"%s"' % hashlib.sha256(true_data).hexdigest())
        self.send_header("Content-Length", str(len(body) + f.get("cl_extra", 0)))
        self.end_headers()
        if head:
            return
        limit = len(body)
        for key in ("drop_after", "stall_after"):
            if key in f:
                limit = min(limit, max(0, f[key] - start))
        rate = f.get("rate")
        sent = 0
        try:
            while sent < limit:
                chunk = min(limit - sent, 16384 if not rate else max(1, rate // 20))
                self.wfile.write(body[sent:sent + chunk])
                self.wfile.flush()
                sent += chunk
                with srv.lock:
                    srv.bytes_sent[path] = srv.bytes_sent.get(path, 0) + chunk
                if rate:
                    time.sleep(chunk / rate)
            if "stall_after" in f:
                srv.stop_event.wait(60)
        except (BrokenPipeError, ConnectionResetError):
            pass
        if sent < len(body) + f.get("cl_extra", 0):
            self.close_connection = True


class FakeHub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), Handler)
        self.lock = threading.Lock()
        self.files = {}
        self.faults = {}
        self.log = []
        self.bytes_sent = {}
        self.commit = "0123456789abcdef0123456789abcdef01234567"
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self.serve_forever, daemon=True)

    def handle_error(self, request, client_address):
        pass  # clients that hang up (killed pulls, aborted transfers) are part of the tests

    @property
    def port(self):
        return self.server_address[1]

    def url(self, host="127.0.0.1"):
        return "http://%s:%d" % (host, self.port)

    def start(self):
        self.thread.start()
        return self

    def stop(self):
        self.stop_event.set()
        self.shutdown()
        self.server_close()

    def reset(self):
        with self.lock:
            self.faults.clear()
            self.log.clear()
            self.bytes_sent.clear()
