#!/usr/bin/env python3
"""Tokenizer encoding throughput: flashmap vs Hugging Face `tokenizers`, measured in the same run.

  python3 bench/tokenizer_bench.py --bench BUILD/bench_tokenizer [--tokenizer-json PATH] [--mb 10] [--repeat 3]

Builds ~MB megabytes of mixed text (English prose, code, CJK, Arabic/Devanagari, emoji, digits, whitespace
runs, NFD text, special tokens) from the seeded generators of scripts/make_tokenizer_fixtures.py, then encodes it:
  - flashmap: bench_tokenizer (one encode call over the whole text, single thread, best of --repeat);
  - HF single thread: Tokenizer.encode of the whole text with RAYON_NUM_THREADS=1 (best of --repeat);
  - HF single thread, batch: encode_batch over the text cut into lines with RAYON_NUM_THREADS=1;
  - HF batch: encode_batch over the lines on all cores (HF's parallelism; for reference).
Checks that flashmap's ids equal HF's on the whole text, and prints a Markdown table.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "scripts"))
import make_tokenizer_fixtures as fx  # noqa: E402


def make_text(mb, seed=7):
    rng = random.Random(seed)
    gens = [g for g in fx.GENERATORS if g[0] not in ("invalid", "long")]
    weights = [count for _, _, count in gens]
    parts, size = [], 0
    while size < mb * 1_000_000:
        _, gen, _ = rng.choices(gens, weights)[0]
        s = gen(rng)
        s = fx.fix_surrogates(s) + rng.choice(["\n", " ", "\n\n", ""])
        parts.append(s)
        size += len(s.encode("utf-8"))
    return "".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True, help="path of the bench_tokenizer executable")
    ap.add_argument("--tokenizer-json", default="/work/shared/testdata/qwen3-tokenizer/tokenizer.json")
    ap.add_argument("--mb", type=float, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()

    text = make_text(a.mb)
    data = text.encode("utf-8")
    with tempfile.TemporaryDirectory() as d:
        tf, idf = os.path.join(d, "text.txt"), os.path.join(d, "ids.txt")
        open(tf, "wb").write(data)
        out = subprocess.run([a.bench, a.tokenizer_json, tf, str(a.repeat), idf], check=True, capture_output=True,
                             text=True).stdout
        ours = json.loads(out)
        our_ids = [int(x) for x in open(idf)]

    code = ("import os,sys,time,json\nfrom tokenizers import Tokenizer\n"
            "t=Tokenizer.from_file(sys.argv[1]); s=open(sys.argv[2],encoding='utf-8',newline='').read(); best=1e9\n"
            "for _ in range(int(sys.argv[3])):\n t0=time.perf_counter(); ids=t.encode(s,add_special_tokens=False).ids; "
            "best=min(best,time.perf_counter()-t0)\n"
            "lines=s.splitlines(keepends=True); t0=time.perf_counter(); t.encode_batch(lines,add_special_tokens=False); "
            "tb=time.perf_counter()-t0\n"
            "json.dump({'ids':ids,'seconds':best,'batch_seconds':tb},sys.stdout)\n")
    with tempfile.TemporaryDirectory() as d:
        tf = os.path.join(d, "text.txt")
        open(tf, "wb").write(data)
        env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="true")
        hf1 = json.loads(subprocess.run([sys.executable, "-c", code, a.tokenizer_json, tf, str(a.repeat)], env=env,
                                        check=True, capture_output=True, text=True).stdout)
        env = dict(os.environ, TOKENIZERS_PARALLELISM="true")
        env.pop("RAYON_NUM_THREADS", None)
        hfn = json.loads(subprocess.run([sys.executable, "-c", code, a.tokenizer_json, tf, "1"], env=env,
                                        check=True, capture_output=True, text=True).stdout)
    same = our_ids == hf1["ids"]
    mb = len(data) / 1e6
    import tokenizers
    rows = [
        ("flashmap (C, 1 thread), one encode call over the whole text", ours["seconds"], mb / ours["seconds"]),
        (f"HF tokenizers {tokenizers.__version__} encode of the whole text, RAYON_NUM_THREADS=1", hf1["seconds"],
         mb / hf1["seconds"]),
        ("HF tokenizers encode_batch over lines, RAYON_NUM_THREADS=1", hf1["batch_seconds"],
         mb / hf1["batch_seconds"]),
        (f"HF tokenizers encode_batch over lines, {os.cpu_count()} threads", hfn["batch_seconds"],
         mb / hfn["batch_seconds"]),
    ]
    print(f"text: {mb:.2f} MB mixed (seeded), {len(our_ids)} ids; ids identical to HF: {same}; "
          f"flashmap tokenizer load {ours['load_seconds']:.2f} s")
    print("| encoder | seconds | MB/s |\n|---|---:|---:|")
    for name, s, r in rows:
        print(f"| {name} | {s:.3f} | {r:.2f} |")
    print(f"\nflashmap / HF single-thread (whole text): {rows[0][2] / rows[1][2]:.2f}x; "
          f"flashmap / HF single-thread (batch of lines): {rows[0][2] / rows[2][2]:.2f}x")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
