#!/usr/bin/env python3
"""make_target_fixtures.py: reference numbers for the Qwen3 target from two implementations nobody here wrote,
llama.cpp (through llama-cpp-python) and Hugging Face transformers, on tiny random-weight models written by
`flashmap synth target`. tests/test_target_reference.c compares the engine against them, so CI needs no torch.

How to run (about a minute on 2 cores; needs numpy, gguf, torch, transformers, llama-cpp-python):
    cmake -S . -B /tmp/build-target && cmake --build /tmp/build-target -j2 --target flashmap_cli
    python3 scripts/make_target_fixtures.py --cli /tmp/build-target/flashmap      # or: FM_CLI=... python3 ...
It rewrites tests/fixtures/target/cases.json (a few hundred KB). The output is deterministic: fixed synth seeds,
fixed prompt seeds, single-threaded-equivalent references (llama.cpp on 1 thread, torch on 1 thread).

The K-quant and legacy cases (LLAMA_ONLY_CASES: Q4_K_M, Q5_K_M, Q4_K, Q5_K, Q6_K, Q4_0, Q5_0) are compared with llama.cpp only, and
carry no "hf" part (tests/test_target_reference.c accepts cases without one). The reason is practical: on the
machines that made them torch could not be installed (PyPI's torch wheel is the CUDA build, several GB with
its nvidia-* dependencies; the CPU wheels live outside PyPI), and llama.cpp is the reference that matters for
K-quants anyway: it quantises the activations to Q8_K exactly as the engine does, where transformers would run
the dequantised weights on f32 activations (a difference of a few percent of the scale, as for Q8_0,
that says little about the engine). Those cases are regenerated without torch and merged into the existing file:
    python3 scripts/make_target_fixtures.py --cli /tmp/build-target/flashmap --llama-only
which keeps every other case byte for byte (the script checks that the file re-serialises to itself before
merging) and records the versions used in each regenerated case. A full run (no flag; torch needed for the
other cases) writes every case, the K-quant ones still llama.cpp-only. llama-cpp-python builds llama.cpp from
source (`pip install llama-cpp-python`, ~15 minutes on 2 cores); its CPU build runs the K-quant products on
Q8_K activations (the AVX2 kernels, or the scalar reference: the integer sums are exact either way).
`--kv-spread` prints, per case, how far llama.cpp's own logits move when only its KV cache goes from f16 to
f32 (the numbers the K-quant tolerance in test_target_reference.c is argued from).

Per case:
  (a) `flashmap synth target ...` with fixed arguments and seed; the GGUF's sha256 is recorded, so the C test can
      tell "the synthesizer changed" apart from "the engine changed".
  (b) llama.cpp: the prompt is evaluated in one batch, the logits of the last prompt row are kept (top-20 ids and
      values, plus summary values), then greedy decoding of N_GEN tokens by argmax of the raw logits (no sampler
      is involved, so nothing can perturb greedy), one token per eval. Each step's top-1/top-2 margin is kept so
      the test can tell a real mismatch from a near tie. KV cache: llama.cpp's default f16; flash attention off.
  (c) transformers: Qwen3ForCausalLM built from the same GGUF tensors (dequantised by the gguf package), in
      float32 with eager attention. ggml's ne order is reversed from torch's, so a GGUF tensor with
      ne = [cols, rows] is a torch [rows, cols] weight, which is what GGUFReader's numpy arrays already are.
      llama.cpp's convert_hf_to_gguf permutes q/k rows only for the llama family (its rope pairs i, i+1);
      qwen2/qwen3 use NEOX rope (pairs i, i+hd/2) and are written unpermuted (conversion/qwen.py: Qwen2Model has
      no permute), so the GGUF q/k weights are HF's as they are. Recorded: last-row logits (top-20 + summary),
      the greedy ids (full recompute per step), and the output of 0-based layer i (the residual stream before
      the final norm) at the capture layers for a few positions, full vectors. Those come from forward hooks on
      the decoder layers, because transformers >= 5 replaces hidden_states[-1] with the *normed* last state; the
      hooks are cross-checked against hidden_states[i + 1] for the layers below the last.
"""
import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

N_GEN = 24
TOPK = 20

# The covering set: every weight type; GQA ratios 1, 2, 4; head_dim 64 and 128 (also q_dim != dim); tied and
# untied; prompts of 1, 7, 64 and 300 tokens; 2-4 layers. vocab None = the builtin tokenizer's own size.
CASES = [
    # name                      type    L  dim heads kv  hd  ffn  vocab tied prompt seed
    ("f32_g1_hd64_tied_p7",     "f32",  2, 128, 2,  2,  64, 384, None, 1,  7,   11),
    ("f32_g4_hd128_untied_p64", "f32",  2, 256, 4,  1, 128, 512, 800,  0,  64,  12),
    ("f32_g2_hd64_untied_p300", "f32",  3, 128, 4,  2,  64, 320, None, 0,  300, 13),
    ("f32_g2_hd128_tied_p1",    "f32",  4, 128, 2,  1, 128, 256, None, 1,  1,   14),
    ("f16_g1_hd128_untied_p1",  "f16",  2, 256, 2,  2, 128, 512, None, 0,  1,   21),
    ("f16_g2_hd64_tied_p64",    "f16",  3, 192, 4,  2,  64, 384, 700,  1,  64,  22),
    ("f16_g4_hd64_untied_p300", "f16",  2, 256, 4,  1,  64, 512, None, 0,  300, 23),
    ("bf16_g2_hd128_tied_p7",   "bf16", 2, 128, 2,  1, 128, 384, None, 1,  7,   31),
    ("bf16_g1_hd64_untied_p64", "bf16", 3, 256, 4,  4,  64, 512, None, 0,  64,  32),
    ("bf16_g4_hd64_untied_p1",  "bf16", 2, 128, 4,  1,  64, 256, 600,  0,  1,   33),
    ("q8_0_g1_hd64_untied_p7",  "q8_0", 2, 128, 2,  2,  64, 384, None, 0,  7,   41),
    ("q8_0_g4_hd128_tied_p64",  "q8_0", 4, 256, 4,  1, 128, 512, 900,  1,  64,  42),
    ("q8_0_g2_hd64_untied_p300", "q8_0", 2, 256, 8, 4,  64, 512, None, 0,  300, 43),
    ("q8_0_g2_hd128_untied_p1", "q8_0", 3, 128, 2,  1, 128, 256, None, 0,  1,   44),
]

# The K-quants, against llama.cpp only (see the docstring): every K type and both of llama.cpp's mixes; dims
# multiples of 256; the Q4_K_M / Q5_K_M cases have 8 layers, so that attn_v and ffn_down are Q6_K in some
# layers (0, 3, 6, 7) and the base type in the others, and the lm_head Q6_K (tied: the token table itself).
LLAMA_ONLY_CASES = [
    # name                         type     L  dim heads kv  hd  ffn  vocab tied prompt seed
    ("q4_k_m_g2_hd128_tied_p7",     "q4_k_m", 8, 256, 2,  1, 128, 512, None, 1,  7,   51),
    ("q4_k_m_g4_hd64_untied_p64",   "q4_k_m", 3, 512, 8,  2,  64, 768, 700,  0,  64,  52),
    ("q5_k_m_g2_hd64_untied_p300",  "q5_k_m", 8, 256, 4,  2,  64, 512, None, 0,  300, 53),
    ("q4_k_g1_hd128_untied_p1",     "q4_k",   2, 256, 2,  2, 128, 512, None, 0,  1,   54),
    ("q5_k_g2_hd128_tied_p64",      "q5_k",   2, 256, 2,  1, 128, 768, None, 1,  64,  55),
    ("q6_k_g2_hd64_untied_p7",      "q6_k",   3, 256, 4,  2,  64, 512, 600,  0,  7,   56),
    ("q6_k_g4_hd128_tied_p300",     "q6_k",   2, 512, 4,  1, 128, 512, None, 1,  300, 57),
    # one-token prompts: attention is trivial, so the engine equals llama.cpp to f32 rounding unless one
    # activation rounding flip gets amplified (test_target_reference.c explains it; seed 59 shows one)
    ("q4_k_m_g2_hd64_untied_p1",    "q4_k_m", 8, 256, 4,  2,  64, 512, None, 0,  1,   58),
    ("q5_k_m_g4_hd128_tied_p1",     "q5_k_m", 8, 512, 4,  1, 128, 768, None, 1,  1,   59),
    ("q6_k_g1_hd128_untied_p1",     "q6_k",   2, 256, 2,  2, 128, 256, None, 0,  1,   60),
    # the legacy 32-weight types (llama.cpp multiplies them by Q8_0 activations, as we do)
    ("q4_0_g2_hd64_untied_p7",      "q4_0",   2, 128, 4,  2,  64, 384, None, 0,  7,   61),
    ("q5_0_g1_hd128_tied_p64",      "q5_0",   3, 256, 2,  2, 128, 512, 700,  1,  64,  62),
    ("q4_0_g4_hd64_tied_p300",      "q4_0",   2, 256, 4,  1,  64, 512, None, 1,  300, 63),
    ("q5_0_g2_hd128_untied_p1",     "q5_0",   2, 128, 2,  1, 128, 256, None, 0,  1,   64),
]
LLAMA_ONLY = {c[0] for c in LLAMA_ONLY_CASES}
ALL_CASES = CASES + LLAMA_ONLY_CASES


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def synth_args(c):
    name, wtype, L, dim, heads, kv, hd, ffn, vocab, tied, _, seed = c
    args = ["--layers", str(L), "--dim", str(dim), "--heads", str(heads), "--kv-heads", str(kv), "--head-dim",
            str(hd), "--ffn", str(ffn), "--type", wtype, "--tied" if tied else "--untied", "--seed", str(seed),
            "--qk-norm", "1"]
    if vocab is not None:
        args += ["--vocab", str(vocab)]
    return args


def capture_layers(n_layers):
    return [0, n_layers - 1] if n_layers <= 2 else [0, 1, n_layers - 1]


def capture_positions(T):
    return sorted(set([0, T // 2, T - 1]))


def r7(x):
    """Floats with 7 significant digits: float32 round-trips to within 1 ulp-ish, and the JSON stays small."""
    return [float(f"{v:.7g}") for v in np.asarray(x, dtype=np.float64).ravel()]


def logit_summary(logits):
    lg = np.asarray(logits, dtype=np.float64)
    order = np.argsort(-lg, kind="stable")[:TOPK]  # stable: ties keep the lower id first, like the engine
    m = lg.max()
    return {
        "top_ids": [int(i) for i in order],
        "top_logits": r7(lg[order]),
        "argmax": int(np.argmax(lg)),
        "margin": float(f"{lg[order[0]] - lg[order[1]]:.7g}"),
        "mean": float(f"{lg.mean():.7g}"),
        "std": float(f"{lg.std():.7g}"),
        "min": float(f"{lg.min():.7g}"),
        "max": float(f"{m:.7g}"),
        "logsumexp": float(f"{m + math.log(np.exp(lg - m).sum()):.7g}"),
    }


def margin_of(logits):
    lg = np.sort(np.asarray(logits, dtype=np.float64))
    return float(lg[-1] - lg[-2])


# ---- (b) llama.cpp ----

def run_llama_cpp(gguf_path, prompt, n_gen):
    import llama_cpp

    kw = dict(model_path=gguf_path, n_ctx=len(prompt) + n_gen + 8, n_batch=512, n_ubatch=512, n_threads=1,
              n_threads_batch=1, logits_all=True, verbose=False, seed=0)
    # Flash attention would round Q to f16 as well; the classic path keeps the f16 KV cache and nothing else.
    try:
        llm = llama_cpp.Llama(flash_attn=False, **kw)
    except TypeError:
        llm = llama_cpp.Llama(**kw)
    assert llm.n_vocab() > max(prompt), "prompt id out of the model's vocabulary"
    llm.reset()
    llm.eval(prompt)
    last = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    ids, margins = [], []
    cur = last
    for _ in range(n_gen):
        tok = int(np.argmax(cur))  # lowest id on ties, as the engine
        ids.append(tok)
        margins.append(float(f"{margin_of(cur):.7g}"))
        llm.eval([tok])
        cur = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
    del llm
    return last, ids, margins


# ---- (c) transformers ----

def gguf_hparams(reader):
    def val(key, default=None):
        f = reader.fields.get(key)
        if f is None:
            return default
        return f.contents()

    arch = val("general.architecture")
    assert arch == "qwen3", arch
    hp = {
        "n_layers": int(val("qwen3.block_count")),
        "dim": int(val("qwen3.embedding_length")),
        "n_heads": int(val("qwen3.attention.head_count")),
        "n_kv_heads": int(val("qwen3.attention.head_count_kv")),
        "ffn": int(val("qwen3.feed_forward_length")),
        "rope_theta": float(val("qwen3.rope.freq_base", 1e6)),
        "rms_eps": float(val("qwen3.attention.layer_norm_rms_epsilon", 1e-6)),
        "ctx": int(val("qwen3.context_length", 40960)),
    }
    hp["head_dim"] = int(val("qwen3.attention.key_length", hp["dim"] // hp["n_heads"]))
    return hp


HF_NAMES = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}


def hf_name(gguf_name):
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    blk, i, part, w = gguf_name.split(".")
    assert blk == "blk" and w == "weight", gguf_name
    return f"model.layers.{i}.{HF_NAMES[part]}.weight"


def build_hf_model(gguf_path):
    import torch
    from gguf import GGUFReader
    from gguf.quants import dequantize
    from transformers import Qwen3Config, Qwen3ForCausalLM

    reader = GGUFReader(gguf_path)
    hp = gguf_hparams(reader)
    state = {}
    for t in reader.tensors:
        # numpy shape = reversed ggml ne = torch shape: [rows, cols] for matrices, [n] for norms.
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        expect = tuple(int(n) for n in reversed(list(t.shape)))
        w = w.reshape(expect)
        state[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(w))
    tied = "lm_head.weight" not in state
    vocab = state["model.embed_tokens.weight"].shape[0]
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=hp["dim"], intermediate_size=hp["ffn"], num_hidden_layers=hp["n_layers"],
        num_attention_heads=hp["n_heads"], num_key_value_heads=hp["n_kv_heads"], head_dim=hp["head_dim"],
        rms_norm_eps=hp["rms_eps"], max_position_embeddings=hp["ctx"], tie_word_embeddings=tied,
        rope_parameters={"rope_type": "default", "rope_theta": hp["rope_theta"]}, attention_bias=False,
        use_sliding_window=False, hidden_act="silu")
    cfg._attn_implementation = "eager"
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected
    assert set(missing) <= ({"lm_head.weight"} if tied else set()), missing
    if tied:
        model.tie_weights()
        assert torch.equal(model.lm_head.weight, state["model.embed_tokens.weight"])
    assert abs(model.config.rope_parameters["rope_theta"] - hp["rope_theta"]) < 1e-3 * hp["rope_theta"]
    return model, hp


def run_hf(gguf_path, prompt, n_gen, cap_layers, positions):
    import torch

    torch.set_num_threads(1)
    model, hp = build_hf_model(gguf_path)
    captured = {}
    hooks = []
    for l in cap_layers:
        def hook(_mod, _inp, out, l=l):
            captured[l] = (out[0] if isinstance(out, tuple) else out).detach().clone()
        hooks.append(model.model.layers[l].register_forward_hook(hook))
    with torch.no_grad():
        ids = torch.tensor([prompt], dtype=torch.long)
        out = model(input_ids=ids, output_hidden_states=True, use_cache=False)
        for h in hooks:
            h.remove()
        for l in cap_layers:
            if l < hp["n_layers"] - 1:  # hidden_states[l+1] is layer l's output, except for the last layer
                assert torch.equal(out.hidden_states[l + 1], captured[l]), f"hook vs hidden_states at layer {l}"
        last = out.logits[0, -1].numpy().astype(np.float32)
        feats = {str(l): {str(p): r7(captured[l][0, p].numpy()) for p in positions} for l in cap_layers}
        # Greedy by full recompute (no HF cache, nothing that could differ from the single-pass numbers).
        seq = list(prompt)
        gen, margins = [], []
        cur = last
        for _ in range(n_gen):
            tok = int(np.argmax(cur))
            gen.append(tok)
            margins.append(float(f"{margin_of(cur):.7g}"))
            seq.append(tok)
            cur = model(input_ids=torch.tensor([seq]), use_cache=False).logits[0, -1].numpy().astype(np.float32)
    return last, feats, gen, margins


def make_case(c, cli, tmp, with_hf):
    name, wtype, L, dim, heads, kv, hd, ffn, vocab, tied, plen, seed = c
    path = os.path.join(tmp, name + ".gguf")
    sargs = synth_args(c)
    subprocess.run([cli, "synth", "target", "-q", "-o", path] + sargs, check=True, stdout=subprocess.DEVNULL)
    from gguf import GGUFReader
    reader = GGUFReader(path)
    emb = [t for t in reader.tensors if t.name == "token_embd.weight"][0]
    n_vocab = int(emb.shape[1])
    del reader
    rng = np.random.default_rng(1000 + seed)
    prompt = [int(v) for v in rng.integers(0, n_vocab, size=plen)]
    lc_last, lc_ids, lc_margins = run_llama_cpp(path, prompt, N_GEN)
    case = {
        "name": name, "type": wtype, "synth_args": sargs, "sha256": sha256_file(path),
        "n_layers": L, "dim": dim, "n_heads": heads, "n_kv_heads": kv, "head_dim": hd, "ffn": ffn,
        "vocab": n_vocab, "tied": tied, "prompt": prompt, "n_gen": N_GEN,
        "llama_cpp": {"last_logits": logit_summary(lc_last), "greedy": lc_ids, "greedy_margins": lc_margins},
    }
    if not with_hf:
        print(f"{name}: vocab {n_vocab}, llama.cpp only; min greedy margin {min(lc_margins):.3g}", file=sys.stderr)
        return case
    cap = capture_layers(L)
    pos = capture_positions(plen)
    hf_last, feats, hf_ids, hf_margins = run_hf(path, prompt, N_GEN, cap, pos)
    d = np.abs(lc_last.astype(np.float64) - hf_last)
    print(f"{name}: vocab {n_vocab}, llama.cpp vs HF last-row logits max|d| {d.max():.3g} "
          f"(max|logit| {np.abs(hf_last).max():.3g}); greedy ids agree on "
          f"{next((i for i, (a, b) in enumerate(zip(lc_ids, hf_ids)) if a != b), N_GEN)}/{N_GEN}; "
          f"min margin llama.cpp {min(lc_margins):.3g}", file=sys.stderr)
    case["hf"] = {"last_logits": logit_summary(hf_last), "greedy": hf_ids, "greedy_margins": hf_margins,
                  "capture_layers": cap, "positions": pos, "features": feats}
    return case


def kv_spread(c, cli, tmp):
    """How far llama.cpp's own last-row logits move when only its KV cache goes from f16 to f32: the size of
    the noise that one rounding difference grows into in this model (the K tolerance is argued from it)."""
    name, plen, seed = c[0], c[10], c[11]
    path = os.path.join(tmp, name + ".gguf")
    subprocess.run([cli, "synth", "target", "-q", "-o", path] + synth_args(c), check=True, stdout=subprocess.DEVNULL)
    import llama_cpp
    from gguf import GGUFReader
    n_vocab = int([t for t in GGUFReader(path).tensors if t.name == "token_embd.weight"][0].shape[1])
    prompt = [int(v) for v in np.random.default_rng(1000 + seed).integers(0, n_vocab, size=plen)]
    out = []
    for kv in ({}, {"type_k": 0, "type_v": 0}):  # GGML_TYPE_F16 (default), GGML_TYPE_F32
        llm = llama_cpp.Llama(model_path=path, n_ctx=plen + 8, n_batch=512, n_ubatch=512, n_threads=1,
                              n_threads_batch=1, logits_all=True, verbose=False, flash_attn=False, **kv)
        llm.eval(prompt)
        out.append(np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64))
        del llm
    rel = np.abs(out[0] - out[1]).max() / np.abs(out[0]).max()
    print(f"{name:28s} T={plen:3d}: llama.cpp f16 KV vs f32 KV, max|d logit| / max|logit| = {rel:.2e}")


def dump(doc):
    return json.dumps(doc, separators=(",", ":")) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cli", default=os.environ.get("FM_CLI"), help="path of the flashmap CLI (or env FM_CLI)")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "target", "cases.json"))
    ap.add_argument("--only", default=None, help="comma-separated case names (debugging: combine with --out)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the cases of the existing --out that this run does not regenerate, unchanged")
    ap.add_argument("--llama-only", action="store_true",
                    help="regenerate only the llama.cpp-only cases (no torch needed), merged into --out")
    ap.add_argument("--kv-spread", action="store_true",
                    help="print llama.cpp's f16-vs-f32 KV cache logit spread per selected case; writes nothing")
    args = ap.parse_args()
    if not args.cli:
        sys.exit("make_target_fixtures.py: give the flashmap CLI with --cli or env FM_CLI")
    only = set(args.only.split(",")) if args.only else None
    selected = [c for c in ALL_CASES
                if (not only or c[0] in only) and (not args.llama_only or c[0] in LLAMA_ONLY)]
    if args.kv_spread:
        with tempfile.TemporaryDirectory() as tmp:
            for c in selected:
                kv_spread(c, args.cli, tmp)
        return
    need_hf = any(c[0] not in LLAMA_ONLY for c in selected)
    import llama_cpp
    versions = {"llama_cpp_python": llama_cpp.__version__}
    if need_hf:
        import torch
        import transformers
        versions.update(transformers=transformers.__version__, torch=torch.__version__)
    versions["numpy"] = np.__version__

    new = {}
    with tempfile.TemporaryDirectory() as tmp:
        for c in selected:
            new[c[0]] = make_case(c, args.cli, tmp, c[0] not in LLAMA_ONLY)
    if (args.merge or args.llama_only) and os.path.exists(args.out):
        with open(args.out) as f:
            text = f.read()
        doc = json.loads(text)
        # Python's json writes back the floats it read (shortest repr) and the keys in their order, so the
        # cases kept are kept byte for byte; checked here on the whole file before anything changes.
        assert dump(doc) == text, f"{args.out}: would not be re-serialised byte for byte; not merging"
        for case in new.values():
            case["versions"] = versions  # the top-level versions describe the cases generated with it
        known = {c[0] for c in ALL_CASES}
        for c in doc["cases"]:
            if c["name"] not in known:
                print(f"{c['name']}: no longer a case, dropped", file=sys.stderr)
        cases = [new.pop(c["name"], c) for c in doc["cases"] if c["name"] in known]  # regenerated: same place
        doc["cases"] = cases + [new[c[0]] for c in selected if c[0] in new]
    else:
        doc = {
            "generator": "scripts/make_target_fixtures.py", "versions": versions,
            "n_gen": N_GEN, "topk": TOPK, "cases": [new[c[0]] for c in selected],
        }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(dump(doc))
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes, {len(doc['cases'])} cases, "
          f"{len(selected)} regenerated)", file=sys.stderr)


if __name__ == "__main__":
    main()
