"""test_pull.py: `flashmap pull` against a local fake hub with injected faults (python3 stdlib only).

Runs the CLI from $FM_CLI (else $FM_BINARY_DIR/flashmap) with HF_ENDPOINT pointing at tests/pull_server.py
and FLASHMAP_CACHE at a fresh temp folder per test. Every success is checked byte for byte against the
served file and for its completion marker; every failure for its exit status, its error line, and for
the absence of a marker (no partial is ever taken for complete). Prints "N passed, M failed".
"""
import hashlib
import os
import random
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pull_server import FakeHub  # noqa: E402

CLI = os.environ.get("FM_CLI") or os.path.join(os.environ.get("FM_BINARY_DIR", "build"), "flashmap")
REPO = "acme/tiny-model"
REV = "c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00"
FILE = "weights.bin"
TARGET_REV = "bc640142c66e1fdd12af0bd68f40445458f3869b"
DRAFTER_REV = "4e8d6a39a84ad108c5b60cb59072eb3f968c98cd"

hub = FakeHub().start()
passed = 0
failed = 0


def body(n, seed):
    return random.Random(seed).randbytes(n)


def hub_path(repo, rev, file):
    return "/%s/resolve/%s/%s" % (repo, rev, file)


def serve(data, repo=REPO, rev=REV, file=FILE):
    hub.files[hub_path(repo, rev, file)] = data
    return hub_path(repo, rev, file)


def cache_file(cache, repo=REPO, rev=REV, file=FILE):
    owner, name = repo.split("/")
    return os.path.join(cache, "%s--%s" % (owner, name), rev, file)


def env_for(cache, **extra):
    env = dict(os.environ)
    env.pop("HF_TOKEN", None)
    env.update({"HF_ENDPOINT": hub.url(), "FLASHMAP_CACHE": cache})
    env.update(extra)
    return env


def run(cache, args, timeout=30, preexec=None, **extra):
    p = subprocess.run([CLI, "pull"] + args, env=env_for(cache, **extra), capture_output=True, text=True,
                       timeout=timeout, preexec_fn=preexec)
    return p.returncode, p.stdout, p.stderr


def start(cache, args, **extra):
    return subprocess.Popen([CLI, "pull"] + args, env=env_for(cache, **extra), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def generic(extra=()):
    return [REPO, FILE, "--revision", REV] + list(extra)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def check_complete(cache, data, repo=REPO, rev=REV, file=FILE):
    path = cache_file(cache, repo, rev, file)
    check(os.path.exists(path), "final file missing: " + path)
    with open(path, "rb") as f:
        check(f.read() == data, "final file differs from the served bytes")
    with open(path + ".complete") as f:
        marker = f.read()
    check("revision %s\n" % rev in marker, "marker lacks the revision: " + marker)
    check("size %d\n" % len(data) in marker, "marker lacks the size: " + marker)
    check("sha256 %s\n" % hashlib.sha256(data).hexdigest() in marker, "marker lacks the sha256: " + marker)
    check(not os.path.exists(path + ".partial"), "partial left behind after success")
    return path


def check_not_complete(cache, repo=REPO, rev=REV, file=FILE):
    path = cache_file(cache, repo, rev, file)
    check(not os.path.exists(path + ".complete"), "marker written for an incomplete file")
    check(not os.path.exists(path), "final name holds an unverified file")
    return path


def gets(path):
    return [e for e in hub.log if e["path"] == path and e["method"] == "GET"]


def wait_for_partial(path, min_bytes, timeout=10):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if os.path.exists(path) and os.path.getsize(path) >= min_bytes:
            return os.path.getsize(path)
        time.sleep(0.02)
    raise AssertionError("no partial download appeared at " + path)


# ---------------------------------------------------------------------------------------------- tests

def test_basic_and_already_complete(cache):
    data = body(300_000, 1)
    p = serve(data)
    rc, out, err = run(cache, generic())
    check(rc == 0, "pull failed: " + err)
    path = check_complete(cache, data)
    check(out.strip() == path, "stdout should be the path, got %r" % out)
    n = len(gets(p))
    rc, out, err = run(cache, generic())
    check(rc == 0 and "already complete" in err, "second pull: " + err)
    check(len(gets(p)) == n, "a complete file was downloaded again")


def test_usage(cache):
    rc, out, _ = run(cache, ["--help"])
    check(rc == 0 and "REPO FILE" in out, "--help")
    rc, _, err = run(cache, [REPO])
    check(rc == 2 and "missing FILE" in err, "REPO without FILE: " + err)
    rc, _, err = run(cache, ["--target", "--size", "3"])
    check(rc == 2, "--size with --target must be refused")
    rc, _, err = run(cache, ["../evil", FILE])
    check(rc == 1 and "bad repository name" in err, "path traversal in REPO: " + err)
    rc, _, err = run(cache, [REPO, "../x", "--revision", REV])
    check(rc == 1 and "bad file name" in err, "path traversal in FILE: " + err)


def test_resume_after_drop(cache):
    data = body(400_000, 2)
    p = serve(data)
    cut = 123_457
    hub.faults[p] = {"drop_after": cut, "once": True}
    rc, _, err = run(cache, generic())
    check(rc == 1 and "closed early" in err, "dropped connection should fail clearly: " + err)
    path = check_not_complete(cache)
    check(os.path.getsize(path + ".partial") == cut, "partial should hold the %d bytes received" % cut)
    before = hub.bytes_sent.get(p, 0)
    rc, _, err = run(cache, generic())
    check(rc == 0, "resume failed: " + err)
    last = gets(p)[-1]
    check(last["range"] == "bytes=%d-" % cut, "resume should ask Range bytes=%d-, asked %r" % (cut, last["range"]))
    check(hub.bytes_sent[p] - before == len(data) - cut, "resume should fetch only the missing bytes")
    check_complete(cache, data)


def test_range_ignored(cache):
    data = body(250_000, 3)
    p = serve(data)
    path = cache_file(cache)
    os.makedirs(os.path.dirname(path))
    with open(path + ".partial", "wb") as f:
        f.write(b"\xAA" * 50_000)  # wrong bytes: only a restart from 0 can produce the right file
    hub.faults[p] = {"ignore_range": True}
    rc, _, err = run(cache, generic())
    check(rc == 0, "pull failed: " + err)
    check(gets(p)[-1]["range"] == "bytes=50000-", "a Range request should have been made")
    check("ignored the Range" in err, "restart should be reported: " + err)
    check_complete(cache, data)


def test_bad_content_range(cache):
    data = body(200_000, 4)
    p = serve(data)
    path = cache_file(cache)
    os.makedirs(os.path.dirname(path))
    with open(path + ".partial", "wb") as f:
        f.write(data[:1000])
    hub.faults[p] = {"bad_content_range": True}
    rc, _, err = run(cache, generic())
    check(rc == 0, "pull failed: " + err)
    check("Content-Range starting at 0" in err, "the inconsistent 206 should be reported: " + err)
    check_complete(cache, data)


def test_short_body(cache):
    data = body(150_000, 5)
    p = serve(data)
    # Content-Length announces 5000 bytes more than the file, then the connection closes.
    hub.faults[p] = {"cl_extra": 5000, "no_meta": True, "once": True}
    rc, _, err = run(cache, generic())
    check(rc == 1 and "closed early" in err, "short body should fail: " + err)
    path = check_not_complete(cache)
    check(os.path.getsize(path + ".partial") == len(data), "the bytes received should be kept")
    # The next pull asks for the rest, gets 416 (nothing left), verifies the sha256 and marks the file.
    rc, _, err = run(cache, generic())
    check(rc == 0, "retry failed: " + err)
    check(gets(p)[-1]["range"] == "bytes=%d-" % len(data), "the retry should resume at the end")
    check_complete(cache, data)
    # With the hub's X-Linked-Size, a disagreeing Content-Length is caught before the body.
    other = body(90_000, 55)
    p2 = serve(other, file="other.bin")
    hub.faults[p2] = {"cl_extra": 5000, "once": True}
    rc, _, err = run(cache, [REPO, "other.bin", "--revision", REV])
    check(rc == 1 and "inconsistent sizes" in err, "Content-Length vs X-Linked-Size: " + err)
    check_not_complete(cache, file="other.bin")


def test_size_pin_mismatch(cache):
    data = body(10_000, 6)
    p = serve(data)
    rc, _, err = run(cache, generic(["--size", "12345"]))
    check(rc == 1 and "size mismatch" in err and "12345" in err, "size pin mismatch: " + err)
    path = check_not_complete(cache)
    check(not os.path.exists(path + ".partial"), "a size mismatch should stop before the body")


def test_404_and_500(cache):
    rc, _, err = run(cache, [REPO, "missing.bin", "--revision", REV])
    check(rc == 1, "404 should fail")
    check("not found: %s%s" % (hub.url(), hub_path(REPO, REV, "missing.bin")) in err, "404 message: " + err)
    path = check_not_complete(cache, file="missing.bin")
    check(not os.path.exists(path + ".partial"), "a 404 should leave no partial behind")
    data = body(1000, 7)
    p = serve(data)
    hub.faults[p] = {"status": 500}
    rc, _, err = run(cache, generic())
    check(rc == 1 and "server error HTTP 500" in err, "500 message: " + err)
    check_not_complete(cache)
    hub.faults[p] = {"status": 503}
    rc, _, err = run(cache, generic())
    check(rc == 1 and "HTTP 503" in err, "503 message: " + err)


def test_stall_timeout(cache):
    data = body(100_000, 8)
    p = serve(data)
    hub.faults[p] = {"stall_after": 40_000, "once": True}
    t0 = time.time()
    rc, _, err = run(cache, generic(["--timeout", "1.5"]))
    dt = time.time() - t0
    check(rc == 1 and "stalled" in err, "stall should fail clearly: " + err)
    check(dt < 8, "stall detection took %.1f s with --timeout 1.5" % dt)
    path = check_not_complete(cache)
    check(os.path.getsize(path + ".partial") == 40_000, "partial should be kept after a stall")
    rc, _, err = run(cache, generic())
    check(rc == 0, "resume after stall: " + err)
    check(gets(p)[-1]["range"] == "bytes=40000-", "should resume after the stall")
    check_complete(cache, data)


def test_redirect(cache):
    data = body(120_000, 9)
    p = hub_path(REPO, REV, FILE)
    hub.files["/cdn/blob-1"] = data
    hub.faults[p] = {"redirect": "/cdn/blob-1", "meta_of": "/cdn/blob-1"}
    rc, _, err = run(cache, generic())
    check(rc == 0, "redirect pull failed: " + err)
    check(len(gets("/cdn/blob-1")) == 1, "redirect target should be fetched once")
    check_complete(cache, data)


def test_redirect_cross_host_drops_auth(cache):
    data = body(50_000, 10)
    p = hub_path(REPO, REV, FILE)
    hub.files["/cdn/blob-2"] = data
    hub.faults[p] = {"redirect": hub.url("localhost") + "/cdn/blob-2", "meta_of": "/cdn/blob-2"}
    rc, _, err = run(cache, generic(), HF_TOKEN="secret-token")
    check(rc == 0, "cross-host redirect failed: " + err)
    check(gets(p)[-1]["auth"] == "Bearer secret-token", "the hub should get the token")
    cdn = gets("/cdn/blob-2")[-1]
    check(cdn["host"].startswith("localhost"), "the redirect should go to the other host")
    check(cdn["auth"] is None, "the token leaked to another host: %r" % cdn["auth"])
    check_complete(cache, data)


def test_corrupt_body(cache):
    data = body(80_000, 11)
    p = serve(data)
    hub.faults[p] = {"corrupt": True, "once": True}
    rc, _, err = run(cache, generic())
    path = cache_file(cache)
    check(rc == 1 and "sha256 mismatch for %s" % path in err, "corruption should name the file: " + err)
    check_not_complete(cache)
    rc, _, err = run(cache, generic())
    check(rc == 0, "clean retry failed: " + err)
    check_complete(cache, data)


def test_sha_pin_mismatch(cache):
    data = body(80_000, 12)
    p = serve(data)
    rc, _, err = run(cache, generic(["--sha256", "0" * 64]))
    check(rc == 1 and "sha256 mismatch" in err, "wrong sha pin: " + err)
    path = check_not_complete(cache)
    check(not os.path.exists(path + ".partial"), "a wrong sha pin should stop before the body")
    # The right pin without hub metadata: verified by our own hash.
    hub.faults[p] = {"no_meta": True}
    rc, _, err = run(cache, generic(["--sha256", hashlib.sha256(data).hexdigest(), "--size", str(len(data))]))
    check(rc == 0, "right pin without hub metadata: " + err)
    check_complete(cache, data)


def test_concurrent_pulls(cache):
    data = body(300_000, 13)
    p = serve(data)
    hub.faults[p] = {"rate": 600_000}
    a = start(cache, generic())
    time.sleep(0.15)
    b = start(cache, generic())
    oa, ea = a.communicate(timeout=30)
    ob, eb = b.communicate(timeout=30)
    check(a.returncode == 0 and b.returncode == 0, "concurrent pulls failed:\n%s\n%s" % (ea, eb))
    check(oa == ob, "both pulls should print the same path")
    check("waiting" in ea + eb, "one pull should wait for the other: " + ea + eb)
    check(hub.bytes_sent[p] <= 1.5 * len(data), "bytes served doubled: %d" % hub.bytes_sent[p])
    check_complete(cache, data)


def test_sigkill_then_resume(cache):
    data = body(600_000, 14)
    p = serve(data)
    hub.faults[p] = {"rate": 400_000, "once": True}
    proc = start(cache, generic())
    partial = cache_file(cache) + ".partial"
    wait_for_partial(partial, 50_000)
    proc.kill()
    proc.communicate()
    check_not_complete(cache)
    have = os.path.getsize(partial)
    rc, _, err = run(cache, generic())
    check(rc == 0, "resume after SIGKILL: " + err)
    check(gets(p)[-1]["range"] == "bytes=%d-" % have, "should resume at %d" % have)
    check_complete(cache, data)


def test_sigint(cache):
    data = body(600_000, 15)
    p = serve(data)
    hub.faults[p] = {"rate": 400_000, "once": True}
    proc = start(cache, generic())
    partial = cache_file(cache) + ".partial"
    wait_for_partial(partial, 50_000)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=10)
    check(proc.returncode == 130, "SIGINT should exit 130, got %s: %s" % (proc.returncode, err))
    check("resume" in err, "the message should say the next pull resumes: " + err)
    check_not_complete(cache)
    have = os.path.getsize(partial)
    check(0 < have < len(data), "a resumable partial should be kept")
    rc, _, err = run(cache, generic())
    check(rc == 0, "resume after SIGINT: " + err)
    check(gets(p)[-1]["range"] == "bytes=%d-" % have, "should resume at %d" % have)
    check_complete(cache, data)


def test_write_error(cache):
    data = body(200_000, 16)
    serve(data)

    def limit_file_size():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit then fails with EFBIG
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    rc, _, err = run(cache, generic(), preexec=limit_file_size)
    check(rc == 1, "write error should fail")
    lines = [line for line in err.splitlines() if "cannot write" in line]
    check(len(lines) == 1 and "File too large" in lines[0] and "kept" in lines[0],
          "one clear write-error line expected: " + err)
    path = check_not_complete(cache)
    check(0 < os.path.getsize(path + ".partial") <= 60_000, "the partial should be kept")
    rc, _, err = run(cache, generic())
    check(rc == 0, "resume after write error: " + err)
    check_complete(cache, data)


def test_unmarked_final_not_trusted(cache):
    data = body(70_000, 17)
    serve(data)
    rc, _, err = run(cache, generic())
    check(rc == 0, err)
    path = cache_file(cache)
    os.remove(path + ".complete")
    with open(path, "r+b") as f:  # damage the unmarked file
        f.seek(100)
        f.write(b"\x00\x01\x02")
    rc, _, err = run(cache, generic())
    check(rc == 1 and "sha256 mismatch" in err, "an unmarked, damaged file must be re-verified: " + err)
    check_not_complete(cache)
    rc, _, err = run(cache, generic())
    check(rc == 0, err)
    check_complete(cache, data)


def test_unpinned_branch(cache):
    data = body(20_000, 18)
    serve(data, rev="main")
    rc, out, err = run(cache, [REPO, FILE])
    check(rc == 0, err)
    path = check_complete(cache, data, rev="main")
    with open(path + ".complete") as f:
        check("commit %s\n" % hub.commit in f.read(), "the resolved commit should be recorded")
    check("not pinned" in err and hub.commit in err, "the user should be told main is not pinned: " + err)


def test_defaults_are_pinned(cache):
    tp = serve(body(5000, 19), repo="Qwen/Qwen3-4B-GGUF", rev=TARGET_REV, file="Qwen3-4B-Q8_0.gguf")
    rc, out, err = run(cache, ["--target"])
    check(rc == 1 and "size mismatch" in err and "4280404704" in err, "target pin: " + err)
    check(len(gets(tp)) == 1, "the target should be fetched at its pinned revision")
    check_not_complete(cache, repo="Qwen/Qwen3-4B-GGUF", rev=TARGET_REV, file="Qwen3-4B-Q8_0.gguf")
    dp = serve(body(5000, 20), repo="j-shen/FlashMap-Qwen3-4B", rev=DRAFTER_REV, file="model.safetensors")
    rc, out, err = run(cache, ["--drafter"])
    check(rc == 1 and "size mismatch" in err and "949897866" in err, "drafter pin: " + err)
    check(len(gets(dp)) == 1, "the drafter should be fetched at its pinned revision")
    check_not_complete(cache, repo="j-shen/FlashMap-Qwen3-4B", rev=DRAFTER_REV, file="model.safetensors")


TESTS = [v for k, v in sorted(globals().items()) if k.startswith("test_") and callable(v)]


def main():
    global passed, failed
    if not os.path.exists(CLI):
        print("flashmap CLI not found at %s (set FM_CLI)" % CLI)
        print("0 passed, 1 failed")
        return 1
    t_all = time.time()
    for t in TESTS:
        hub.reset()
        with tempfile.TemporaryDirectory(prefix="fm-pull-") as cache:
            t0 = time.time()
            try:
                t(cache)
                passed += 1
                print("ok   %-40s %.2fs" % (t.__name__, time.time() - t0))
            except Exception:
                failed += 1
                print("FAIL %-40s" % t.__name__)
                traceback.print_exc()
    hub.stop()
    print("total %.1fs" % (time.time() - t_all))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
