#!/usr/bin/env bash
# cuda_variant.sh: a compile-time variant of one CUDA source, for `scripts/device_run.sh ab` (bin=NAME).
# Compiles FILE's object in the CMake build with extra DEFINES (CMake's own command line for it, from
# compile_commands.json), links bench_cuda and test_cuda_parity, copies them stripped to
# .devdeps/bin/bench_cuda_NAME and test_cuda_parity_NAME, and marks FILE so that the next build compiles the
# default again. Build HEAD's own the same way (DEFINES ""), so that a variant is compared with a binary of
# the same build, not with its own switches off (docs/GOTCHAS.md).
# usage: scripts/cuda_variant.sh NAME "DEFINES" [FILE]   (FILE: default src/cuda/cuda_megakernel.cu)
#   e.g. scripts/cuda_variant.sh h "" && scripts/cuda_variant.sh floor "-DFM_MK_NOCOPY=1"
# BUILD: the CMake build folder (default build/, configured with CUDA on).
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 NAME \"DEFINES\" [FILE]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
name=$1 defines=$2 file=$(realpath "${3:-$root/src/cuda/cuda_megakernel.cu}")
build=$(realpath "${BUILD:-$root/build}")
case $name in *[!A-Za-z0-9_]*|"") echo "cuda_variant: NAME must be letters, digits or _" >&2; exit 2 ;; esac
[ -f "$file" ] || { echo "cuda_variant: no such file: $file" >&2; exit 2; }

cmake -S "$root" -B "$build" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON >/dev/null
# CMake's command for FILE, with the defines after the compiler's name
cmd=$(python3 - "$build/compile_commands.json" "$file" "$defines" <<'EOF'
import json, shlex, sys
db, path, defines = sys.argv[1:4]
for e in json.load(open(db)):
    if e["file"] == path:
        args = shlex.split(e["command"])
        print("cd " + shlex.quote(e["directory"]) + " && " + shlex.join(args[:1] + shlex.split(defines) + args[1:]))
        break
else:
    sys.exit("cuda_variant: " + path + " is not in the build's compile commands (is CUDA on?)")
EOF
)
cmake --build "$build" -j"$(nproc)" --target bench_cuda test_cuda_parity >/dev/null # the rest up to date
trap 'touch "$file"' EXIT # whatever happens next, the next build compiles the default object again
bash -c "$cmd"
cmake --build "$build" -j"$(nproc)" --target bench_cuda test_cuda_parity >/dev/null
mkdir -p "$root/.devdeps/bin"
for t in bench_cuda test_cuda_parity; do strip -o "$root/.devdeps/bin/${t}_$name" "$build/$t"; done
echo "cuda_variant: .devdeps/bin/bench_cuda_$name, test_cuda_parity_$name (${defines:-no defines})"
