#!/usr/bin/env bash
# Runs the target/speculative benchmark end to end and records it in bench/RESULTS.md:
#   1. builds flashmap (Release) in $FLASHMAP_BENCH_BUILD (default /tmp/build-flashmap-bench),
#   2. synthesizes the full-size pair once (Qwen3-4B-shaped Q8_0 target with the real Qwen3 vocabulary,
#      FlashMap-Qwen3-4B-shaped BF16 drafter) under $CACHE/synth/ (CACHE = $FLASHMAP_CACHE, else
#      $XDG_CACHE_HOME/flashmap, else ~/.cache/flashmap),
#   3. builds llama.cpp's llama-bench once (bench/build_llamacpp.sh; source in $LLAMA_CPP_SRC, default
#      $CACHE/llama.cpp-src, fetched from PyPI's llama-cpp-python sdist when absent) unless $LLAMA_BENCH names one,
#   4. runs `flashmap bench` (2 threads unless -t) and replaces the section between the flashmap-bench markers
#      of bench/RESULTS.md with the new table; every other section of the file is kept as it is.
#
#   bench/run_bench.sh [-t THREADS] [--reps N] [--long-reps N] [--no-llama] [--no-record] [-- BENCH OPTIONS]
# (options after -- go to `flashmap bench` as they are, e.g. -- --gen 32)
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${FLASHMAP_BENCH_BUILD:-/tmp/build-flashmap-bench}"
cache="${FLASHMAP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/flashmap}"
threads=2
reps=5
long_reps=3
use_llama=1
record=1
while [ $# -gt 0 ]; do
  case "$1" in
    -t) threads="$2"; shift 2 ;;
    --reps) reps="$2"; shift 2 ;;
    --long-reps) long_reps="$2"; shift 2 ;;
    --no-llama) use_llama=0; shift ;;
    --no-record) record=0; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "run_bench.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done

echo "== building flashmap in $build" >&2
cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j2 --target flashmap_cli >&2
fm="$build/flashmap"

synth="$cache/synth"
target="$synth/qwen3-4b-q8_0.gguf"
drafter="$synth/flashmap-qwen3-4b/model.safetensors"
mkdir -p "$synth/flashmap-qwen3-4b"
if [ ! -f "$target" ]; then
  echo "== synthesizing $target (4.3 GB; takes minutes)" >&2
  tokenizer="${FLASHMAP_QWEN3_TOKENIZER:-$repo/../shared/testdata/qwen3-tokenizer/tokenizer.json}"
  tok_args=()
  if [ -f "$tokenizer" ]; then
    tok_args=(--tokenizer "$tokenizer")
  else
    echo "run_bench.sh: $tokenizer not found; the target gets the builtin byte-level vocabulary padded to" \
      "151936 rows (same shape and speed; set FLASHMAP_QWEN3_TOKENIZER to use the real one)" >&2
    tok_args=(--vocab 151936)
  fi
  "$fm" synth target --preset qwen3-4b "${tok_args[@]}" -o "$target" >&2
fi
if [ ! -f "$drafter" ]; then
  echo "== synthesizing $drafter (0.95 GB)" >&2
  "$fm" synth drafter -m "$target" -o "$drafter" >&2
fi

llama_args=()
llama_commit="not measured"
if [ "$use_llama" = 1 ]; then
  llama_bench="${LLAMA_BENCH:-}"
  src="${LLAMA_CPP_SRC:-$cache/llama.cpp-src}"
  if [ -z "$llama_bench" ]; then
    llama_bench="$cache/llama.cpp-build/bin/llama-bench"
    if [ ! -x "$llama_bench" ]; then
      echo "== building llama.cpp (10-20 minutes on 2 cores)" >&2
      from=()
      [ -f "$src/CMakeLists.txt" ] || from=(--from-pypi)
      "$repo/bench/build_llamacpp.sh" "${from[@]}" "$src" "$cache/llama.cpp-build" >&2
    fi
  fi
  if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
    llama_commit="$(git -C "$src" rev-parse HEAD)"
  elif [ -f "$src/.flashmap-llama-commit" ]; then
    llama_commit="$(cat "$src/.flashmap-llama-commit")"
  else
    llama_commit="unknown"
  fi
  llama_args=(--llama-bench "$llama_bench")
fi

report="$(mktemp /tmp/flashmap-bench-XXXXXX.md)"
trap 'rm -f "$report"' EXIT
echo "== flashmap bench ($threads threads)" >&2
status=0
"$fm" bench -m "$target" -d "$synth/flashmap-qwen3-4b" -t "$threads" --reps "$reps" --long-reps "$long_reps" \
  "${llama_args[@]}" --out "$report" "$@" || status=$?

if [ "$record" = 1 ] && [ -s "$report" ]; then
  results="$repo/bench/RESULTS.md"
  section="$(mktemp /tmp/flashmap-bench-section-XXXXXX.md)"
  {
    echo "<!-- flashmap-bench:begin (written by bench/run_bench.sh; edit outside these markers) -->"
    echo "## Target and speculative decoding (flashmap bench)"
    echo
    echo "Full-size synthetic pair (random weights, so acceptance is SIMULATED): Qwen3-4B-shaped Q8_0 target"
    echo "(36 layers, 2560, 32/8 heads of 128, FFN 9728, vocab 151936, tied) and a FlashMap-Qwen3-4B-shaped BF16"
    echo "drafter (dim 2048, 6 layers, 16x128 heads, FFN 8192, 5 captures), made by \`flashmap synth\`."
    echo "llama.cpp: commit $llama_commit, built by bench/build_llamacpp.sh (Release, GGML_NATIVE=ON, CPU)."
    echo "Regenerate with \`bench/run_bench.sh\`."
    echo
    cat "$report"
    echo "<!-- flashmap-bench:end -->"
  } > "$section"
  python3 - "$results" "$section" <<'PY'
import re, sys
path, section_path = sys.argv[1], sys.argv[2]
section = open(section_path).read().rstrip("\n") + "\n"
try:
    text = open(path).read()
except FileNotFoundError:
    text = "# Benchmark results\n\n"
pattern = re.compile(r"<!-- flashmap-bench:begin.*?<!-- flashmap-bench:end -->\n?", re.S)
if pattern.search(text):
    text = pattern.sub(lambda m: section, text, count=1)
else:
    text = text.rstrip("\n") + "\n\n" + section
open(path, "w").write(text)
PY
  rm -f "$section"
  echo "== recorded in $results" >&2
fi
exit "$status"
