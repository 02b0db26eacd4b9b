#!/usr/bin/env bash
# test_cmake_cuda_arch.sh: a build directory whose cache holds CUDA architectures the kernels cannot build for
# (nvcc's own default, 75, cached by a configure from before the project set its default) is configured for
# 90a;80-virtual instead, with a warning naming what was dropped; an explicit list keeps its usable entries.
# Needs nvcc (CI has it); without one there is no CUDA build to configure, and the test says so and passes.
set -u
src="${FM_SOURCE_DIR:?FM_SOURCE_DIR is not set}"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "SKIP: no nvcc on this machine, no CUDA build to configure"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail=0
arch_of() { sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$1/CMakeCache.txt"; }

cmake -S "$src" -B "$tmp/a" -DFLASHMAP_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=75 >"$tmp/a.log" 2>&1 || {
  echo "FAIL: configure with 75: $(tail -n 5 "$tmp/a.log")" >&2
  exit 1
}
[ "$(arch_of "$tmp/a")" = "90a;80-virtual" ] || { echo "FAIL: 75 -> '$(arch_of "$tmp/a")'" >&2; fail=1; }
grep -q "75 dropped" "$tmp/a.log" || { echo "FAIL: no warning naming 75" >&2; fail=1; }

cmake -S "$src" -B "$tmp/b" -DFLASHMAP_CUDA=ON "-DCMAKE_CUDA_ARCHITECTURES=75;86" >"$tmp/b.log" 2>&1 || {
  echo "FAIL: configure with 75;86: $(tail -n 5 "$tmp/b.log")" >&2
  exit 1
}
[ "$(arch_of "$tmp/b")" = "86" ] || { echo "FAIL: 75;86 -> '$(arch_of "$tmp/b")'" >&2; fail=1; }

[ "$fail" = 0 ] && echo "OK: architectures below 8.0 dropped, usable ones kept"
exit "$fail"
