#!/usr/bin/env bash
# Installs what flexshim needs to build and test, on Debian: the packages below (as root), and
# checks for the CUDA toolkit. Without root it names the missing packages and exits 1.
set -u
packages=(gcc make libinih-dev libjansson-dev libcmocka-dev valgrind binutils pkg-config)
cuda=${CUDA_HOME:-/usr/local/cuda}

missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "install-deps: installing ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        { apt-get update -qq && apt-get install -y -qq "${missing[@]}"; } >/tmp/flexshim-apt.log 2>&1 || {
            echo "install-deps: apt-get failed (log: /tmp/flexshim-apt.log)"; tail -5 /tmp/flexshim-apt.log; exit 1; }
    else
        echo "install-deps: missing Debian packages: ${missing[*]}"
        echo "install-deps: run as root: apt-get install ${missing[*]}"
        exit 1
    fi
fi
if [ ! -f "$cuda/include/cuda.h" ] || [ ! -f "$cuda/include/cupti.h" ]; then
    echo "install-deps: the CUDA toolkit headers are not in $cuda/include (cuda.h, cupti.h);"
    echo "install-deps: install the CUDA toolkit there, or set CUDA_HOME to where it is"
    exit 1
fi
echo "install-deps: everything is installed (CUDA toolkit: $cuda)"
