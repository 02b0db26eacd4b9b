#!/usr/bin/env bash
# device_pack.sh: what a device call carries, made on the workstation: the headers and libraries that
# scripts/device_run.sh builds against (the device machine has no -dev packages and no network), and the
# binaries of the builds a call compares (scripts/cuda_variant.sh NAME "..." made them), in one tarball.
# The first NAME is also packed as bench_cuda / test_cuda_parity, so the device runs it without building
# (a build there takes ~45 s of the call).
# usage: scripts/device_pack.sh N NAME [NAME...]   -> .devdeps/binsN.tar.xz, and the call's carry list
#   e.g. scripts/cuda_variant.sh k "" && scripts/device_pack.sh 18 k
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 N NAME [NAME...]" >&2; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
deps=$root/.devdeps n=$1
shift
case $n in *[!0-9]*) echo "device_pack: N must be a number" >&2; exit 2 ;; esac

# What device_run.sh's build includes and links: cJSON (shared, as Debian ships it), PCRE2 and utf8proc
# (static). A call without them fails on the device, after the machine's start has been paid.
lib=/usr/lib/$(gcc -print-multiarch)
for f in /usr/include/cjson/cJSON.h /usr/include/pcre2.h /usr/include/utf8proc.h "$lib/libcjson.so.1" \
         "$lib/libpcre2-8.a" "$lib/libutf8proc.a"; do
  [ -e "$f" ] || { echo "device_pack: no $f (apt-get install libcjson-dev libpcre2-dev libutf8proc-dev)" >&2; exit 1; }
done
mkdir -p "$deps/include/cjson" "$deps/lib" "$deps/bin"
cp /usr/include/cjson/cJSON.h "$deps/include/cjson/"
cp /usr/include/pcre2.h /usr/include/utf8proc.h "$deps/include/"
cp -L "$lib/libcjson.so.1" "$lib/libpcre2-8.a" "$lib/libutf8proc.a" "$deps/lib/"

files=()
for name in "$@"; do
  for t in bench_cuda test_cuda_parity; do
    [ -x "$deps/bin/${t}_$name" ] || { echo "device_pack: no .devdeps/bin/${t}_$name (scripts/cuda_variant.sh $name \"\")" >&2; exit 1; }
    files+=("bin/${t}_$name")
  done
done
cp "$deps/bin/bench_cuda_$1" "$deps/bin/bench_cuda"
cp "$deps/bin/test_cuda_parity_$1" "$deps/bin/test_cuda_parity"
tar -cJf "$deps/bins$n.tar.xz" -C "$deps" bin/bench_cuda bin/test_cuda_parity "${files[@]}"
echo "device_pack: .devdeps/bins$n.tar.xz ($(du -h "$deps/bins$n.tar.xz" | cut -f1): $*; bench_cuda = $1)"
echo "carry: [\".devdeps/bins$n.tar.xz\", \".devdeps/lib\", \".devdeps/include\", \".devdeps/call$n.sh\"]"
echo "on the device, first: tar -xJf .devdeps/bins$n.tar.xz -C .devdeps"
