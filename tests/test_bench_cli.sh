#!/usr/bin/env bash
# test_bench_cli.sh: `flashmap bench` on a tiny synthetic pair runs to the end (exit 0) and prints every row
# of its table, with "OK" for each simulated-acceptance identity check; with a stand-in llama-bench (a script
# printing llama-bench's JSON shape) the llama.cpp columns are filled from its samples; bad usage exits 2.
# Timings are never checked: they depend on the machine.
set -u
source "$(dirname "$0")/cli_pair.sh"

small=(--reps 1 --stream-mib 16 --prompt 16 --gen 24 --prefill 64 -t 2)
"$cli" bench -m "$tmp/t.gguf" -d "$tmp/d" "${small[@]}" --out "$tmp/report.md" >"$tmp/out.txt" 2>"$tmp/err.txt"
rc=$?
check "bench exits 0 (got $rc; stderr: $(tail -n 2 "$tmp/err.txt"))" test "$rc" -eq 0
for label in "plain step (T=1)" "verify(8) (T=8)" "verify(17) (T=17)" "draft (one drafter forward)" \
  "prefill 64 tokens" "plain decode (24 new tokens)" "SIMULATED acceptance 0 " "SIMULATED acceptance 2 " \
  "SIMULATED acceptance 4 " "SIMULATED acceptance 6.5 " "SIMULATED acceptance 8 " "read bandwidth" \
  "plain decode, sampled (T 0.7, top-k 20, top-p 0.8)" "SIMULATED acceptance 6.5, sampled" \
  "roofline step"; do
  check "row '$label' printed" grep -qF "$label" "$tmp/out.txt"
done
check "six identity checks say OK" test "$(grep -c 'SIMULATED.*output OK' "$tmp/out.txt")" -eq 6
check "the draft row names the drafter's weight type" grep -qF "q8_0 weights" "$tmp/out.txt" 
check "no MISMATCH" test "$(grep -c MISMATCH "$tmp/out.txt")" -eq 0
check "--out has the machine" grep -q "^- Machine: .*avx2 \(yes\|no\)" "$tmp/report.md"
check "--out has the command" grep -qF -- "- Command: \`flashmap bench -m $tmp/t.gguf" "$tmp/report.md"
check "--out has the table" grep -qF "| plain step (T=1)" "$tmp/report.md"

# A stand-in llama-bench: llama-bench's -o json shape, with samples derived from its arguments.
cat >"$tmp/fake-llama-bench" <<'FAKE'
#!/bin/sh
prompts=""; gen=0
while [ $# -gt 0 ]; do
  case "$1" in -p) prompts="$2"; shift ;; -n) gen="$2"; shift ;; esac
  shift
done
echo "["
for p in $(echo "$prompts" | tr ',' ' '); do
  echo "{\"build_commit\": \"fake123\", \"cpu_info\": \"fake cpu\", \"n_prompt\": $p, \"n_gen\": 0, \"avg_ts\": 100.0, \"samples_ts\": [ 100.0 ]},"
done
echo "{\"build_commit\": \"fake123\", \"cpu_info\": \"fake cpu\", \"n_prompt\": 0, \"n_gen\": $gen, \"avg_ts\": 10.0, \"samples_ts\": [ 10.0 ]}"
echo "]"
FAKE
chmod +x "$tmp/fake-llama-bench"
"$cli" bench -m "$tmp/t.gguf" "${small[@]}" --llama-bench "$tmp/fake-llama-bench" --out "$tmp/r2.md" \
  >"$tmp/out2.txt" 2>"$tmp/err2.txt"
rc=$?
check "bench with a llama-bench exits 0 (got $rc; stderr: $(tail -n 2 "$tmp/err2.txt"))" test "$rc" -eq 0
check "llama.cpp step from tg (10 tok/s = 100 ms)" grep -qF "100.0 ms (1000/tg24)" "$tmp/out2.txt"
check "llama.cpp verify(8) from pp8 (100 tok/s: 80 ms)" grep -qF "80.0 ms = 0.80 steps (8/pp8)" "$tmp/out2.txt"
check "llama.cpp prefill from pp64" grep -qF "100.0 tok/s (pp64)" "$tmp/out2.txt"
check "llama.cpp decode from tg24" grep -qF "10.00 tok/s (tg24)" "$tmp/out2.txt"
check "no drafter: rows say so" grep -qF "not measured (no -d)" "$tmp/out2.txt"
check "--out names llama.cpp's build" grep -qF "(build fake123)" "$tmp/r2.md"

# A llama-bench that fails: the table still prints, the failure is named, the exit status is 1.
"$cli" bench -m "$tmp/t.gguf" "${small[@]}" --llama-bench /bin/false >"$tmp/out3.txt" 2>"$tmp/err3.txt"
rc=$?
check "failing llama-bench exits 1 (got $rc)" test "$rc" -eq 1
check "failure is named" grep -q "llama-bench failed: /bin/false exited with status 1" "$tmp/out3.txt"

"$cli" bench >/dev/null 2>"$tmp/err4.txt"
rc=$?
check "no -m exits 2 (got $rc)" test "$rc" -eq 2
check "no -m names the flag" grep -qF -- "-m TARGET.gguf" "$tmp/err4.txt"
"$cli" bench -m "$tmp/t.gguf" --reps 0 >/dev/null 2>&1
check "--reps 0 exits 2" test $? -eq 2
"$cli" bench -m "$tmp/missing.gguf" --reps 1 >/dev/null 2>"$tmp/err5.txt"
rc=$?
check "missing model exits 1 (got $rc)" test "$rc" -eq 1
check "missing model names the file" grep -qF "missing.gguf" "$tmp/err5.txt"

"$cli" bench -m "$tmp/t.gguf" --draft-weights f8 >/dev/null 2>"$tmp/err6.txt"
check "bad --draft-weights exits 2" test $? -eq 2
check "bad --draft-weights is named" grep -qF "expects auto, q8_0 or stored, got 'f8'" "$tmp/err6.txt"
"$cli" generate -m "$tmp/t.gguf" -d "$tmp/d" --draft-weights stored --prompt-ids 1,2,3 -n 8 --json \
  >"$tmp/g1.json" 2>/dev/null
"$cli" generate -m "$tmp/t.gguf" -d "$tmp/d" --draft-weights q8_0 --prompt-ids 1,2,3 -n 8 --json \
  >"$tmp/g2.json" 2>/dev/null
check "generate with stored and q8_0 drafter weights: same tokens" \
  test "$(grep -o '"tokens":\[[^]]*\]' "$tmp/g1.json")" = "$(grep -o '"tokens":\[[^]]*\]' "$tmp/g2.json")"
check "generate printed tokens" grep -q '"tokens":\[[0-9]' "$tmp/g1.json"

# --json keeps every byte of the text, NUL bytes included (this tiny model emits token 0 in this reply).
"$cli" generate -m "$tmp/t.gguf" --chat -p Hi -n 120 >"$tmp/plain.txt" 2>/dev/null
"$cli" generate -m "$tmp/t.gguf" --chat -p Hi -n 120 --json >"$tmp/g3.json" 2>/dev/null
check "the reply holds a NUL byte (else this check tests nothing)" \
  python3 -c 'import sys; sys.exit(0 if b"\0" in open(sys.argv[1], "rb").read() else 1)' "$tmp/plain.txt"
check "generate --json text == plain output (less its final newline), byte for byte" python3 -c '
import json, sys
text = json.load(open(sys.argv[1]))["text"].encode("utf-8", "surrogatepass")
sys.exit(0 if text + b"\n" == open(sys.argv[2], "rb").read() else 1)' "$tmp/g3.json" "$tmp/plain.txt"

# The engine options are parsed once for every command (tools/cli_engine.c): the same value errors, and the
# options a command does not take are unknown there.
for cmd in generate chat serve bench; do
  "$cli" $cmd -m "$tmp/t.gguf" --verify 99 >/dev/null 2>"$tmp/e_$cmd.txt" </dev/null
  check "$cmd --verify 99 exits 2" test $? -eq 2
  check "$cmd --verify 99 is named" grep -qF "flashmap $cmd: --verify expects a whole number from 1 to 32, got '99'" \
    "$tmp/e_$cmd.txt"
done
"$cli" bench -m "$tmp/t.gguf" --device cpu >/dev/null 2>"$tmp/e_dev.txt"
check "bench --device is unknown (bench is CPU only)" grep -qF "unknown option '--device'" "$tmp/e_dev.txt"
"$cli" chat -m "$tmp/t.gguf" --ctx 8 </dev/null >/dev/null 2>"$tmp/e_ctx.txt"
check "chat --ctx 8 is named" grep -qF "flashmap chat: --ctx expects a whole number from 16" "$tmp/e_ctx.txt"
printf 'Hi\n' | "$cli" chat -m "$tmp/t.gguf" -d "$tmp/d" -n 6 --device cpu --draft-weights stored --verify 3 \
  >"$tmp/chat.txt" 2>"$tmp/chat_err.txt"
check "chat with generate's engine options exits 0 ($(tail -n 1 "$tmp/chat_err.txt"))" test $? -eq 0
check "chat reports its turn" grep -q "new tok" "$tmp/chat_err.txt"

if [ "$fail" = 0 ]; then echo "test_bench_cli: all checks passed"; fi
exit "$fail"
