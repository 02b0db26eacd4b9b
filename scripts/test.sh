#!/usr/bin/env bash
# test.sh: builds flashmap and runs the whole test suite, twice: a release build, then under AddressSanitizer
# + UndefinedBehaviorSanitizer. Also compiles the CUDA backend when nvcc is present (it runs only on a GPU).
# Usage: scripts/test.sh            (from anywhere; builds in build/ and build-asan/ at the repository root)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/install_deps.sh
jobs=$(nproc)

echo "== clang-format check"
git ls-files '*.c' '*.h' '*.cu' '*.cuh' | xargs -r clang-format --dry-run -Werror

echo "== release build + tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

echo "== ASan + UBSan build (clang 14) + tests"
CC=clang-14 cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DFLASHMAP_SANITIZE=ON -DFLASHMAP_CUDA=OFF >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs"
