#!/usr/bin/env python3
"""make_sampling_fixtures.py: what Hugging Face transformers' sampling keeps of a row of logits, for
tests/test_sampler.c. The engine's sampler (src/decode/sampler.c) must keep the same tokens with the same
probabilities for the same temperature / top-k / top-p / min-p, and give the same penalised logits as
RepetitionPenaltyLogitsProcessor for the same sequence and repetition penalty.

How to run (seconds; needs numpy, torch, transformers):
    python3 scripts/make_sampling_fixtures.py        # rewrites tests/fixtures/sampling/cases.json

The warpers are built the way transformers' GenerationMixin._get_logits_processor builds them for
do_sample=True (temperature, then top-k, then top-p, then min-p, each only when set), and applied to the row;
the fixture keeps softmax of the result where it is not -inf. Rows: random normal logits at several scales,
a peaked row, rows with tied values (top-k keeps every token tied with the k-th), a row with -inf entries.
Cases whose top-p cut falls within 1e-5 of a token's cumulative mass are skipped (float32, HF's, and float64,
ours, may put such a token on either side, and neither side is wrong), and so are those whose cut falls between
tied logits (which of them stay depends on the sort's order among equals: ours keeps the lower ids).
"""
import json
import os

import numpy as np
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "sampling", "cases.json")


def warpers(t, k, p, min_p):
    procs = LogitsProcessorList()
    if t != 1.0:
        procs.append(TemperatureLogitsWarper(t))
    if k:
        procs.append(TopKLogitsWarper(top_k=k, min_tokens_to_keep=1))
    if p < 1.0:
        procs.append(TopPLogitsWarper(top_p=p, min_tokens_to_keep=1))
    if min_p:
        procs.append(MinPLogitsWarper(min_p=min_p, min_tokens_to_keep=1))
    return procs


def ambiguous_top_p_cut(row, t, k, p):
    """True when the top-p cut on this row is within 1e-5 of a token's cumulative mass, or falls between
    tokens of equal logits (then which of them stay depends on the sort's order among ties)."""
    if p >= 1.0:
        return False
    x = np.asarray(row, dtype=np.float64) / t
    if k:
        kth = np.sort(x)[::-1][k - 1]
        x = x[x >= kth]
    x = np.sort(x)[::-1]
    w = np.exp(x - x[0])
    before = np.concatenate([[0.0], np.cumsum(w)[:-1]]) / w.sum()
    kept = max(1, int(np.sum(before < p)))
    return bool(np.any(np.abs(before - p) < 1e-5)) or (kept < len(x) and x[kept - 1] == x[kept])


def rows(rng):
    out = []
    for scale in (0.5, 2.0, 6.0):
        out.append(("normal x%g" % scale, (rng.standard_normal(300) * scale).astype(np.float32)))
    peaked = (rng.standard_normal(300) * 1.0).astype(np.float32)
    peaked[17] += 12
    peaked[201] += 10
    out.append(("peaked", peaked))
    tied = np.round(rng.standard_normal(200) * 2).astype(np.float32)  # many exact ties
    out.append(("ties", tied))
    with_inf = (rng.standard_normal(100) * 3).astype(np.float32)
    with_inf[rng.choice(100, 30, replace=False)] = -np.inf
    out.append(("-inf", with_inf))
    return out


def main():
    torch.set_num_threads(1)
    rng = np.random.default_rng(20261201)
    settings = [
        (1.0, 0, 1.0, 0.0),
        (0.7, 0, 1.0, 0.0),
        (0.6, 20, 0.95, 0.0),  # Qwen3's suggestion for thinking mode
        (0.7, 20, 0.8, 0.0),  # and without thinking
        (1.0, 5, 1.0, 0.0),
        (1.3, 0, 0.9, 0.0),
        (0.8, 40, 0.95, 0.05),  # llama.cpp's defaults (it applies the temperature last; HF first)
        (1.0, 0, 1.0, 0.1),
        (0.5, 0, 0.5, 0.2),
        (2.0, 50, 0.99, 0.0),
        (1.0, 1, 1.0, 0.0),
        (0.9, 0, 0.3, 0.0),
    ]
    cases, logits = [], {}
    all_rows = rows(rng)
    for name, row in all_rows:
        logits[name] = [float(v) if np.isfinite(v) else None for v in row]  # None: -inf
        for t, k, p, min_p in settings:
            if ambiguous_top_p_cut(row[np.isfinite(row)], t, k, p):
                continue
            scores = warpers(t, k, p, min_p)(None, torch.tensor(row[None, :]))[0]
            keep = torch.isfinite(scores)
            probs = torch.softmax(scores.double(), dim=-1)
            ids = torch.nonzero(keep).flatten().tolist()
            cases.append(
                {
                    "row": name,
                    "temperature": t,
                    "top_k": k,
                    "top_p": p,
                    "min_p": min_p,
                    "ids": ids,
                    "probs": [float(probs[i]) for i in ids],
                }
            )
    # The repetition penalty: HF's processor on a row, given the sequence so far (input_ids); the engine must
    # give the same float32 values bit for bit (tests/test_sampler.c).
    repetition = []
    for name, row in all_rows:
        for penalty in (1.1, 1.3, 0.7, 2.0):
            context = rng.integers(0, len(row), size=int(rng.integers(1, 40))).tolist()
            context += context[:3]  # repeated tokens count once
            out = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([context]), torch.tensor(row[None, :]))[0]
            repetition.append({"row": name, "penalty": penalty, "context": context,
                               "out": [float(v) if np.isfinite(v) else None for v in out.numpy()]})
    with open(OUT, "w") as f:
        json.dump({"generator": "transformers %s, torch %s" % (__import__("transformers").__version__,
                                                              torch.__version__),
                   "rows": logits, "cases": cases, "repetition": repetition}, f)
        f.write("\n")
    print("wrote %d cases and %d repetition cases to %s" % (len(cases), len(repetition), os.path.relpath(OUT)))


if __name__ == "__main__":
    main()
