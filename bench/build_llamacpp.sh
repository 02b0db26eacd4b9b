#!/usr/bin/env bash
# Builds llama.cpp's CPU tools (llama-bench, llama-simple; llama-cli with --with-cli) from a source tree that
# is NOT part of this repository, for `flashmap bench` to measure beside our engine in the same run.
#
#   bench/build_llamacpp.sh SRC_DIR [BUILD_DIR] [--with-cli]
#       SRC_DIR: a llama.cpp checkout (git clone, git worktree, or an unpacked archive).
#   bench/build_llamacpp.sh --cuda SRC_DIR [BUILD_DIR]
#       llama-bench with the CUDA backend instead (for scripts/device_run.sh llama: copy the binary into
#       .devdeps/bin), for CUDA_ARCH (default 90a, the H100 / H200), GGML_NATIVE=OFF (the GPU machine's CPU is
#       not this one), static; BUILD_DIR defaults to SRC_DIR/build-flashmap-cuda.
#   bench/build_llamacpp.sh --from-pypi SRC_DIR [BUILD_DIR] [--with-cli]
#       First unpacks the llama.cpp that PyPI's llama-cpp-python sdist vendors into SRC_DIR (pip download;
#       used where GitHub cannot be reached) and records the upstream commit its CHANGELOG names.
#   bench/build_llamacpp.sh [--from-pypi] --pack TARBALL SRC_DIR
#       Builds nothing: writes SRC_DIR (unpacked first with --from-pypi) without what no build reads (models,
#       docs, media, benches, gguf-py, conversion, .github: 176 -> 8 MB) as an xz tarball whose top folder is
#       llsrc, small enough to carry to the GPU machine, which has no network (scripts/device_run.sh
#       llama-build unpacks and builds it there).
#
# Release, GGML_NATIVE=ON (the build machine's ISA: AVX2 here, AVX-512 where present), CPU only, -j${JOBS:-2}.
# BUILD_DIR defaults to SRC_DIR/build-flashmap. Prints the llama.cpp commit built and, last, the path of
# llama-bench (on a line "llama-bench: PATH"). Invariant: nothing is written inside the flashmap repository.
set -euo pipefail

usage() {
  echo "usage: $0 [--from-pypi] [--cuda] SRC_DIR [BUILD_DIR] [--with-cli]" >&2
  echo "       $0 [--from-pypi] --pack TARBALL SRC_DIR" >&2
  exit 2
}

from_pypi=0
with_cli=0
cuda=0
pack=""
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --from-pypi) from_pypi=1 ;;
    --with-cli) with_cli=1 ;;
    --cuda) cuda=1 ;;
    --pack) [ $# -ge 2 ] || usage; pack="$2"; shift ;;
    -h|--help) usage ;;
    -*) echo "$0: unknown option $1" >&2; usage ;;
    *) args+=("$1") ;;
  esac
  shift
done
[ "${#args[@]}" -ge 1 ] || usage
src="${args[0]}"
# (an if, not `[ ] && echo` in $(...): under set -e a false test there ended the script without a word)
suffix=""
if [ "$cuda" = 1 ]; then suffix="-cuda"; fi
build="${args[1]:-$src/build-flashmap$suffix}"
jobs="${JOBS:-2}"

if [ "$from_pypi" = 1 ]; then
  if [ ! -f "$src/CMakeLists.txt" ]; then
    tmp="$(mktemp -d)"
    echo "build_llamacpp: downloading the llama-cpp-python sdist (vendors llama.cpp) with pip ..." >&2
    pip download --no-deps --no-binary :all: "${LLAMA_CPP_PYTHON_SPEC:-llama-cpp-python}" -d "$tmp" >&2
    tarball="$(ls "$tmp"/llama_cpp_python-*.tar.gz | head -n1)"
    tar -xzf "$tarball" -C "$tmp"
    pkg="$(basename "$tarball" .tar.gz)"
    mkdir -p "$src"
    cp -r "$tmp/$pkg/vendor/llama.cpp/." "$src/"
    # The sdist has no .git; its CHANGELOG's newest "update llama.cpp to ggml-org/llama.cpp@SHA" line is
    # the vendored commit.
    sha="$(grep -o -m1 'ggml-org/llama.cpp@[0-9a-f]\+' "$tmp/$pkg/CHANGELOG.md" | cut -d@ -f2 || true)"
    echo "${sha:-unknown} (vendored by ${pkg//_/-} from PyPI)" > "$src/.flashmap-llama-commit"
    rm -rf "$tmp"
  fi
fi

[ -f "$src/CMakeLists.txt" ] && [ -d "$src/ggml" ] || {
  echo "$0: $src: not a llama.cpp source tree (no CMakeLists.txt / ggml/)" >&2; exit 1; }

if [ -n "$pack" ]; then
  stage="$(mktemp -d)"
  cp -r "$src/." "$stage/llsrc"
  (cd "$stage/llsrc" && rm -rf .git models docs media benches gguf-py conversion .github && mkdir models)
  # (an unpacked sdist brought its marker along; a checkout's commit goes into one, as .git stays behind)
  head="$( [ -e "$src/.git" ] && git -C "$src" rev-parse HEAD 2>/dev/null || true)"
  if [ -n "$head" ]; then echo "$head" > "$stage/llsrc/.flashmap-llama-commit"; fi
  tar -cJf "$pack" -C "$stage" llsrc
  rm -rf "$stage"
  echo "llama.cpp source for the GPU machine: $pack ($(du -h "$pack" | cut -f1))"
  exit 0
fi

# Which commit: a git checkout knows it; an unpacked archive may carry our marker file.
if git -C "$src" rev-parse --git-dir >/dev/null 2>&1; then
  commit="$(git -C "$src" rev-parse HEAD)"
  commit_short="$(git -C "$src" rev-parse --short=9 HEAD)"
elif [ -f "$src/.flashmap-llama-commit" ]; then
  commit="$(cat "$src/.flashmap-llama-commit")"
  commit_short="${commit%% *}"
else
  commit="unknown (not a git checkout)"
  commit_short="unknown"
fi

if [ "$cuda" = 1 ]; then
  cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90a}" -DGGML_CUDA_FA_ALL_QUANTS=OFF -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_COMMIT="$commit_short" >&2
  cmake --build "$build" --config Release -j "$jobs" --target llama-bench >&2
  echo "llama.cpp commit: $commit"
  echo "llama.cpp build: $build (Release, CUDA sm_${CUDA_ARCH:-90a}, static)"
  echo "llama-bench: $build/bin/llama-bench"
  exit 0
fi

targets=(llama-bench llama-simple)
server=OFF
if [ "$with_cli" = 1 ]; then targets+=(llama-cli); server=ON; fi

cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DGGML_METAL=OFF \
  -DGGML_VULKAN=OFF -DGGML_OPENMP=ON -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER="$server" -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_COMMIT="$commit_short" >&2
cmake --build "$build" --config Release -j "$jobs" --target "${targets[@]}" >&2

echo "llama.cpp commit: $commit"
echo "llama.cpp build: $build (Release, GGML_NATIVE=ON, CPU only)"
echo "llama-bench: $build/bin/llama-bench"
