#!/usr/bin/env bash
# test_generate_sampling.sh: `flashmap generate`'s sampling options end to end on a tiny synthetic pair.
# The same seed gives the same ids, speculative (every verify mode) or plain; another seed gives other ids;
# --json reports the settings and the seed (as digits), a run without --seed draws and reports a fresh one
# that reproduces it; temperature 0 is the greedy output; presence / frequency / repetition penalties change the ids and
# keep speculative == plain; bench refuses the options; bad values exit 2 with one line naming the option.
set -u
source "$(dirname "$0")/cli_pair.sh"

gen() { # gen OUT ARGS...: the tokens array of generate --json
  "$cli" generate -m "$tmp/t.gguf" -d "$tmp/d" --prompt-ids 5,6,7,8 -n 48 --ignore-eos -t 2 --json "${@:2}" \
    >"$tmp/$1.json" 2>"$tmp/$1.err" || { echo "FAIL: generate ${*:2}: $(tail -n 1 "$tmp/$1.err")" >&2; fail=1; }
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["tokens"])' "$tmp/$1.json" >"$tmp/$1.ids"
}
samp=(--temp 1.2 --top-p 0.9 --min-p 0.01)
gen plain "${samp[@]}" --seed 42 --no-spec
gen spec "${samp[@]}" --seed 42
gen spec1 "${samp[@]}" --seed 42 --verify 1
gen spec16 "${samp[@]}" --seed 42 --verify 16 --no-fallback
gen sim "${samp[@]}" --seed 42 --simulate 8
gen other "${samp[@]}" --seed 43 --no-spec
gen greedy --no-spec
gen cold --temp 0 --seed 42 --no-spec
gen topk1 --temp 1.5 --top-k 1 --seed 42
for v in spec spec1 spec16 sim; do
  check "speculative ($v) == plain with the same seed" cmp -s "$tmp/plain.ids" "$tmp/$v.ids"
done
check "the simulated run accepted drafts" python3 -c '
import json,sys; s=json.load(open(sys.argv[1]))["stats"]; sys.exit(0 if s["accepted"] > 0 and s["simulated"] else 1)' \
  "$tmp/sim.json"
check "another seed, other ids" test "$(cat "$tmp/plain.ids")" != "$(cat "$tmp/other.ids")"
check "sampled ids differ from greedy" test "$(cat "$tmp/plain.ids")" != "$(cat "$tmp/greedy.ids")"
check "temperature 0 is greedy" cmp -s "$tmp/greedy.ids" "$tmp/cold.ids"
check "top-k 1 is greedy" cmp -s "$tmp/greedy.ids" "$tmp/topk1.ids"
check "--json reports the settings" python3 -c '
import json,sys; s=json.load(open(sys.argv[1]))["stats"]["sampling"]
sys.exit(0 if s == {"temperature": 1.2, "top_k": 0, "top_p": 0.9, "min_p": 0.01, "seed": 42} else 1)' "$tmp/spec.json"
check "greedy --json has no sampling" python3 -c '
import json,sys; sys.exit(0 if "sampling" not in json.load(open(sys.argv[1]))["stats"] else 1)' "$tmp/greedy.json"
check "the stats line names the seed" grep -q "sampled, seed 42" "$tmp/spec.err"

# Penalties, greedy and sampled: they change the ids, speculative == plain, --json reports them.
gen pen_plain --presence-penalty 1.5 --frequency-penalty 0.5 --no-spec
gen pen_spec --presence-penalty 1.5 --frequency-penalty 0.5 --verify 16 --no-fallback
gen pen_samp_plain "${samp[@]}" --seed 42 --presence-penalty 1 --no-spec
gen pen_samp_spec "${samp[@]}" --seed 42 --presence-penalty 1
check "penalties change the greedy ids" test "$(cat "$tmp/pen_plain.ids")" != "$(cat "$tmp/greedy.ids")"
check "greedy with penalties: speculative == plain" cmp -s "$tmp/pen_plain.ids" "$tmp/pen_spec.ids"
check "sampled with penalties: speculative == plain" cmp -s "$tmp/pen_samp_plain.ids" "$tmp/pen_samp_spec.ids"
check "--json reports the penalties" python3 -c '
import json,sys; s=json.load(open(sys.argv[1]))["stats"]["sampling"]
sys.exit(0 if s["presence_penalty"] == 1.5 and s["frequency_penalty"] == 0.5 else 1)' "$tmp/pen_spec.json"

# The repetition penalty (HF's, over the prompt too; llama.cpp's window): it changes the ids, speculative ==
# plain, --repeat-last-n 0 turns it off, --json reports it.
gen rep_plain --repeat-penalty 1.5 --no-spec
gen rep_spec --repeat-penalty 1.5 --verify 16 --no-fallback
gen rep_win_plain "${samp[@]}" --seed 42 --repeat-penalty 1.3 --repeat-last-n 4 --no-spec
gen rep_win_spec "${samp[@]}" --seed 42 --repeat-penalty 1.3 --repeat-last-n 4
gen rep_off --repeat-penalty 1.5 --repeat-last-n 0
check "a repetition penalty changes the greedy ids" test "$(cat "$tmp/rep_plain.ids")" != "$(cat "$tmp/greedy.ids")"
check "greedy with a repetition penalty: speculative == plain" cmp -s "$tmp/rep_plain.ids" "$tmp/rep_spec.ids"
check "sampled with a repetition window: speculative == plain" cmp -s "$tmp/rep_win_plain.ids" "$tmp/rep_win_spec.ids"
check "--repeat-last-n 0 turns it off" cmp -s "$tmp/rep_off.ids" "$tmp/greedy.ids"
check "--json reports the repetition penalty" python3 -c '
import json,sys; s=json.load(open(sys.argv[1]))["stats"]["sampling"]
sys.exit(0 if s["repetition_penalty"] == 1.3 and s["repeat_last_n"] == 4 else 1)' "$tmp/rep_win_spec.json"

# No --seed: a fresh one, reported as digits, and giving it back reproduces the ids.
gen fresh "${samp[@]}"
seed=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stats"]["sampling"]["seed"])' "$tmp/fresh.json")
check "a fresh seed is an integer ($seed)" grep -qE '"seed":[0-9]+[,}]' "$tmp/fresh.json"
gen again "${samp[@]}" --seed "$seed"
check "the reported seed reproduces the run" cmp -s "$tmp/fresh.ids" "$tmp/again.ids"

# chat samples by default with Qwen3's suggested settings (printed), reproducibly with --seed; --temp 0 is
# greedy and prints no sampling line.
chat() { printf 'hello\nand again\n' | "$cli" chat -m "$tmp/t.gguf" -d "$tmp/d" -n 12 -t 2 "$@" 2>&1; }
chat --seed 9 >"$tmp/c1.txt"; chat --seed 9 >"$tmp/c2.txt"; chat --seed 9 --no-spec >"$tmp/c3.txt"
chat --seed 10 >"$tmp/c4.txt"; chat --temp 0 >"$tmp/c5.txt"
check "chat prints its default sampling" grep -qF "sampling: temperature 0.6, top-k 20, top-p 0.95, min-p 0, seed 9" "$tmp/c1.txt"
strip() { grep -Ev '^\[[0-9]+ new tok|^sampling:' "$1"; } # the replies only (not the stats lines)
check "chat with a seed repeats itself" test "$(strip "$tmp/c1.txt")" = "$(strip "$tmp/c2.txt")"
check "chat speculative == plain" test "$(strip "$tmp/c1.txt")" = "$(strip "$tmp/c3.txt")"
check "chat with another seed differs" test "$(strip "$tmp/c1.txt")" != "$(strip "$tmp/c4.txt")"
check "chat --temp 0 prints no sampling line" test "$(grep -c '^sampling:' "$tmp/c5.txt")" -eq 0
check "chat --no-think uses the non-thinking settings" grep -qF "temperature 0.7, top-k 20, top-p 0.8" <(chat --no-think)

# Bad values: exit 2, one line naming the option.
for bad in "--temp -1" "--temp hot" "--top-p 0" "--top-p 1.5" "--min-p 1" "--top-k -3" "--seed -1" \
  "--presence-penalty 3" "--frequency-penalty x" "--repeat-penalty 0" "--repeat-penalty 11" "--repeat-last-n -2"; do
  "$cli" generate -m "$tmp/t.gguf" --prompt-ids 1 -n 1 $bad >/dev/null 2>"$tmp/bad.err"
  rc=$?
  opt=${bad%% *}
  check "generate $bad exits 2 (got $rc)" test "$rc" -eq 2
  check "generate $bad names $opt in one line" test "$(wc -l <"$tmp/bad.err")" -eq 1 -a -n "$(grep -F -- "$opt" "$tmp/bad.err")"
done
"$cli" bench -m "$tmp/t.gguf" --temp 0.7 >/dev/null 2>"$tmp/bench.err"
check "bench refuses --temp" test $? -eq 2
exit $fail
