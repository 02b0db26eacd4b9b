# cli_pair.sh: what the CLI test scripts share (sourced, not run): $cli, a temporary folder $tmp removed at
# exit, a tiny synthetic target $tmp/t.gguf with its drafter in $tmp/d, and `check DESCRIPTION COMMAND...`,
# which records a failure in $fail (the script ends with `exit $fail`).
cli="${FM_CLI:?FM_CLI is not set}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
check() {
  if "${@:2}"; then :; else echo "FAIL: $1" >&2; fail=1; fi
}

"$cli" synth target --preset tiny --layers 4 -q -o "$tmp/t.gguf" || { echo "FAIL: synth target" >&2; exit 1; }
mkdir -p "$tmp/d"
"$cli" synth drafter -m "$tmp/t.gguf" -o "$tmp/d/model.safetensors" --dim 64 --layers 2 --heads 4 --ffn 128 \
  --target-layers 1,2 >/dev/null 2>&1 || { echo "FAIL: synth drafter" >&2; exit 1; }
