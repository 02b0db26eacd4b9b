#!/usr/bin/env python3
"""drafter_reference.py: the FlashMap drafter's drafts computed by the authors' own code.

Runs FlashMapDraftModel from the `flashmap` PyPI package (0.1.0, modeling_flashmap.py) in float32 on the CPU
over a drafter written by `flashmap synth drafter` (safetensors + config.json) and a target's token table and
lm_head read from its GGUF with the `gguf` package (Q8_0 / F16 / BF16 / F32 dequantised to float32).

The zero-noise one-step draft of NOTES.md is the package's `draft(..., num_steps=1, noise=zeros)`: at s = 0
embed_state gives state_norm(uniform_embeds) + noise_gate * noise_norm(0 @ E) = state_norm(uniform_embeds).

Known differences to our spec (the spec wins): the package keeps the context K/V in the model dtype (float32
here) where the spec stores f16; our lm_head over a Q8_0 table quantises the activations to Q8_0 as llama.cpp
does. Both only move logits slightly; fixtures record each slot's top-2 logit margin so tests can tell a
near-tie from a real mismatch.

Usage (also imported by make_drafter_fixtures.py):
  drafter_reference.py --target T.gguf --drafter DIR --features F.npy --rounds "n0:anchor0,n1:anchor1"
"""
import argparse
import json
import os
import sys

import numpy as np


def gguf_matrix(reader, name):
    """A GGUF tensor as a float32 [rows][cols] array (ggml ne[0] is the column count)."""
    from gguf import quants

    for t in reader.tensors:
        if t.name == name:
            data = quants.dequantize(t.data, t.tensor_type)
            cols, rows = int(t.shape[0]), int(t.shape[1])
            return np.asarray(data, dtype=np.float32).reshape(rows, cols)
    return None


def target_tables(path):
    """(token table E, lm_head W), both float32 [vocab][dim]; W is E when the target is tied."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    emb = gguf_matrix(r, "token_embd.weight")
    out = gguf_matrix(r, "output.weight")
    return emb, (emb if out is None else out)


def load_drafter(folder):
    """The authors' FlashMapDraftModel in float32 with the synthesized weights (strict: names must match)."""
    import torch
    from safetensors.torch import load_file
    from flashmap.configuration_flashmap import FlashMapConfig
    from flashmap.modeling_flashmap import FlashMapDraftModel

    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    for k in ("model_type", "architectures", "torch_dtype"):
        cfg.pop(k, None)
    config = FlashMapConfig(**cfg)
    model = FlashMapDraftModel(config).float().eval()
    # safetensors.numpy cannot read BF16, so the weights go through torch.
    weights = {k: v.float() for k, v in load_file(os.path.join(folder, "model.safetensors")).items()}
    model.load_state_dict(weights, strict=True)
    return model, config


def run(target_path, drafter_dir, features, rounds):
    """rounds: [(n_rows, anchor)]: extend the context by features[len:len+n_rows] (after the previous round,
    the first of them overwrites that round's anchor slot), then draft after `anchor` at position len.
    Returns per round {pos, anchor, drafts, head [K][H], top2 ids [K][2], margin [K] (top-1 minus top-2
    logit), logit_scale}."""
    import torch
    from torch import nn
    from flashmap.modeling_flashmap import FlashMapCache

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    emb, out = target_tables(target_path)
    model, config = load_drafter(drafter_dir)
    embed = nn.Embedding(emb.shape[0], emb.shape[1])
    embed.weight.data = torch.from_numpy(emb.copy())
    lm_head = nn.Linear(out.shape[1], out.shape[0], bias=False)
    lm_head.weight.data = torch.from_numpy(out.copy())
    K, V = config.block_size, emb.shape[0]
    cache = FlashMapCache(config, 1, features.shape[0] + 1, dtype=torch.float32)
    heads = []
    hook = model.head.register_forward_hook(lambda m, a, o: heads.append(o.detach().clone()))
    results, used = [], 0
    with torch.no_grad():
        for n_rows, anchor in rounds:
            model.extend_context(cache, torch.from_numpy(features[None, used:used + n_rows].copy()))
            used += n_rows
            heads.clear()
            logits = model.draft(torch.tensor([anchor]), cache, embed, lm_head, num_steps=1,
                                 noise=torch.zeros(1, K, V))
            lg = logits[0].double().numpy()
            order = np.argsort(-lg, axis=1, kind="stable")[:, :2]  # ties: the lower id first, as argmax
            top2 = np.take_along_axis(lg, order, axis=1)
            results.append({
                "pos": used,
                "anchor": int(anchor),
                "drafts": [int(x) for x in lg.argmax(axis=1)],
                "head": heads[-1][0].double().numpy().tolist(),
                "margin": [float(a - b) for a, b in top2],
                "top2": order.tolist(),
                "logit_scale": float(np.abs(lg).max()),
            })
    hook.remove()
    return results


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True)
    ap.add_argument("--drafter", required=True, help="folder with model.safetensors and config.json")
    ap.add_argument("--features", required=True, help=".npy float32 [rows][n_capture*dim]")
    ap.add_argument("--rounds", required=True, help="n_rows:anchor,... e.g. 5:7,3:11")
    a = ap.parse_args()
    feats = np.load(a.features).astype(np.float32)
    rounds = [tuple(int(x) for x in r.split(":")) for r in a.rounds.split(",")]
    json.dump(run(a.target, a.drafter, feats, rounds), sys.stdout)
    print()


if __name__ == "__main__":
    main()
