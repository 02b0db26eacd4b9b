"""test_serve.py: `flashmap serve` over HTTP (python3 stdlib only).

Synthesizes a tiny random-weight target and drafter, starts the server on a free port (--port 0, the port is
read from its "listening on" line) and checks:
- /v1/completions text == `flashmap generate` text for the same prompt and -n (speculative on both sides),
  usage == generate's token counts, finish_reason from generate's stop; /v1/chat/completions == generate
  --chat (with --system, --no-think); a multi-turn chat == /v1/completions on the Qwen3 template written out
  here; streamed chunks concatenate to the same text, with [DONE] last and usage when asked;
- stop strings (earliest wins, held-back partial matches are released, streaming and not);
- sampling: the same seed gives the same text (twice, from `generate`, from a plain-decoding server whose
  command line sets the same settings as defaults, from one that never falls back to plain steps, streamed or
  not); different seeds give different texts; a sampled request without a seed reports the one drawn, which
  gives the same text back; temperature 0 is the greedy text whatever the other settings;
- every refusal: status, OpenAI error object, and a message naming the problem; the server stays up;
- the prompt cache: a prompt that continues the last conversation reports cached tokens and still equals
  generate's reply from scratch;
- requests at once get the same answers as one by one; a client that leaves mid-stream cancels its job;
- a port in use: one line and exit 1; SIGTERM / SIGINT: queued requests get 503, exit 0.

Every server started here is killed at the end, whatever happens. Prints "N passed, M failed".
"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback

CLI = os.environ.get("FM_CLI") or os.path.join(os.environ.get("FM_BINARY_DIR", "build"), "flashmap")
TMP = tempfile.TemporaryDirectory(prefix="fm-serve-")
TARGET = os.path.join(TMP.name, "t.gguf")
# Requests that must still be running when a client leaves or a signal comes: as many new tokens as a server
# with LONG_CTX positions takes, so that no machine finishes them in the second or so the tests wait (the tiny
# model decodes ~2,000-3,500 tokens/s here), past the random model's stop tokens (ignore_eos: one of them came
# after 3,077 tokens, 0.9 s, once the CPU attention's softmax changed).
LONG_CTX = 32768
LONG_TOKENS = LONG_CTX - 100
DRAFTER = os.path.join(TMP.name, "d")
STOP_TEXTS = ("<|im_end|>", "<|endoftext|>")  # the tiny model's stop tokens, as generate prints them
STARTED = []  # every server process, killed at exit
passed = 0
failed = 0


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Server:
    """A `flashmap serve` process; its stderr is collected line by line in self.lines."""

    def __init__(self, extra=(), port=0, wait=True):
        args = [CLI, "serve", "-m", TARGET, "-d", DRAFTER, "--port", str(port), "-t", "2"] + list(extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        STARTED.append(self.proc)
        self.lines = []
        self.listening = threading.Event()
        self.port = None
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if wait:
            t0 = time.time()
            while not self.listening.wait(0.1):
                check(self.proc.poll() is None, "server exited at start: %s" % self.log())
                check(time.time() - t0 < 60, "server did not start in 60 s: %s" % self.log())

    def _read(self):
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self.lines.append(line)
            m = re.search(r"listening on http://[^ ]*:(\d+) ", line)
            if m:
                self.port = int(m.group(1))
                self.listening.set()

    def log(self):
        return "\n".join(self.lines[-20:])

    def conn(self, timeout=60):
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(self, method, path, body=None, headers=None, timeout=60):
        """(status, headers dict, body bytes)."""
        c = self.conn(timeout)
        try:
            if isinstance(body, (dict, list)):
                body = json.dumps(body)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, dict(r.getheaders()), r.read()
        finally:
            c.close()

    def post(self, path, obj):
        status, headers, body = self.request("POST", path, obj)
        check(headers.get("Content-Type") == "application/json", "%s: content type %s" % (path, headers))
        return status, json.loads(body)

    def stream(self, path, obj):
        """The SSE events' data fields, in order (comments dropped)."""
        status, headers, body = self.request("POST", path, obj)
        check(status == 200, "stream: status %d: %r" % (status, body[:300]))
        check(headers.get("Content-Type") == "text/event-stream", "stream: content type %s" % headers)
        events = []
        for block in body.decode("utf-8").split("\n\n"):
            if not block:
                continue
            check(block.startswith("data: ") or block.startswith(":"), "not an SSE event: %r" % block[:200])
            if block.startswith("data: "):
                events.append(block[len("data: "):])
        return events

    def stop(self, sig=signal.SIGTERM, timeout=20):
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError("server did not stop within %d s after signal %d: %s" % (timeout, sig, self.log()))
        self.reader.join(10)  # the rest of its log
        return rc


def generate(prompt, n, chat=False, system=None, think=True, extra=()):
    """generate's text (its streamed stdout, which keeps every byte), prompt and new token counts, stop."""
    args = [CLI, "generate", "-m", TARGET, "-d", DRAFTER, "-p", prompt, "-n", str(n), "-t", "2"] + list(extra)
    if chat:
        args.append("--chat")
    if system is not None:
        args += ["--system", system]
    if not think:
        args.append("--no-think")
    p = subprocess.run(args, capture_output=True, timeout=120)
    err = p.stderr.decode()
    check(p.returncode == 0, "generate failed: %s" % err)
    m = re.search(r"prompt (\d+) tok \|.*\| (\d+) new tok \| rounds (\d+).*\| stop: (.*)$", err.strip())
    check(m, "generate's stats line: %s" % err)
    check(int(m.group(3)) > 0, "generate made no speculative round: %s" % err)
    check(p.stdout.endswith(b"\n"), "generate's output ends with a newline")
    text = p.stdout[:-1].decode("utf-8")
    stop = m.group(4)
    if stop == "stop token":  # generate prints the stop token; an OpenAI reply does not hold it
        ends = [s for s in STOP_TEXTS if text.endswith(s)]
        check(ends, "generate stopped at a stop token but its text ends %r" % text[-20:])
        text = text[: -len(ends[0])]
    return {"text": text, "prompt_tokens": int(m.group(1)), "completion_tokens": int(m.group(2)), "stop": stop}


def counts(r):
    """The token counts of a reply's usage (what the prompt cache held may differ between requests)."""
    u = r["usage"]
    return u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]


def reply_text(kind, r):
    choice = r["choices"][0]
    return choice["text"] if kind == "completions" else choice["message"]["content"]


def check_reply(kind, r, ref, what):
    check(r["object"] == ("text_completion" if kind == "completions" else "chat.completion"), what + ": object")
    check(r["model"] == "t.gguf", what + ": model %r" % r["model"])
    check(len(r["choices"]) == 1 and r["choices"][0]["index"] == 0, what + ": one choice")
    got = reply_text(kind, r)
    check(got == ref["text"], "%s: text differs from generate's\n server:   %r\n generate: %r" % (what, got, ref["text"]))
    u = r["usage"]
    check(u["prompt_tokens"] == ref["prompt_tokens"], what + ": prompt_tokens %s vs %s" % (u, ref))
    check(u["completion_tokens"] == ref["completion_tokens"], what + ": completion_tokens %s vs %s" % (u, ref))
    check(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"], what + ": total_tokens")
    want = "stop" if ref["stop"] == "stop token" else "length"
    check(r["choices"][0]["finish_reason"] == want, what + ": finish_reason %r, generate stopped at %s"
          % (r["choices"][0]["finish_reason"], ref["stop"]))
    f = r["flashmap"]
    check(f["speculative"] is True and f["rounds"] > 0, what + ": speculative stats %s" % f)
    check(f["stop"] == ref["stop"], what + ": flashmap.stop %r vs %r" % (f["stop"], ref["stop"]))
    for k in ("accepted", "plain_steps", "decode_tok_s", "prefill_s", "decode_s", "queue_s"):
        check(isinstance(f[k], (int, float)) and f[k] >= 0, what + ": flashmap.%s = %r" % (k, f.get(k)))


def stream_text(kind, events, include_usage=False):
    """Concatenated text of a stream, its finish_reason and last chunks, checking the chunk shapes."""
    check(events and events[-1] == "[DONE]", "stream ends with [DONE]: %r" % events[-2:])
    chunks = [json.loads(e) for e in events[:-1]]
    usage = None
    if include_usage:
        usage = chunks.pop()
        check(usage["choices"] == [] and "usage" in usage, "usage chunk: %r" % usage)
    text, finish = "", None
    for i, c in enumerate(chunks):
        check(c["object"] == ("text_completion" if kind == "completions" else "chat.completion.chunk"),
              "chunk object %r" % c["object"])
        check(finish is None, "a chunk after finish_reason: %r" % c)
        ch = c["choices"][0]
        if kind == "completions":
            text += ch["text"]
        else:
            if i == 0:
                check(ch["delta"].get("role") == "assistant", "first chat chunk has the role: %r" % ch)
            text += ch["delta"].get("content", "")
        finish = ch["finish_reason"]
    check(finish in ("stop", "length"), "last chunk's finish_reason: %r" % chunks[-1])
    check("flashmap" in chunks[-1], "last chunk has the flashmap object")
    check(len({c["id"] for c in chunks}) == 1, "one id per stream")
    return text, finish, chunks[-1], usage


def render_qwen3(messages, think=True):
    """The Qwen3 chat template for plain system/user/assistant turns (no thinking in history)."""
    out = ""
    for m in messages:
        out += "<|im_start|>%s\n%s<|im_end|>\n" % (m["role"], m["content"])
    out += "<|im_start|>assistant\n"
    if not think:
        out += "<think>\n\n</think>\n\n"
    return out


# ---- tests ----


def test_health_and_models(s):
    status, h, body = s.request("GET", "/health")
    check(status == 200 and json.loads(body) == {"status": "ok"}, "health: %d %r" % (status, body))
    status, h, body = s.request("GET", "/v1/models")
    m = json.loads(body)
    check(status == 200 and m["object"] == "list" and [d["id"] for d in m["data"]] == ["t.gguf"], "models: %r" % m)
    check(m["data"][0]["max_model_len"] > 0, "models: max_model_len")


CASES = [("Hello world", 40), ("1 2 3", 150), ("def f(x):", 24)]
WHOLE = {}  # (prompt, n) -> the non-streaming reply, reused by later tests


def whole(s, prompt, n):
    if (prompt, n) not in WHOLE:
        status, WHOLE[prompt, n] = s.post("/v1/completions", {"prompt": prompt, "max_tokens": n})
        check(status == 200, "completions %r: %d" % (prompt, status))
    return WHOLE[prompt, n]


def test_completions_equal_generate(s):
    hit_stop = False
    for prompt, n in CASES:
        ref = generate(prompt, n)
        hit_stop |= ref["stop"] == "stop token"
        status, r = s.post("/v1/completions", {"model": "anything", "prompt": prompt, "max_tokens": n})
        check(status == 200, "completions %r: %d %r" % (prompt, status, r))
        check_reply("completions", r, ref, "completions %r -n %d" % (prompt, n))
        check(r["id"].startswith("cmpl-"), "completion id %r" % r["id"])
        WHOLE[prompt, n] = r
    check(hit_stop, "no case ended at a stop token: pick prompts in CASES that do (the synth model changed?)")


def test_chat_equal_generate(s):
    nul = False
    for sys_msg, think, n in ((None, True, 120), ("You are terse.", False, 40)):
        msgs = ([{"role": "system", "content": sys_msg}] if sys_msg else []) + [{"role": "user", "content": "Hi"}]
        ref = generate("Hi", n, chat=True, system=sys_msg, think=think)
        body = {"messages": msgs, "max_tokens": n}
        if not think:
            body["chat_template_kwargs"] = {"enable_thinking": False}
        status, r = s.post("/v1/chat/completions", body)
        check(status == 200, "chat: %d %r" % (status, r))
        check_reply("chat", r, ref, "chat system=%r think=%r" % (sys_msg, think))
        check(r["choices"][0]["message"]["role"] == "assistant", "chat: role")
        check(r["id"].startswith("chatcmpl-"), "chat id %r" % r["id"])
        nul |= "\x00" in r["choices"][0]["message"]["content"]
    check(nul, "no reply held a NUL byte (token 0), so JSON escaping of any byte went untested")
    # max_completion_tokens is the newer name of max_tokens
    status, r = s.post("/v1/chat/completions", {"messages": msgs, "max_completion_tokens": 7})
    check(status == 200 and r["usage"]["completion_tokens"] == 7, "max_completion_tokens: %r" % r)


def test_chat_template_multi_turn(s):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]
    for think in (True, False):
        body = {"messages": msgs, "max_tokens": 20, "chat_template_kwargs": {"enable_thinking": think}}
        status, chat = s.post("/v1/chat/completions", body)
        status2, comp = s.post("/v1/completions", {"prompt": render_qwen3(msgs, think), "max_tokens": 20})
        check(status == 200 and status2 == 200, "multi-turn: %r %r" % (chat, comp))
        check(chat["choices"][0]["message"]["content"] == comp["choices"][0]["text"],
              "multi-turn chat != completions on the rendered template (think=%r)" % think)
        check(counts(chat) == counts(comp), "multi-turn usage %r vs %r" % (chat["usage"], comp["usage"]))
    # content as text parts
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    _, a = s.post("/v1/chat/completions", {"messages": parts, "max_tokens": 10})
    _, b = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 10})
    check(a["choices"][0]["message"] == b["choices"][0]["message"], "text parts == plain content")


def test_streaming(s):
    for prompt, n in CASES:
        w = whole(s, prompt, n)["choices"][0]
        events = s.stream("/v1/completions", {"prompt": prompt, "max_tokens": n, "stream": True})
        text, finish, last, _ = stream_text("completions", events)
        check(text == w["text"], "stream %r: %r vs %r" % (prompt, text, w["text"]))
        check(finish == w["finish_reason"], "stream finish_reason")
        check(len(events) > 3, "the stream came in several chunks (%d)" % len(events))
    msgs = [{"role": "user", "content": "Hi"}]
    _, w = s.post("/v1/chat/completions", {"messages": msgs, "max_tokens": 90})
    events = s.stream("/v1/chat/completions", {"messages": msgs, "max_tokens": 90, "stream": True,
                                               "stream_options": {"include_usage": True}})
    text, finish, last, usage = stream_text("chat", events, include_usage=True)
    check(text == w["choices"][0]["message"]["content"], "chat stream text")
    check(counts(usage) == counts(w), "stream usage %r vs %r" % (usage["usage"], w["usage"]))
    check(last["flashmap"]["rounds"] > 0, "stream flashmap stats")


def test_prompt_cache(s):
    first = "The prompt cache keeps"
    _, a = s.post("/v1/completions", {"prompt": first, "max_tokens": 30})
    follow = first + a["choices"][0]["text"] + " and then"
    ref = generate(follow, 25)
    status, b = s.post("/v1/completions", {"prompt": follow, "max_tokens": 25})
    check(status == 200, "prompt cache follow-up: %d %r" % (status, b))
    check_reply("completions", b, ref, "prompt cache follow-up")
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Re-tokenising the reply may merge across its first token; everything before is the same tokens.
    check(a["usage"]["prompt_tokens"] - 1 <= cached < b["usage"]["prompt_tokens"],
          "cached %d of %d (first prompt %d tokens)" % (cached, b["usage"]["prompt_tokens"], a["usage"]["prompt_tokens"]))
    check(b["flashmap"]["prefill_s"] >= 0, "prefill time")
    # The same prompt again: all but its last token come from the cache; the reply is the same.
    _, c = s.post("/v1/completions", {"prompt": follow, "max_tokens": 25})
    check(c["usage"]["prompt_tokens_details"]["cached_tokens"] == c["usage"]["prompt_tokens"] - 1,
          "repeat: %r" % c["usage"])
    check(c["choices"][0]["text"] == b["choices"][0]["text"], "repeat: same text")
    # An unrelated prompt shares (almost) nothing and is still right.
    ref = generate("zebra", 12)
    _, d = s.post("/v1/completions", {"prompt": "zebra", "max_tokens": 12})
    check_reply("completions", d, ref, "after the cache")
    check(d["usage"]["prompt_tokens_details"]["cached_tokens"] <= 1, "unrelated prompt: %r" % d["usage"])


def test_stop_strings(s):
    full = whole(s, "Hello world", 40)["choices"][0]["text"]
    check(len(full) > 30, "long enough text to cut: %r" % full)
    a, b = full[12:17], full[22:26]
    first = min(full.index(a), full.index(b))
    cases = [
        (a, full[: full.index(a)], "stop"),
        ([b, "never there \u2603", a], full[:first], "stop"),  # the earliest match wins
        (["never there"], full, "length"),
        ([full[5:9] + "\u2603 not next"], full, "length"),  # a partial match is held back, then released
    ]
    for stop, want, finish in cases:
        _, r = s.post("/v1/completions", {"prompt": "Hello world", "max_tokens": 40, "stop": stop})
        got = r["choices"][0]
        check(got["text"] == want and got["finish_reason"] == finish,
              "stop %r: got %r (%s), want %r (%s)" % (stop, got["text"], got["finish_reason"], want, finish))
        if finish == "stop":
            check(r["flashmap"]["stop"] == "stop string", "flashmap.stop for a stop string")
            check(0 < r["usage"]["completion_tokens"] <= 40, "usage after a stop string")
        events = s.stream("/v1/completions", {"prompt": "Hello world", "max_tokens": 40, "stop": stop, "stream": True})
        text, sfinish, _, _ = stream_text("completions", events)
        check(text == want and sfinish == finish, "streamed stop %r: got %r, want %r" % (stop, text, want))
    # chat honours stop too
    _, c = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30})
    ct = c["choices"][0]["message"]["content"]
    stop = ct[8:12]
    _, r = s.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 30,
                                           "stop": stop})
    check(r["choices"][0]["message"]["content"] == ct[: ct.index(stop)], "chat stop string")


# ---- sampling ----

SAMPLED = {"temperature": 0.9, "top_p": 0.95, "seed": 5}
SAMPLED_ARGS = ["--temp", "0.9", "--top-p", "0.95", "--seed", "5"]  # the same, on a command line
SAMPLED_STATS = {"temperature": 0.9, "top_k": 0, "top_p": 0.95, "min_p": 0, "seed": 5}


def completion(s, body, what):
    status, r = s.post("/v1/completions", body)
    check(status == 200, "%s: %d %r" % (what, status, r))
    return r


def test_sampling_reproducible(s):
    """A draw depends on (seed, position) alone: the same seed gives the same text, again (from the prompt
    cache), from `generate`, plain or speculative, from a server's command-line defaults."""
    greedy = whole(s, "Hello world", 40)["choices"][0]["text"]
    body = dict({"prompt": "Hello world", "max_tokens": 40}, **SAMPLED)
    a = completion(s, body, "sampled")
    text = a["choices"][0]["text"]
    check(text != greedy, "temperature 0.9 gave the greedy text %r: was it sampled?" % text)
    check(a["flashmap"]["seed"] == 5 and a["flashmap"]["sampling"] == SAMPLED_STATS,
          "sampled: flashmap reports %r" % a["flashmap"])
    b = completion(s, dict(body, top_k=-1), "sampled again, top_k -1")  # -1: no limit, as 0 (vLLM's way)
    check(b["choices"][0]["text"] == text, "the same seed twice: %r vs %r" % (b["choices"][0]["text"], text))
    check(b["flashmap"]["sampling"] == SAMPLED_STATS, "top_k -1: flashmap %r" % b["flashmap"])
    check(b["usage"]["prompt_tokens_details"]["cached_tokens"] == b["usage"]["prompt_tokens"] - 1,
          "the second request came from the prompt cache: %r" % b["usage"])
    check_reply("completions", a, generate("Hello world", 40, extra=SAMPLED_ARGS), "sampled vs generate --temp")
    # A server that never falls back to plain steps: every token comes out of a verify block.
    spec = Server(["--no-fallback"])
    r = completion(spec, body, "--no-fallback server")
    f = r["flashmap"]
    check(f["speculative"] and f["rounds"] > 0 and f["plain_steps"] <= 1, "--no-fallback stats: %r" % f)
    check(r["choices"][0]["text"] == text, "speculative (no fallback) vs fallback server: %r vs %r"
          % (r["choices"][0]["text"], text))
    check(spec.stop() == 0, "the --no-fallback server's exit: %s" % spec.log())
    # Plain decoding, the sampling settings given on the command line: a request without them takes them.
    plain = Server(["--no-spec"] + SAMPLED_ARGS)
    check(any("plain decoding, temperature 0.9 by default" in l for l in plain.lines), "start line: %s" % plain.log())
    for what, req in (("defaults", {"prompt": "Hello world", "max_tokens": 40}), ("explicit", body)):
        r = completion(plain, req, "plain server, " + what)
        f = r["flashmap"]
        check(f["speculative"] is False and f["rounds"] == 0, "plain server: %r" % f)
        check(f["seed"] == 5 and f["sampling"] == SAMPLED_STATS, "plain server, %s: flashmap %r" % (what, f))
        check(r["choices"][0]["text"] == text, "plain server, %s: %r vs speculative %r"
              % (what, r["choices"][0]["text"], text))
    # the request's own settings win over the command line's: temperature 0 is greedy, another seed differs
    r = completion(plain, {"prompt": "Hello world", "max_tokens": 40, "temperature": 0}, "plain server, greedy")
    check(r["choices"][0]["text"] == greedy and r["flashmap"]["seed"] is None, "plain server, temperature 0: %r" % r)
    r = completion(plain, {"prompt": "Hello world", "max_tokens": 40, "seed": 6}, "plain server, seed 6")
    check(r["flashmap"]["seed"] == 6 and r["choices"][0]["text"] != text, "plain server, seed 6: %r" % r)
    check(plain.stop() == 0, "the plain server's exit: %s" % plain.log())


def test_penalties(s):
    """presence_penalty / frequency_penalty: they change the reply (a repetitive greedy reply of the tiny model
    repeats less), greedy or sampled; speculative == plain decoding with them; flashmap reports them."""
    base = {"prompt": "Hello world", "max_tokens": 40, "ignore_eos": True}
    greedy = completion(s, base, "greedy")["choices"][0]["text"]
    pen = dict(base, presence_penalty=1.5, frequency_penalty=0.5)
    r = completion(s, pen, "greedy with penalties")
    check(r["choices"][0]["text"] != greedy, "penalties left the greedy reply as it was: %r" % greedy)
    g = r["flashmap"]
    check(g["seed"] is None and g.get("sampling", {}).get("presence_penalty") == 1.5
          and g["sampling"].get("temperature") == 0, "greedy with penalties, flashmap: %r" % g)
    sampled = dict(pen, temperature=0.8, seed=3)
    a = completion(s, sampled, "sampled with penalties")
    sp = a["flashmap"]["sampling"]
    check(sp.get("presence_penalty") == 1.5 and sp.get("frequency_penalty") == 0.5, "flashmap sampling: %r" % sp)
    plain = Server(["--no-spec"])
    for what, body, ref in (("greedy", pen, r), ("sampled", sampled, a)):
        p = completion(plain, body, "plain server, " + what + " with penalties")
        check(p["flashmap"]["speculative"] is False, "plain server: %r" % p["flashmap"])
        check(p["choices"][0]["text"] == ref["choices"][0]["text"], "%s with penalties: plain %r vs speculative %r"
              % (what, p["choices"][0]["text"], ref["choices"][0]["text"]))
    check(plain.stop() == 0, "the plain server's exit: %s" % plain.log())


def test_repetition_penalty(s):
    """repetition_penalty (vLLM's name; repeat_penalty, llama.cpp's, is the same) with llama.cpp's repeat_last_n:
    it changes the greedy reply, repeat_last_n 0 turns it off, speculative == plain decoding with it, flashmap
    reports it."""
    base = {"prompt": "Hello world", "max_tokens": 40, "ignore_eos": True}
    greedy = completion(s, base, "greedy")["choices"][0]["text"]
    rep = dict(base, repetition_penalty=1.5)
    r = completion(s, rep, "greedy with a repetition penalty")
    check(r["choices"][0]["text"] != greedy, "the repetition penalty left the greedy reply as it was: %r" % greedy)
    off = completion(s, dict(rep, repeat_last_n=0), "repeat_last_n 0")
    check(off["choices"][0]["text"] == greedy, "repeat_last_n 0 should turn the penalty off: %r" % off)
    alias = completion(s, dict(base, repeat_penalty=1.5), "repeat_penalty")
    check(alias["choices"][0]["text"] == r["choices"][0]["text"], "repeat_penalty differs from repetition_penalty")
    window = dict(base, repetition_penalty=1.3, repeat_last_n=6, temperature=0.8, seed=5)
    w = completion(s, window, "sampled with a window")
    sp = w["flashmap"]["sampling"]
    check(sp.get("repetition_penalty") == 1.3 and sp.get("repeat_last_n") == 6, "flashmap sampling: %r" % sp)
    plain = Server(["--no-spec"])
    for what, body, ref in (("greedy", rep, r), ("sampled, a window", window, w)):
        p = completion(plain, body, "plain server, " + what)
        check(p["choices"][0]["text"] == ref["choices"][0]["text"], "%s: plain %r vs speculative %r"
              % (what, p["choices"][0]["text"], ref["choices"][0]["text"]))
    check(plain.stop() == 0, "the plain server's exit: %s" % plain.log())


def test_sampling_seeds(s):
    """Different seeds, different texts; without a seed, a fresh one per request, reported and reusable."""
    base = {"prompt": "Once upon a time", "max_tokens": 40, "ignore_eos": True, "temperature": 1.5}
    texts = {}
    for seed in (1, 2, 3):
        r = completion(s, dict(base, seed=seed), "seed %d" % seed)
        check(r["usage"]["completion_tokens"] == 40 and r["flashmap"]["seed"] == seed, "seed %d: %r" % (seed, r))
        texts[seed] = r["choices"][0]["text"]
    check(len(set(texts.values())) == 3, "three seeds, three texts: %r" % texts)
    seeds = []
    for i in range(2):
        r = completion(s, base, "no seed %d" % i)
        seed = r["flashmap"]["seed"]
        check(isinstance(seed, int) and 0 <= seed < 2 ** 53, "a drawn seed: %r" % r["flashmap"])
        check(r["flashmap"]["sampling"]["seed"] == seed, "sampling.seed: %r" % r["flashmap"])
        again = completion(s, dict(base, seed=seed), "the drawn seed given back")
        check(again["choices"][0]["text"] == r["choices"][0]["text"], "seed %d given back: another text" % seed)
        seeds.append(seed)
    check(seeds[0] != seeds[1], "two requests without a seed drew the same one: %r" % seeds)


def test_sampling_greedy(s):
    """Temperature 0 is greedy (generate's text) whatever the other settings, and reports no seed; top_k 1 or
    a tiny top_p (the most likely token alone: the tiny model's vocabulary is under 1000) sample the greedy
    text, so the filters do reach the engine."""
    greedy = whole(s, "Hello world", 40)["choices"][0]["text"]
    for extra in ({"temperature": 0}, {"temperature": 0, "seed": 5, "top_p": 0.5, "top_k": 3, "min_p": 0.2},
                  {"temperature": None, "seed": 9}):
        r = completion(s, dict(extra, prompt="Hello world", max_tokens=40), "greedy %r" % extra)
        check(r["choices"][0]["text"] == greedy, "%r: not the greedy text" % extra)
        check(r["flashmap"]["seed"] is None and "sampling" not in r["flashmap"], "%r: flashmap %r" % (extra, r["flashmap"]))
    for extra in ({"top_k": 1}, {"top_p": 0.001}):
        body = dict(extra, prompt="Hello world", max_tokens=40, temperature=1.5, seed=3)
        r = completion(s, body, "sampled %r" % extra)
        check(r["choices"][0]["text"] == greedy, "temperature 1.5 with %r: not the greedy text" % extra)
        check(r["flashmap"]["sampling"] == dict({"temperature": 1.5, "top_k": 0, "top_p": 1, "min_p": 0, "seed": 3},
                                                **extra), "%r: flashmap %r" % (extra, r["flashmap"]))
        del body[list(extra)[0]]
        r = completion(s, body, "sampled without %r" % extra)
        check(r["choices"][0]["text"] != greedy, "temperature 1.5 without %r: the greedy text" % extra)


def test_sampling_stream(s):
    """A sampled stream concatenates to the sampled text of the same seed, chat and completions."""
    body = dict({"prompt": "1 2 3", "max_tokens": 60}, **SAMPLED)
    w = completion(s, body, "sampled")
    text, finish, last, _ = stream_text("completions", s.stream("/v1/completions", dict(body, stream=True)))
    check(text == w["choices"][0]["text"] and finish == w["choices"][0]["finish_reason"],
          "sampled stream %r vs %r" % (text, w["choices"][0]["text"]))
    check(last["flashmap"]["seed"] == 5 and last["flashmap"]["sampling"] == SAMPLED_STATS, "stream flashmap %r" % last)
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 50, "temperature": 1.2, "top_k": 50,
            "min_p": 0.01}
    text, _, last, _ = stream_text("chat", s.stream("/v1/chat/completions", dict(chat, stream=True)))
    seed = last["flashmap"]["seed"]
    check(isinstance(seed, int), "chat stream: its seed %r" % last["flashmap"])
    check(last["flashmap"]["sampling"] == {"temperature": 1.2, "top_k": 50, "top_p": 1, "min_p": 0.01, "seed": seed},
          "chat stream: flashmap %r" % last["flashmap"])
    status, c = s.post("/v1/chat/completions", dict(chat, seed=seed))
    check(status == 200 and c["choices"][0]["message"]["content"] == text,
          "chat: the stream's seed given back, not streamed: %r vs %r" % (c["choices"][0]["message"]["content"], text))


COMPLETION_ERRORS = [
    # (body, status, words the message must hold, param)
    (b"", 400, ["empty"], None),
    (b"{", 400, ["not valid JSON"], None),
    (b'{"prompt": "x"} trailing', 400, ["after its JSON"], None),
    (b"[1, 2]", 400, ["JSON object", "array"], None),
    ({}, 400, ["'prompt' is required"], "prompt"),
    ({"prompt": 5}, 400, ["'prompt' must be a string", "number"], "prompt"),
    ({"prompt": ["a", "b"]}, 400, ["'prompt' must be a string", "array"], "prompt"),
    ({"prompt": ""}, 400, ["'prompt' is empty"], "prompt"),
    ({"prompt": "x", "max_tokens": "10"}, 400, ["'max_tokens' must be a whole number", "string"], "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, 400, ["'max_tokens' must be from 1"], "max_tokens"),
    ({"prompt": "x", "max_tokens": 1.5}, 400, ["'max_tokens' must be a whole number"], "max_tokens"),
    ({"prompt": "x", "stream": "yes"}, 400, ["'stream' must be true or false"], "stream"),
    ({"prompt": "x", "ignore_eos": 1}, 400, ["'ignore_eos' must be true or false"], "ignore_eos"),
    ({"prompt": "x", "stop": 5}, 400, ["'stop' must be a string or an array"], "stop"),
    ({"prompt": "x", "stop": [""]}, 400, ["stop[0]"], "stop"),
    ({"prompt": "x", "stop": ["a"] * 17}, 400, ["at most 16"], "stop"),
    ({"prompt": "x", "temperature": -1}, 400, ["'temperature' must be from 0 (greedy) to 2", "got -1"], "temperature"),
    ({"prompt": "x", "temperature": 2.5}, 400, ["'temperature' must be from 0 (greedy) to 2", "got 2.5"], "temperature"),
    ({"prompt": "x", "temperature": "hot"}, 400, ["'temperature' must be a number", "string"], "temperature"),
    ({"prompt": "x", "top_p": 0}, 400, ["'top_p' must be more than 0 and at most 1", "got 0"], "top_p"),
    ({"prompt": "x", "top_p": 1.5}, 400, ["'top_p' must be more than 0 and at most 1", "got 1.5"], "top_p"),
    ({"prompt": "x", "top_p": 1e-60}, 400, ["'top_p' must be more than 0"], "top_p"),  # 0 as the engine's float
    ({"prompt": "x", "top_k": -5}, 400, ["'top_k' must be a whole number from 0", "-1: no limit", "got -5"], "top_k"),
    ({"prompt": "x", "top_k": 2.5}, 400, ["'top_k' must be a whole number"], "top_k"),
    ({"prompt": "x", "min_p": 1}, 400, ["'min_p' must be at least 0 and less than 1", "got 1"], "min_p"),
    ({"prompt": "x", "min_p": 0.9999999999}, 400, ["'min_p'", "less than 1"], "min_p"),  # 1 as a float
    ({"prompt": "x", "min_p": -0.1}, 400, ["'min_p' must be at least 0"], "min_p"),
    ({"prompt": "x", "seed": -3}, 400, ["'seed' must not be negative", "got -3"], "seed"),
    ({"prompt": "x", "seed": 1.5}, 400, ["'seed' must be a whole number"], "seed"),
    ({"prompt": "x", "seed": 2 ** 53}, 400, ["'seed' must be from 0 to 9007199254740991"], "seed"),
    ({"prompt": "x", "seed": "5"}, 400, ["'seed' must be a whole number", "string"], "seed"),
    ({"prompt": "x", "n": 2}, 400, ["'n' must be 1", "one choice"], "n"),
    ({"prompt": "x", "best_of": 3}, 400, ["'best_of' must be 1"], "best_of"),
    ({"prompt": "x", "presence_penalty": 2.5}, 400, ["'presence_penalty' must be from -2 to 2", "got 2.5"],
     "presence_penalty"),
    ({"prompt": "x", "frequency_penalty": "high"}, 400, ["'frequency_penalty' must be a number"], "frequency_penalty"),
    ({"prompt": "x", "repetition_penalty": 0}, 400, ["'repetition_penalty' must be more than 0 and at most 10",
                                                      "got 0"], "repetition_penalty"),
    ({"prompt": "x", "repeat_penalty": 12}, 400, ["'repeat_penalty' must be more than 0"], "repeat_penalty"),
    ({"prompt": "x", "repeat_last_n": -2}, 400, ["'repeat_last_n' must be from -1"], "repeat_last_n"),
    ({"prompt": "x", "logprobs": 5}, 400, ["'logprobs' is not supported"], "logprobs"),
    ({"prompt": "x", "echo": True}, 400, ["'echo' is not supported"], "echo"),
    ({"prompt": "x", "model": 7}, 400, ["'model' must be a string"], "model"),
    ({"prompt": "x", "stream_options": 1}, 400, ["'stream_options' must be an object"], "stream_options"),
]

CHAT_ERRORS = [
    ({}, 400, ["'messages' is required"], "messages"),
    ({"messages": "hi"}, 400, ["'messages' must be an array", "string"], "messages"),
    ({"messages": []}, 400, ["'messages' is empty"], "messages"),
    ({"messages": [1]}, 400, ["messages[0]", "object"], "messages[0]"),
    ({"messages": [{"content": "x"}]}, 400, ["'messages[0].role' is required"], "messages[0].role"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400, ["messages[0].role", "wizard"], "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, 400, ["messages[0].content"], "messages[0].content"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, 400,
     ["only text"], "messages[0].content"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": "x"}, 400,
     ["'chat_template_kwargs' must be an object"], "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"enable_thinking": "no"}}, 400,
     ["'enable_thinking' must be true or false"], "chat_template_kwargs.enable_thinking"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 3}, 400, ["'temperature' must be from 0"],
     "temperature"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 1, "top_p": 0}, 400, ["'top_p'"], "top_p"),
    ({"messages": [{"role": "user", "content": "x"}], "logprobs": True}, 400, ["'logprobs' is not supported"],
     "logprobs"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, 400,
     ["'tools' is not supported"], "tools"),
]


def check_error(status, body, want_status, words, param, what):
    check(status == want_status, "%s: status %d, want %d: %r" % (what, status, want_status, body[:300]))
    e = json.loads(body)["error"]
    for w in words:
        check(w in e["message"], "%s: message %r lacks %r" % (what, e["message"], w))
    check(isinstance(e["type"], str) and e["type"], "%s: error type" % what)
    check(e["param"] == param, "%s: param %r, want %r" % (what, e["param"], param))


def test_request_errors(s):
    for path, table in (("/v1/completions", COMPLETION_ERRORS), ("/v1/chat/completions", CHAT_ERRORS)):
        for body, want, words, param in table:
            status, h, raw = s.request("POST", path, body)
            check(h.get("Content-Type") == "application/json", "error content type")
            check_error(status, raw, want, words, param, "%s %r" % (path, body))
            if isinstance(body, dict) and "stream" not in body:  # the same refusal before a stream starts
                status, h, raw = s.request("POST", path, dict(body, stream=True))
                check_error(status, raw, want, words, param, "%s stream %r" % (path, body))
    # greedy settings are accepted, as are unknown fields and nulls
    ok = {"prompt": "Hi", "max_tokens": 3, "temperature": 0, "top_p": 1, "n": 1, "seed": 7, "logprobs": None,
          "top_k": -1, "stop": None, "user": "u", "some_extension": {"x": 1}, "ignore_eos": False}
    status, r = s.post("/v1/completions", ok)
    check(status == 200 and r["usage"]["completion_tokens"] == 3, "greedy settings accepted: %r" % r)
    # the edges of the sampling ranges are accepted
    for edge in ({"temperature": 2, "top_p": 1, "top_k": 0, "min_p": 0, "seed": 2 ** 53 - 1},
                 {"temperature": 1e-3, "top_p": 1e-3, "top_k": 1 << 30, "min_p": 0.999, "seed": 0},
                 {"temperature": None, "top_p": None, "top_k": None, "min_p": None, "seed": None}):
        status, r = s.post("/v1/completions", dict(edge, prompt="Hi", max_tokens=3))
        check(status == 200 and r["usage"]["completion_tokens"] == 3, "sampling edges %r: %r" % (edge, r))


def test_http_errors(s):
    for method, path, want, words in (("GET", "/", 404, ["no endpoint GET /"]),
                                      ("POST", "/v1/embeddings", 404, ["no endpoint POST /v1/embeddings"]),
                                      ("GET", "/v1/completions", 405, ["takes POST"]),
                                      ("GET", "/v1/chat/completions", 405, ["takes POST"]),
                                      ("POST", "/health", 405, ["takes GET"])):
        status, h, raw = s.request(method, path, b"{}" if method == "POST" else None)
        check_error(status, raw, want, words, None, "%s %s" % (method, path))
    # a body over the limit (2 MiB): declared by Content-Length (refused before it is sent), or sent in chunks
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=10)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n{" % (3 << 20))
    r = http.client.HTTPResponse(sock)
    r.begin()
    check_error(r.status, r.read(), 413, ["larger than 2097152 bytes"], None, "large body")
    sock.close()
    big = b'{"prompt": "' + b"a" * (3 << 20) + b'"}'
    c = s.conn()
    try:
        c.request("POST", "/v1/completions", body=iter([big[i:i + 65536] for i in range(0, len(big), 65536)]),
                  encode_chunked=True)
        r = c.getresponse()
        check_error(r.status, r.read(), 413, ["larger than"], None, "large chunked body")
    finally:
        c.close()
    # a prompt longer than the context: refused with 400 before anything is generated (and before a stream)
    m = json.loads(s.request("GET", "/v1/models")[2])
    n_ctx = m["data"][0]["max_model_len"]
    long_prompt = " ".join(["a"] * (n_ctx + 10))
    for stream in (False, True):
        status, h, raw = s.request("POST", "/v1/completions", {"prompt": long_prompt, "stream": stream})
        check_error(status, raw, 400, ["tokens", "context holds %d" % n_ctx], "prompt", "long prompt")
        check(json.loads(raw)["error"]["code"] == "context_length_exceeded", "long prompt: code")
    # raw garbage on the socket does not take the server down
    sock = socket.create_connection(("127.0.0.1", s.port), timeout=5)
    sock.sendall(b"\x00\xffNOT HTTP\r\n\r\n")
    sock.shutdown(socket.SHUT_WR)
    try:
        sock.recv(4096)
    except OSError:
        pass
    sock.close()
    status, _, _ = s.request("GET", "/health")
    check(status == 200 and s.proc.poll() is None, "server alive after the errors")


def test_concurrent_requests(s):
    bodies = [{"prompt": p, "max_tokens": n} for p, n in CASES]
    alone = [whole(s, p, n)["choices"][0]["text"] for p, n in CASES]
    results = [None] * len(bodies)

    def run(i):
        results[i] = s.post("/v1/completions", bodies[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for i, r in enumerate(results):
        check(r is not None and r[0] == 200, "concurrent request %d: %r" % (i, r))
        check(r[1]["choices"][0]["text"] == alone[i], "concurrent request %d: text differs from alone" % i)


def wait_log(s, since, words, timeout=20):
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [l for l in s.lines[since:] if words in l]
        if found:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("the server did not log %r: %s" % (words, s.log()))


def test_clients_that_leave(s):
    """A client that leaves cancels its job: running (stream or not) or queued. LONG_TOKENS take seconds."""
    s = Server(["--ctx", str(LONG_CTX)])
    long_chat = {"messages": [{"role": "user", "content": "Tell me everything"}], "max_tokens": LONG_TOKENS,
                 "ignore_eos": True}
    # a stream, after its first event
    n_before = len(s.lines)
    c = s.conn()
    c.request("POST", "/v1/chat/completions", body=json.dumps(dict(long_chat, stream=True)))
    r = c.getresponse()
    check(r.status == 200, "stream status %d" % r.status)
    check(r.readline().startswith(b"data: "), "a first event")
    # meanwhile a second request queues behind it, and leaves too
    q = s.conn(timeout=0.5)
    q.request("POST", "/v1/completions",
              body=json.dumps({"prompt": "Hi", "max_tokens": LONG_TOKENS, "ignore_eos": True}))
    try:
        q.getresponse()
        raise AssertionError("the queued request was answered while the stream ran")
    except socket.timeout:
        pass
    q.sock.shutdown(socket.SHUT_RDWR)
    q.close()
    time.sleep(0.4)  # its connection thread notices
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    line = wait_log(s, n_before, "cancelled after")
    m = re.search(r"cancelled after (\d+) new tokens \(the client went away\)", line)
    check(m and int(m.group(1)) < LONG_TOKENS, "the stream was cut short: %s" % line)
    wait_log(s, n_before, "dropped: the client went away while it was queued")
    # a request that is not streamed, while it runs
    n_before = len(s.lines)
    c = s.conn(timeout=0.5)
    c.request("POST", "/v1/chat/completions", body=json.dumps(long_chat))
    try:
        c.getresponse()
        raise AssertionError("%d tokens came back in 0.5 s: make the request longer" % LONG_TOKENS)
    except socket.timeout:
        pass
    c.sock.shutdown(socket.SHUT_RDWR)
    c.close()
    line = wait_log(s, n_before, "cancelled after")
    check("the client went away" in line, "non-streamed request cancelled: %s" % line)
    t0 = time.time()
    status, _ = s.post("/v1/completions", {"prompt": "Hi", "max_tokens": 2})
    check(status == 200 and time.time() - t0 < 10, "the next request is served at once")
    check(s.stop() == 0, "the long-context server's exit: %s" % s.log())


def test_port_in_use(s):
    p = subprocess.run([CLI, "serve", "-m", TARGET, "--port", str(s.port)], capture_output=True, timeout=30)
    lines = p.stderr.decode().strip().splitlines()
    check(p.returncode == 1, "port in use: exit %d, want 1: %r" % (p.returncode, lines))
    check(len(lines) == 1 and "in use" in lines[0] and str(s.port) in lines[0], "port in use: %r" % lines)


def test_usage_errors(s):
    for args, words in ((["--port", "70000"], "--port"), (["--bogus"], "unknown option"),
                        (["--host", "no.such.host.invalid"], "cannot resolve")):
        p = subprocess.run([CLI, "serve", "-m", TARGET] + args, capture_output=True, timeout=30)
        err = p.stderr.decode()
        check(p.returncode in (1, 2) and words in err and len(err.strip().splitlines()) == 1,
              "serve %s: exit %d %r" % (args, p.returncode, err))


def test_signals_stop_cleanly(_):
    for sig in (signal.SIGTERM, signal.SIGINT):
        s = Server(["--ctx", str(LONG_CTX)])
        results = {}

        def long_stream():
            try:
                c = s.conn()
                c.request("POST", "/v1/completions", body=json.dumps(
                    {"prompt": "Once upon a time", "max_tokens": LONG_TOKENS, "stream": True, "ignore_eos": True}))
                r = c.getresponse()
                results["stream_status"] = r.status
                results["stream_first"] = r.readline()
                results["stream_rest"] = r.read()
            except Exception as e:  # the connection may close under it: that is fine
                results["stream_error"] = repr(e)

        def queued():
            try:
                results["queued"] = s.request("POST", "/v1/completions", {"prompt": "Hi", "max_tokens": 5})
            except Exception as e:
                results["queued"] = repr(e)

        t1 = threading.Thread(target=long_stream)
        t1.start()
        deadline = time.time() + 20
        while "stream_first" not in results and "stream_error" not in results and time.time() < deadline:
            time.sleep(0.02)
        check(results.get("stream_status") == 200, "stream before the signal: %r" % results)
        t2 = threading.Thread(target=queued)
        t2.start()
        time.sleep(0.3)  # let it reach the queue
        t0 = time.time()
        rc = s.stop(sig)
        t1.join(20)
        t2.join(20)
        check(rc == 0, "exit status %d after signal %d: %s" % (rc, sig, s.log()))
        check(time.time() - t0 < 10, "slow shutdown")
        check(any("shutting down" in l for l in s.lines) and s.lines[-1].endswith("stopped"), "log: %s" % s.log())
        q = results.get("queued")
        check(isinstance(q, tuple) and q[0] == 503 and b"shutting down" in q[2], "queued request: %r" % (q,))
        rest = results.get("stream_rest", b"")
        check(b"shutting down" in rest and rest.rstrip().endswith(b"data: [DONE]"),
              "the stream ends with an error event and [DONE]: %r" % rest[-300:])


TESTS = [test_health_and_models, test_completions_equal_generate, test_chat_equal_generate,
         test_chat_template_multi_turn, test_streaming, test_prompt_cache, test_stop_strings,
         test_sampling_reproducible, test_penalties, test_repetition_penalty, test_sampling_seeds,
         test_sampling_greedy, test_sampling_stream,
         test_request_errors, test_http_errors,
         test_concurrent_requests, test_clients_that_leave, test_port_in_use, test_usage_errors,
         test_signals_stop_cleanly]
# A test function left out of TESTS would never run (test_penalties once was): main() fails on any.
UNLISTED = sorted(k for k, v in list(globals().items()) if k.startswith("test_") and callable(v) and v not in TESTS)


def synth():
    subprocess.run([CLI, "synth", "target", "--preset", "tiny", "--layers", "4", "--ctx", str(LONG_CTX), "-q",
                    "-o", TARGET], check=True, capture_output=True)
    os.makedirs(DRAFTER)
    subprocess.run([CLI, "synth", "drafter", "-m", TARGET, "-o", os.path.join(DRAFTER, "model.safetensors"),
                    "--dim", "64", "--layers", "2", "--heads", "4", "--ffn", "128", "--target-layers", "1,2"],
                   check=True, capture_output=True)


def main():
    global passed, failed
    if not os.path.exists(CLI):
        print("flashmap CLI not found at %s (set FM_CLI)" % CLI)
        print("0 passed, 1 failed")
        return 1
    t_all = time.time()
    if UNLISTED:
        failed += 1
        print("FAIL test functions missing from TESTS: %s" % ", ".join(UNLISTED))
    try:
        synth()
        server = Server()
        for t in TESTS:
            t0 = time.time()
            try:
                t(server)
                passed += 1
                print("ok   %-36s %.2fs" % (t.__name__, time.time() - t0), flush=True)
            except Exception:
                failed += 1
                print("FAIL %-36s" % t.__name__, flush=True)
                traceback.print_exc()
                print("server log:\n" + server.log())
        rc = server.stop()
        if rc != 0:
            failed += 1
            print("FAIL the server exited with %d: %s" % (rc, server.log()))
    except Exception:
        failed += 1
        traceback.print_exc()
    finally:
        for p in STARTED:
            if p.poll() is None:
                p.kill()
                p.wait()
        TMP.cleanup()
    print("total %.1fs" % (time.time() - t_all))
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
