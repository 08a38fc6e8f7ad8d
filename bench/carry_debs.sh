#!/usr/bin/env bash
# Downloads, here, the Debian packages that a GPU machine's image may lack into .carry/debs
# (git-ignored), for a device call that carries .carry: bench/build_bench.sh unpacks them
# there. utf8proc (required), and cpp-httplib with what its pkg-config file names (hone serve).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .carry/debs
cd .carry/debs
httplib_runtime=$(apt-cache depends libcpp-httplib-dev | awk '/Depends: libcpp-httplib[0-9]/ {print $2; exit}')
apt-get download libutf8proc-dev libutf8proc2 libcpp-httplib-dev ${httplib_runtime:+"$httplib_runtime"} \
  libssl-dev libbrotli-dev zlib1g-dev pkgconf pkgconf-bin libpkgconf3
ls
