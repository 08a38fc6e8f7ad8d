#!/usr/bin/env bash
# One call on the GPU machine: build for its GPU, run every test (CPU and GPU labels),
# then the seed benchmark against HF Trainer, and with HONE_MIXED_BENCH=1 the mixed-precision one
# (bench/mixed_bench.sh; its CONFIGS picks the configurations). Usage: bench/device_check.sh HF_TRAINER_BENCH.py
set -uo pipefail
hf_script=$1
out=$(realpath -m "${OUT:-bench-out}")
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
# utf8proc, where the image lacks it: Debian packages carried in .carry/debs, unpacked.
if [ ! -e /usr/include/utf8proc.h ] && ls .carry/debs/*.deb >/dev/null 2>&1; then
  for d in .carry/debs/*.deb; do dpkg -x "$d" /tmp/deps; done
  HONE_CMAKE_FLAGS="${HONE_CMAKE_FLAGS:-} -DCMAKE_PREFIX_PATH=/tmp/deps/usr"
fi
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$(bash tools/cuda-arch.sh)" \
  ${HONE_CMAKE_FLAGS:-} >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
ninja -C build-bench >"$out/build.log" 2>&1 || { grep -E "error|Error" "$out/build.log" | head -40; exit 1; }
(cd build-bench && ctest --output-on-failure >"$out/ctest.log" 2>&1)
grep -E "tests passed|tests failed|\(Failed\)|\(SEGFAULT\)|\(Timeout\)" "$out/ctest.log" | head -30
build-bench/tests/gpu/hone_gpu_tests --gtest_filter='Fixtures*' 2>&1 | grep -E "^\[bert_|Failure|Expected|actual|^bert|^class" | head -30
bash bench/text_check.sh build-bench "$out"
bash bench/seed_bench.sh "$hf_script" "$out"
if [ -n "${HONE_MIXED_BENCH:-}" ]; then bash bench/mixed_bench.sh "$hf_script" "$out"; fi
