#!/usr/bin/env python3
"""test_synth_gguf_py.py: `flashmap synth target` files checked with code nobody here wrote (gguf-py, llama.cpp's
Python GGUF package) plus a numpy Qwen3 forward pass (Hugging Face Qwen3 semantics: RMSNorm, per-head q/k
norm, rotate-half RoPE, GQA, SwiGLU).
  1. gguf-py reads the files; tensor names are exactly gguf-py's Qwen3 tensor list (rope_freqs aside;
     output.weight only when untied); metadata keys come from gguf-py's Keys with the right types.
  2. The same seed in f32, q8_0, f16 and bf16: q8_0 == gguf-py's quantize(f32, Q8_0) byte for byte (ggml's
     reference quantiser), f16 == numpy's float16 cast, bf16 == gguf-py's BF16 rounding; norms stay f32.
  3. A 36-layer model runs finite in numpy, its residual RMS stays O(1), greedy continuations are not one
     repeated token, and the top-2 logit gaps are wide.
Env: FM_CLI (the flashmap binary), FM_BINARY_DIR (scratch). Needs numpy and gguf (no torch)."""
import os
import subprocess
import sys
import tempfile

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType, Keys, MODEL_ARCH, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES
from gguf.quants import quantize

CLI = os.environ.get("FM_CLI", "flashmap")
TMP = tempfile.mkdtemp(dir=os.environ.get("FM_BINARY_DIR"))
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL:", what, file=sys.stderr)


def synth(name, *args):
    path = os.path.join(TMP, name)
    subprocess.run([CLI, "synth", "target", "-q", "-o", path, *args], check=True)
    return GGUFReader(path)


def field(r, key):
    f = r.fields.get(key)
    return (f.types, f.contents()) if f else (None, None)


# ---- 1. names and metadata ----
SHAPE = ["--layers", "3", "--dim", "64", "--heads", "4", "--kv-heads", "2", "--head-dim", "32", "--ffn", "96"]
readers = {t: synth(f"py_{t}.gguf", *SHAPE, "--seed", "11", "--untied", "--type", t) for t in ("f32", "q8_0", "f16", "bf16")}
tied = synth("py_tied.gguf", *SHAPE, "--seed", "11", "--tied")
for r, is_tied in ((readers["f32"], False), (tied, True)):
    want = set()
    for t in MODEL_TENSORS[MODEL_ARCH.QWEN3]:
        if t == MODEL_TENSOR.ROPE_FREQS or (is_tied and t == MODEL_TENSOR.OUTPUT):
            continue
        fmt = TENSOR_NAMES[t]
        for b in range(3) if "{bid}" in fmt else [None]:
            want.add((fmt.format(bid=b) if b is not None else fmt) + ".weight")
    got = {t.name for t in r.tensors}
    check(got == want, f"tensor names: extra {sorted(got - want)} missing {sorted(want - got)}")
r = readers["f32"]
U32, F32 = [4], [6]  # GGUFValueType.UINT32, FLOAT32
expect = {Keys.General.ARCHITECTURE: (None, "qwen3"), Keys.LLM.BLOCK_COUNT: (U32, 3), Keys.LLM.CONTEXT_LENGTH: (U32, 2048),
          Keys.LLM.EMBEDDING_LENGTH: (U32, 64), Keys.LLM.FEED_FORWARD_LENGTH: (U32, 96),
          Keys.Attention.HEAD_COUNT: (U32, 4), Keys.Attention.HEAD_COUNT_KV: (U32, 2),
          Keys.Attention.KEY_LENGTH: (U32, 32), Keys.Attention.VALUE_LENGTH: (U32, 32),
          Keys.Rope.FREQ_BASE: (F32, 1e6), Keys.Attention.LAYERNORM_RMS_EPS: (F32, np.float32(1e-6))}
for key, (types, value) in expect.items():
    key = key.format(arch="qwen3")
    t, v = field(r, key)
    check(v is not None and (types is None or [int(x) for x in t] == types) and v == value, f"{key} = {v} {t}")
shapes = {t.name: [int(x) for x in t.shape] for t in r.tensors}  # gguf-py reports ne order
check(shapes["token_embd.weight"][0] == 64 and shapes["blk.0.attn_q.weight"] == [64, 128], "q shape")
check(shapes["blk.0.attn_k.weight"] == [64, 64] and shapes["blk.0.attn_output.weight"] == [128, 64], "k/o shape")
check(shapes["blk.2.ffn_down.weight"] == [96, 64] and shapes["blk.1.attn_k_norm.weight"] == [32], "ffn/norm shape")

# ---- 2. the four weight types agree with gguf-py's conversions ----
by_type = {k: {t.name: t for t in v.tensors} for k, v in readers.items()}
for name, t32 in by_type["f32"].items():
    x = np.asarray(t32.data, dtype=np.float32)
    if x.ndim == 1:
        for k in ("q8_0", "f16", "bf16"):
            check(by_type[k][name].tensor_type == GGMLQuantizationType.F32, f"{name} ({k}) norm not f32")
        continue
    q8 = np.asarray(by_type["q8_0"][name].data).view(np.uint8).reshape(-1)
    check(np.array_equal(quantize(x, GGMLQuantizationType.Q8_0).reshape(-1), q8), f"{name}: q8_0 differs from gguf-py")
    f16 = np.asarray(by_type["f16"][name].data).view(np.float16)
    check(np.array_equal(x.astype(np.float16).view(np.uint16), f16.reshape(x.shape).view(np.uint16)), f"{name}: f16")
    bf = np.asarray(by_type["bf16"][name].data).view(np.uint8).reshape(-1)
    check(np.array_equal(quantize(x, GGMLQuantizationType.BF16).view(np.uint8).reshape(-1), bf), f"{name}: bf16")


# ---- 3. a numpy forward pass of a 36-layer model ----
def rms(x, w, eps):
    return x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps).astype(np.float32) * w


def rope(x, theta):  # x [T, heads, hd]; rotate-half pairs (i, i + hd/2), as HF Qwen3 and llama.cpp NEOX
    T, hd = x.shape[0], x.shape[-1]
    ang = np.arange(T)[:, None] * theta ** (-np.arange(0, hd, 2) / hd)[None, :]
    c, s = np.cos(ang)[:, None, :].astype(np.float32), np.sin(ang)[:, None, :].astype(np.float32)
    a, b = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([a * c - b * s, b * c + a * s], -1)


def forward(W, hp, ids, trace):
    T, (L, H, KV, hd, eps, theta) = len(ids), hp
    x = W["token_embd.weight"][ids]
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    for l in range(L):
        p = f"blk.{l}."
        h = rms(x, W[p + "attn_norm.weight"], eps)
        q = rope(rms((h @ W[p + "attn_q.weight"].T).reshape(T, H, hd), W[p + "attn_q_norm.weight"], eps), theta)
        k = rope(rms((h @ W[p + "attn_k.weight"].T).reshape(T, KV, hd), W[p + "attn_k_norm.weight"], eps), theta)
        v = (h @ W[p + "attn_v.weight"].T).reshape(T, KV, hd)
        o = np.empty((T, H, hd), np.float32)
        for j in range(H):
            s = q[:, j] @ k[:, j // (H // KV)].T / np.sqrt(hd) + mask
            s = np.exp(s - s.max(-1, keepdims=True))
            o[:, j] = (s / s.sum(-1, keepdims=True)) @ v[:, j // (H // KV)]
        x = x + o.reshape(T, H * hd) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"], eps)
        g = h @ W[p + "ffn_gate.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ W[p + "ffn_up.weight"].T)) @ W[p + "ffn_down.weight"].T
        trace.append(float(np.sqrt((x**2).mean())))
    return rms(x, W["output_norm.weight"], eps) @ W.get("output.weight", W["token_embd.weight"]).T


for mode in ("--tied", "--untied"):
    r = synth(f"py_deep{mode}.gguf", "--layers", "36", "--dim", "128", "--heads", "4", "--kv-heads", "2",
              "--head-dim", "32", "--ffn", "256", "--seed", "3", mode)
    W = {t.name: np.asarray(t.data, dtype=np.float32) for t in r.tensors}
    hp = (36, 4, 2, 32, 1e-6, 1e6)
    rng = np.random.default_rng(1)
    distinct, gaps, peak = [], [], 0.0
    for trial in range(3):
        seq = list(rng.integers(0, 440, 8))
        for _ in range(10):
            trace = []
            logits = forward(W, hp, np.array(seq), trace)[-1]
            check(np.all(np.isfinite(logits)) and max(trace) < 10, f"{mode}: residual RMS {max(trace)}")
            peak = max(peak, max(trace))
            s = np.sort(logits)
            gaps.append((s[-1] - s[-2]) / logits.std())
            seq.append(int(logits.argmax()))
        distinct.append(len(set(seq[8:])))
    print(f"{mode}: peak residual RMS {peak:.2f}, distinct greedy tokens per 10 {distinct}, "
          f"top-2 gap / logit std p10 {np.percentile(gaps, 10):.3f} median {np.median(gaps):.3f}")
    check(max(distinct) >= 4 and all(d > 1 for d in distinct), f"{mode}: greedy output collapses {distinct}")
    check(np.median(gaps) > 0.25, f"{mode}: median top-2 gap {np.median(gaps)}")

print(f"test_synth_gguf_py: {'FAILED' if failures else 'ok'} ({failures} failures)")
sys.exit(1 if failures else 0)
