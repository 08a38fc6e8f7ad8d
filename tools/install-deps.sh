#!/usr/bin/env bash
# Installs hone's build dependencies from Debian/Ubuntu packages, only those missing.
# CUDA, when present, comes from the toolkit in /usr/local/cuda, not from here.
set -euo pipefail
packages=(cmake ninja-build g++ make pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev
          libopenblas-dev libutf8proc-dev)
if ! command -v dpkg-query >/dev/null; then
  echo "install-deps: no dpkg here; install these yourself: ${packages[*]}" >&2
  exit 0
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
