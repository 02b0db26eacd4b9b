#!/usr/bin/env python3
"""make_drafter_fixtures.py: writes tests/fixtures/drafter/*.json, the drafter's parity fixtures.

For each tiny (target, drafter) pair below: `flashmap synth target` and `flashmap synth drafter` write the
files (fixed seeds; the fixture records their sha256 so a changed synthesizer is reported as such), feature
rows are drawn from a seeded numpy generator and stored in the fixture, and the authors' own drafter code
(the `flashmap` PyPI package via scripts/drafter_reference.py, float32 on the CPU) computes each round's
16 drafts, per-slot head outputs and top-2 logits. tests/test_drafter.c redoes the synthesis and compares.

Needs: torch, transformers, flashmap (pip install flashmap --no-deps), gguf, safetensors, numpy.
Usage: scripts/make_drafter_fixtures.py --cli build/flashmap
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import drafter_reference  # noqa: E402

# name, target synth args, drafter synth args, feature seed, rounds [(new rows, anchor)]
PAIRS = [
    ("f32_untied_bf16", "--layers 6 --dim 64 --heads 4 --kv-heads 2 --ffn 128 --type f32 --untied --seed 11",
     "--dim 64 --layers 2 --heads 4 --ffn 96 --captures 2 --cond 32 --time-dim 32 --seed 21 --type bf16",
     31, [(5, 7), (3, 300)]),
    ("q8_tied_f16", "--layers 4 --dim 64 --heads 2 --kv-heads 1 --ffn 96 --type q8_0 --tied --seed 12",
     "--dim 96 --layers 1 --heads 3 --ffn 64 --target-layers 0,2,3 --cond 16 --time-dim 16 --seed 22 "
     "--type f16", 32, [(6, 65), (2, 1)]),
    ("bf16_tied_f32_block8", "--layers 5 --dim 32 --heads 2 --kv-heads 2 --ffn 64 --type bf16 --tied --seed 13",
     "--dim 32 --layers 2 --heads 2 --ffn 48 --captures 1 --block 8 --cond 16 --time-dim 16 --seed 23 "
     "--type f32", 33, [(4, 100), (1, 499)]),
]

# Head outputs agree within HEAD_TOL * max(1, max |head|): the spec keeps the context K/V in f16 where the
# package keeps float32. A slot whose top-2 logit gap is under NEAR_TIE * max(1, max |logit|) is a near-tie:
# its draft must be one of the two (a Q8_0 lm_head quantises activations, as llama.cpp does).
HEAD_TOL = 5e-3
NEAR_TIE = 1e-2


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cli", required=True, help="the flashmap binary")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "tests", "fixtures", "drafter"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    import flashmap
    import torch

    for name, targs, dargs, fseed, rounds in PAIRS:
        with tempfile.TemporaryDirectory() as tmp:
            tgt, drf = os.path.join(tmp, "target.gguf"), os.path.join(tmp, "model.safetensors")
            subprocess.check_call([a.cli, "synth", "target", "-o", tgt, "-q"] + targs.split())
            subprocess.check_call([a.cli, "synth", "drafter", "-m", tgt, "-o", drf] + dargs.split(),
                                  stderr=subprocess.DEVNULL)
            with open(os.path.join(tmp, "config.json")) as f:
                cfg = json.load(f)
            width = len(cfg["target_layer_ids"]) * cfg["target_hidden_size"]
            rows = sum(n for n, _ in rounds)
            feats = np.random.default_rng(fseed).standard_normal((rows, width)).astype(np.float32)
            res = drafter_reference.run(tgt, tmp, feats, rounds)
            out_rounds = []
            for (n, anchor), r in zip(rounds, res):
                scale = max(1.0, r["logit_scale"])
                near = [m < NEAR_TIE * scale for m in r["margin"]]
                head = np.asarray(r["head"], dtype=np.float64)
                out_rounds.append({
                    "new_rows": n, "pos": r["pos"], "anchor": anchor, "drafts": r["drafts"],
                    "top2": r["top2"], "near_tie": near, "margin": [round(m, 6) for m in r["margin"]],
                    "head_tol": HEAD_TOL * max(1.0, float(np.abs(head).max())),
                    "head": [float(f"{x:.7g}") for x in head.reshape(-1)],
                })
            fx = {
                "name": name,
                "reference": f"flashmap {getattr(flashmap, '__version__', '0.1.0')} FlashMapDraftModel.draft "
                             f"(float32, torch {torch.__version__}), zero noise, one step",
                "target_args": targs.split(), "drafter_args": dargs.split(),
                "target_sha256": sha256(tgt), "drafter_sha256": sha256(drf),
                "target_layer_ids": cfg["target_layer_ids"], "block": cfg["block_size"],
                "target_dim": cfg["target_hidden_size"], "feature_width": width, "feature_seed": fseed,
                # the shortest decimal that reads back as the same float32
                "features": [float(str(x)) for x in feats.reshape(-1)],
                "rounds": out_rounds,
            }
        path = os.path.join(a.out, name + ".json")
        with open(path, "w") as f:
            json.dump(fx, f, separators=(",", ":"))
            f.write("\n")
        print(f"{path}: {os.path.getsize(path)} bytes; drafts {[r['drafts'] for r in out_rounds]}")


if __name__ == "__main__":
    main()
