#!/usr/bin/env bash
# install_deps.sh: installs what building and testing flashmap needs on Debian 12, only what is missing.
# Build: a C compiler, CMake, pkg-config and the libraries below. Tests: python3 (standard library only).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libpcre2-dev libutf8proc-dev libcjson-dev libcurl4-openssl-dev libssl-dev
      libmicrohttpd-dev clang-14 libclang-rt-14-dev clang-format python3)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install_deps: installing ${missing[*]}" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Python test helpers (tests/test_synth_gguf_py.py cross-checks synthetic GGUFs with gguf-py and numpy).
if ! python3 -c "import numpy, gguf" 2>/dev/null; then
    echo "install_deps: installing numpy and gguf (pip)" >&2
    python3 -m pip --version >/dev/null 2>&1 || {
        SUDO=""
        [ "$(id -u)" -ne 0 ] && SUDO="sudo"
        $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq python3-pip >/dev/null
    }
    # Debian's own python3 refuses system-wide pip installs (PEP 668) unless told otherwise.
    python3 -m pip install -q numpy gguf 2>/dev/null ||
        python3 -m pip install -q --break-system-packages numpy gguf
fi
