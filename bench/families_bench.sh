#!/usr/bin/env bash
# Each model family on the seed's workload (512 random sequences of 512 tokens, batch 4, one
# epoch, bf16): hone and Trainer in one call, each run a fresh process, with the process wall
# time and NVML's memory beside train_runtime. Issue 16's ratios to Trainer.
# Usage: bench/families_bench.sh [OUT_DIR]
# Environment: MODELS (default: roberta-large xlm-roberta-large distilbert-base-uncased
#   electra-large-discriminator), HF_CONFIGS (default: bf16_bs4 bf16_fused_bs4), SKIP_HF=1,
#   HONE_COMMIT as in memory_bench.sh.
# Results in OUT_DIR/families: hone_<model>.log/.wall/train_results.json, hf_<model>_<config>.json.
set -uo pipefail
out=$(realpath -m "${1:-bench-out}")/families
cd "$(dirname "$0")/.." || exit 1
models=${MODELS:-roberta-large xlm-roberta-large distilbert-base-uncased electra-large-discriminator}
hf_configs=${HF_CONFIGS:-bf16_bs4 bf16_fused_bs4}
rm -rf "$out"
mkdir -p "$out"
commit=${HONE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
IFS=, read -r gpu driver < <(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
echo "families_bench: $gpu, driver${driver}, commit $commit"

. bench/build_bench.sh
build_bench_hone "$out"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
for model in $models; do
  t0=$(now)
  build-bench/hone train --model_name_or_path "$model" --dataset synthetic:512x512 --per_device_train_batch_size 4 \
    --num_train_epochs 1 --save_strategy no --disable_tqdm --bf16 --tf32 --output_dir "$out/hone_$model" \
    >"$out/hone_$model.log" 2>&1
  rc=$?
  echo "$(since "$t0")" >"$out/hone_$model.wall"
  rm -f "$out/hone_$model/model.safetensors"
  echo "hone $model: exit $rc, wall $(cat "$out/hone_$model.wall") s"
  grep -E "train_samples_per_second|GPU memory occupied|^process:" "$out/hone_$model.log" | head -4
  [ $rc -eq 0 ] || tail -5 "$out/hone_$model.log"
  [ -n "${SKIP_HF:-}" ] && continue
  for config in $hf_configs; do
    t0=$(now)
    python3 bench/hf_family_bench.py "$model" "$config" >"$out/hf_${model}_$config.log" 2>&1
    echo "Trainer $model $config: wall $(since "$t0") s: $(grep -h '^{' "$out/hf_${model}_$config.log" | tail -1)"
  done
done
