#!/usr/bin/env bash
# `hone profile` of bert-large at the seed's and the steady-state batch: the operation
# anatomy tables printed, each profile's files in OUT_DIR/profile/<name>/.
# Usage: bench/profile_bench.sh [OUT_DIR]
# Environment: PROFILES (default "bf16_bs4 bf16_bs32 bf16_bs32_gc"): <precision>_bs<batch>[_gc]
set -uo pipefail
out=$(realpath -m "${1:-bench-out}")/profile
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$out"
. bench/build_bench.sh
build_bench_hone "$out"
for name in ${PROFILES:-bf16_bs4 bf16_bs32 bf16_bs32_gc}; do
  prec=${name%%_*}
  batch=$(echo "$name" | grep -oE 'bs[0-9]+' | tr -d bs)
  gc=; [[ $name == *_gc ]] && gc=--gradient_checkpointing
  build-bench/hone profile --model_name_or_path bert-large-uncased --dataset "synthetic:$((batch * 16))x512" \
    --per_device_train_batch_size "$batch" --"$prec" --tf32 $gc --output_dir "$out/$name" >"$out/$name.log" 2>&1
  rc=$?
  echo "== $name: exit $rc"
  sed -n '/^operation anatomy/,$p' "$out/$name.log"
  [ $rc -eq 0 ] || tail -5 "$out/$name.log"
done
