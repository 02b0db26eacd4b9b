#!/usr/bin/env bash
# demo.sh: builds flashmap and runs it on built-in demo models, or on real ones.
#
#   scripts/demo.sh                      random-weight demo pair (made once, cached), plain vs speculative,
#                                        then a speed table at SIMULATED acceptance
#   scripts/demo.sh TARGET.gguf DRAFTER  the same on real models (e.g. after `flashmap pull`)
#
# The demo target has the real Qwen3 vocabulary (data/qwen3-tokenizer.json.xz) but random weights: its text
# is gibberish and its drafter's guesses are almost never right. What it shows is the machinery: speculative
# output identical to plain output, and what speculation gains when drafts are accepted (simulated).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install_deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target flashmap_cli >/dev/null
fm=build/flashmap
threads=$(nproc)

if [ $# -ge 2 ]; then
    target=$1
    drafter=$2
    kind="real models"
else
    cache=${FLASHMAP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flashmap}/demo
    mkdir -p "$cache"
    target=$cache/qwen3-demo-q8_0.gguf
    drafter=$cache/flashmap-demo
    if [ ! -f "$target" ]; then
        echo "demo: writing a random-weight Qwen3 target with the real vocabulary (once) ..." >&2
        xz -dc data/qwen3-tokenizer.json.xz >"$cache/tokenizer.json"
        $fm synth target -o "$target" --layers 12 --dim 768 --heads 12 --kv-heads 4 --head-dim 64 --ffn 2048 \
            --type q8_0 --tokenizer "$cache/tokenizer.json" --seed 7
    fi
    if [ ! -f "$drafter/model.safetensors" ]; then
        echo "demo: writing a random-weight FlashMap drafter for it (once) ..." >&2
        mkdir -p "$drafter"
        $fm synth drafter -m "$target" -o "$drafter/model.safetensors" --dim 512 --layers 2 --heads 8 \
            --head-dim 64 --ffn 1536 --captures 3 --seed 7
    fi
    kind="RANDOM-WEIGHT demo models (gibberish text; real Qwen3 vocabulary)"
fi

prompt='Write a C function that reverses a linked list.'
echo
echo "== flashmap demo on $kind"
echo "target:  $target"
echo "drafter: $drafter"
echo
$fm generate -m "$target" -p "$prompt" --chat --no-think -n 48 -t "$threads" --no-spec --json >/tmp/fm-demo-plain.json
$fm generate -m "$target" -d "$drafter" -p "$prompt" --chat --no-think -n 48 -t "$threads" --json \
    >/tmp/fm-demo-spec.json
python3 - /tmp/fm-demo-plain.json /tmp/fm-demo-spec.json <<'PY'
import json, sys
plain, spec = (json.load(open(p)) for p in sys.argv[1:3])
print("plain decoding      :", repr(plain["text"][:160]))
print("speculative decoding:", repr(spec["text"][:160]))
same = plain["tokens"] == spec["tokens"]
print("identical token ids :", "YES" if same else "NO (a bug: please report it)")
s = spec["stats"]
print(f"speculative rounds  : {s['rounds']}, mean accepted drafts {s['mean_accepted']:.2f}, "
      f"plain steps {s['plain_steps']} (the fallback takes over when drafts lose)")
sys.exit(0 if same else 1)
PY
echo
echo "== sampled (temperature 0.7, top-k 20, top-p 0.8, seed 7): the drafter changes the speed, not the text"
$fm generate -m "$target" -p "$prompt" --chat --no-think -n 48 -t "$threads" --no-spec --json \
    --temp 0.7 --top-k 20 --top-p 0.8 --seed 7 >/tmp/fm-demo-plain-s.json
$fm generate -m "$target" -d "$drafter" -p "$prompt" --chat --no-think -n 48 -t "$threads" --json \
    --temp 0.7 --top-k 20 --top-p 0.8 --seed 7 >/tmp/fm-demo-spec-s.json
python3 - /tmp/fm-demo-plain-s.json /tmp/fm-demo-spec-s.json <<'PY'
import json, sys
plain, spec = (json.load(open(p)) for p in sys.argv[1:3])
print("plain, sampled      :", repr(plain["text"][:160]))
same = plain["tokens"] == spec["tokens"]
print("speculative, sampled: identical token ids:", "YES" if same else "NO (a bug: please report it)")
sys.exit(0 if same else 1)
PY
echo
echo "== speed at SIMULATED acceptance (drafts replaced by the known continuation; same verify/accept code)"
$fm bench -m "$target" -d "$drafter" -t "$threads" --reps 3 --long-reps 1 --prefill 128 --gen 48
