#!/usr/bin/env bash
# device_run.sh: what runs on the GPU machine: builds the library subset the device harness needs (no CLI, no
# libcurl, no libcrypto: the machine has no network and may lack the -dev packages; cJSON / PCRE2 / utf8proc
# come from the carried .devdeps folder, which scripts/device_pack.sh fills) plus the CUDA backend, then runs
# the parity test, compute-sanitizer on a short run, the full-size benchmark, the persistent-kernel probe and
# the PyTorch peer.
# usage: scripts/device_run.sh [parity|sanitize|bench|long|probe|persist|mega|peer|llama-build|llama|ab]...
# mega: the persistent step kernel (src/cuda/cuda_megakernel.cu): plain steps with it off and on, alternated in
#   one process (FM_BENCH_MEGA_AB), and its phase clock (FM_BENCH_MEGA_TRACE: each product's time by the blocks'
#   loads; FM_BENCH_MEGA_BLOCKS=1 adds every block's phases and SM), under each line of MEGA_VARIANTS
#   (environment assignments, "-" for none), e.g. MEGA_VARIANTS=$'-\nFMC_MEGA_NS=6'.
# llama-build: llama.cpp's CUDA llama-bench from a carried .devdeps/llsrc.tar.xz (made on the workstation by
#   `bench/build_llamacpp.sh --from-pypi --pack .devdeps/llsrc.tar.xz /tmp/llsrc`) into /tmp/llb, which the
#   llama step then takes (about 330 s with 12 jobs beside a GPU run on the H200's 16 cores).
# ab: variants alternated process by process (a shared machine drifts; compare within a call):
#   AB_VARIANTS  variants, one a line, each a list of environment assignments ("-" for none) and at most one
#                bin=NAME, which runs the carried .devdeps/bin/bench_cuda_NAME / test_cuda_parity_NAME (a
#                build of another source: compile-time variants, made on the workstation by
#                scripts/cuda_variant.sh NAME "DEFINES") instead of bench_cuda / test_cuda_parity, e.g.
#                AB_VARIANTS=$'-\nFMC_Q8_PER_SM=3\nbin=new'
#   AB_ROUNDS    rounds over the variants (default 3)
#   AB_RUN       quick (default: FM_BENCH_QUICK=1, the plain step), target (FM_BENCH_TARGET_ONLY=1: kernels
#                alone, verify blocks), full (the whole bench_cuda, ~30 s: step, verify blocks, drafts, the
#                simulated 6.5 and 8), or parity (test_cuda_parity under each variant: counts of PASS / FAIL)
# Each step ends after STEP_TIMEOUT seconds (default 400; the device's calls end at 600): a kernel that hangs
# then costs the rest of the call, not all of it (a hung wait once took a whole call).
set -u
ROOT=$(cd "$(dirname "$0")/.." && pwd)
B=${BUILD:-/tmp/fmb}
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/fmwork}
mkdir -p "$B/obj" "$OUT" "$WORK"
DEPS="$ROOT/.devdeps"
CFLAGS="-O2 -std=c17 -D_GNU_SOURCE -Wall -I$ROOT/src -I$ROOT/include -I$DEPS/include"
ARCH="-gencode=arch=compute_90a,code=sm_90a"

build() {
  local srcs=() f
  while IFS= read -r f; do srcs+=("$f"); done < <(find "$ROOT/src" -name '*.c' ! -path '*/cuda/*' \
      ! -name fetch.c ! -name model_cache.c ! -name sha256.c ! -name engine.c ! -name engine_text.c | sort)
  compile_c() {
    local f=$1 o="$B/obj/$(echo "${1#$ROOT/}" | tr / _).o" extra=""
    case "$f" in
      *_avx2.c) extra="-mavx2 -mfma -mf16c -mbmi2" ;;
      *_avx512.c) extra="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16 -mfma -mf16c -mavx2 -mbmi2" ;;
      *_amx.c) extra="-mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c -mavx2 -mamx-tile -mamx-int8" ;;
    esac
    gcc $CFLAGS $extra -c "$f" -o "$o" || return 1
  }
  export -f compile_c; export B ROOT CFLAGS
  printf '%s\n' "${srcs[@]}" | xargs -P 16 -I{} bash -c 'compile_c {}' || return 1
  for f in "$ROOT"/src/cuda/*.cu; do
    nvcc -std=c++17 -O3 $ARCH -I"$ROOT/src" -I"$ROOT/include" -I"$DEPS/include" -c "$f" \
      -o "$B/obj/cuda_$(basename "$f").o" & done; wait
  LIBS="$B/obj/*.o $DEPS/lib/libcjson.so.1 $DEPS/lib/libpcre2-8.a $DEPS/lib/libutf8proc.a -lcudart -lpthread -lm -lstdc++"
  local CUDA_LIB CUDA_INC; CUDA_LIB=$(dirname "$(command -v nvcc)")/../lib64
  CUDA_INC=$(dirname "$(command -v nvcc)")/../include # bench_cuda marks its timed region for the profiler
  gcc $CFLAGS -I"$ROOT/tests" "$ROOT/tests/cuda/test_cuda_parity.c" $LIBS -L"$CUDA_LIB" -o "$B/test_cuda_parity" || return 1
  gcc $CFLAGS -I"$ROOT/tests" -I"$CUDA_INC" "$ROOT/bench/cuda/bench_cuda.c" $LIBS -L"$CUDA_LIB" -o "$B/bench_cuda" || return 1
  nvcc -std=c++17 -O3 $ARCH -I"$ROOT/src" "$ROOT/bench/cuda/persistent_probe.cu" -o "$B/persistent_probe" || return 1
}

export LD_LIBRARY_PATH="$DEPS/lib:${LD_LIBRARY_PATH:-}"
t0=$(date +%s)
# Binaries built on the workstation (same CUDA 13.0) are used when they start here; else build here.
if [ -x "$DEPS/bin/bench_cuda" ] && "$DEPS/bin/test_cuda_parity" 2>&1 | grep -q usage; then
  mkdir -p "$B"; cp "$DEPS"/bin/* "$B/"; echo "using the carried binaries"
else
  build 2>&1 | tail -30 | tee "$OUT/build.log"
  cp "$DEPS"/bin/bench_cuda_* "$DEPS"/bin/test_cuda_parity_* "$B/" 2>/dev/null # ab's bin=NAME variants
fi
[ -x "$B/bench_cuda" ] || { echo "build failed"; exit 1; }
echo "build done in $(( $(date +%s) - t0 )) s"
lim=${STEP_TIMEOUT:-400}
for step in "$@"; do
  case $step in
    parity) timeout "$lim" "$B/test_cuda_parity" "$WORK" 2>&1 | tee "$OUT/parity.log" ;;
    sanitize) timeout "$lim" compute-sanitizer --tool memcheck --leak-check no "$B/test_cuda_parity" \
                "$WORK/san" 2>&1 | tail -25 | tee "$OUT/sanitize.log" ;;
    bench) timeout "$lim" "$B/bench_cuda" "$WORK" 2>&1 | tee "$OUT/bench.log" ;;
    probe) timeout "$lim" "$B/persistent_probe" 5 2>&1 | tee "$OUT/probe.log" ;;
    # long prompts: the same benchmark after LONG_PROMPTS tokens (default 4096 and 16384), 128 new tokens
    long) for np in ${LONG_PROMPTS:-4096 16384}; do
            timeout "$lim" "$B/bench_cuda" "$WORK" "$np" 128 2>&1 | tee "$OUT/bench_$np.log" | grep "RESULT" \
              | grep -v "widths at"; done ;;
    # the step's products in one persistent launch against a graph of launches (cuda_q8_persist.cu)
    persist) FM_BENCH_PERSIST=1 timeout "$lim" "$B/bench_cuda" "$WORK" 2>&1 | grep "RESULT" \
               | tee "$OUT/persist.log" ;;
    mega) while IFS= read -r v; do
            [ -n "$v" ] || continue
            envs=(); [ "$v" = "-" ] || read -r -a envs <<<"$v"
            echo "-- [$v]"
            env "${envs[@]}" FM_BENCH_MEGA_AB=1 timeout 120 "$B/bench_cuda" "$WORK" 2>&1 | grep -E "RESULT (round|pers)"
            env "${envs[@]}" FM_BENCH_MEGA_TRACE=1 timeout 120 "$B/bench_cuda" "$WORK" 2>&1 | grep "RESULT mega"
          done <<<"${MEGA_VARIANTS:--}" | tee "$OUT/mega.log" ;;
    peer) PYTHONUNBUFFERED=1 timeout "$lim" python3 "$ROOT/bench/cuda/torch_peer.py" 2>&1 | tail -15 \
            | tee "$OUT/peer.log" ;;
    llama-build) if [ -f "$DEPS/llsrc.tar.xz" ]; then
                   rm -rf /tmp/llsrc && tar -xJf "$DEPS/llsrc.tar.xz" -C /tmp &&
                     JOBS=${LLAMA_JOBS:-16} timeout "$lim" bash "$ROOT/bench/build_llamacpp.sh" --cuda /tmp/llsrc \
                       /tmp/llb 2>&1 | tail -3 | tee "$OUT/llama_build.log"
                 else echo "llama-build: no $DEPS/llsrc.tar.xz (see the usage above)"; fi ;;
    # llama.cpp's CUDA build on the GGUF that bench synthesized (run bench first): prefill 512 and 128 decode
    # steps after a 512-token context, as bench_cuda measures ours. LLAMA_BENCH, or a carried
    # .devdeps/bin/llama-bench, built by `bench/build_llamacpp.sh --cuda SRC_DIR` (here or on the workstation),
    # or llama-build's.
    llama) LB=${LLAMA_BENCH:-$DEPS/bin/llama-bench}
           [ -x "$LB" ] || LB=/tmp/llb/bin/llama-bench # llama-build's
           if [ -x "$LB" ] && [ -f "$WORK/qwen3-4b-q8_0.gguf" ]; then
             "$LB" -m "$WORK/qwen3-4b-q8_0.gguf" -ngl 99 -fa 0,1 -p 512 -n 0 -r 5 2>&1 | tee "$OUT/llama.log"
             "$LB" -m "$WORK/qwen3-4b-q8_0.gguf" -ngl 99 -fa 0,1 -p 0 -n 128 -d 512 -r 5 2>&1 \
               | tee -a "$OUT/llama.log"
           else echo "llama: no llama-bench ($LB) or no synthesized GGUF (run bench first)"; fi ;;
    ab) FM_BENCH_QUICK=1 timeout "$lim" "$B/bench_cuda" "$WORK" >/dev/null 2>&1 # the pair into WORK, once
        full_lines='plain step \(graph \+|verify\(|draft \(block 16, (16|7) out, graph on\)'
        full_lines+='|simulated acceptance (6.5|8.0), verify adaptive   |RESULT kernel lm_head|adaptive time at (6.5|8.0)|halves back to back'
        for round in $(seq "${AB_ROUNDS:-3}"); do
          while IFS= read -r v; do
            [ -n "$v" ] || continue
            words=(); envs=(); bin=""; [ "$v" = "-" ] || read -r -a words <<<"$v"
            for w in "${words[@]}"; do case $w in bin=*) bin=_${w#bin=} ;; *) envs+=("$w") ;; esac; done
            echo "-- round $round [$v]"
            [ -x "$B/bench_cuda$bin" ] || { echo "ab: no $B/bench_cuda$bin (carry it in .devdeps/bin)"; continue; }
            case ${AB_RUN:-quick} in
              quick) env "${envs[@]}" FM_BENCH_QUICK=1 timeout 120 "$B/bench_cuda$bin" "$WORK" 2>&1 \
                       | grep "plain step (graphs on, PDL on)" ;;
              target) env "${envs[@]}" FM_BENCH_TARGET_ONLY=1 timeout 200 "$B/bench_cuda$bin" "$WORK" 2>&1 \
                        | grep -E "plain step \(graph \+|RESULT kernel .*T=  [18]:|verify\(" ;;
              full) env "${envs[@]}" timeout 200 "$B/bench_cuda$bin" "$WORK" 2>&1 | grep -E "$full_lines" ;;
              parity) env "${envs[@]}" timeout "$lim" "$B/test_cuda_parity$bin" "$WORK" >"$OUT/ab_parity.log" 2>&1
                      echo "PASS $(grep -c '^PASS' "$OUT/ab_parity.log"), FAIL $(grep -c '^FAIL' "$OUT/ab_parity.log")" ;;
              *) echo "ab: AB_RUN is quick, target, full or parity" ;;
            esac
          done <<<"${AB_VARIANTS:--}"
        done 2>&1 | tee "$OUT/ab.log" ;;
  esac
  echo "== $step done at $(( $(date +%s) - t0 )) s"
done
