#!/usr/bin/env bash
# Each model family on the seed's workload (512 random sequences of 512 tokens, batch 4, one
# epoch, bf16): hone and Trainer in one call, each run a fresh process, with the process wall
# time and NVML's memory beside train_runtime. Issue 16's ratios to Trainer.
# Then ModernBERT-large at long sequences (the ModernBERT runs below), each the same number
# of tokens (512 x 1024 = 64 x 8192): hone and Trainer with the best attention Trainer has
# there (flash_attention_2 when the flash_attn package imports, else sdpa; its JSON line says
# which).
# Usage: bench/families_bench.sh [OUT_DIR]
# Environment: MODELS (default: roberta-large xlm-roberta-large distilbert-base-uncased
#   electra-large-discriminator; " " for none), HF_CONFIGS (default: bf16_bs4 bf16_fused_bs4),
#   SKIP_HF=1, HONE_COMMIT as in memory_bench.sh; MODERNBERT_RUNS, space-separated
#   SEQ:BATCH:SAMPLES (default "1024:8:512 8192:1:64"; empty for none), MODERNBERT_HF_CONFIGS
#   (default: bf16 bf16_fused, with the run's batch size).
# Results in OUT_DIR/families: hone_<model>.log/.wall/train_results.json, hf_<model>_<config>.json;
# ModernBERT's as hone_modernbert-large_<seq>.*, hf_modernbert-large_<seq>_<config>.log.
set -uo pipefail
out=$(realpath -m "${1:-bench-out}")/families
cd "$(dirname "$0")/.." || exit 1
models=${MODELS:-roberta-large xlm-roberta-large distilbert-base-uncased electra-large-discriminator}
hf_configs=${HF_CONFIGS:-bf16_bs4 bf16_fused_bs4}
modernbert_runs=${MODERNBERT_RUNS-1024:8:512 8192:1:64}
modernbert_hf_configs=${MODERNBERT_HF_CONFIGS:-bf16 bf16_fused}
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
  grep -E "train_samples_per_second|occupied: .*after training|^process:" "$out/hone_$model.log"
  [ $rc -eq 0 ] || tail -5 "$out/hone_$model.log"
  [ -n "${SKIP_HF:-}" ] && continue
  for config in $hf_configs; do
    t0=$(now)
    python3 bench/hf_family_bench.py "$model" "$config" >"$out/hf_${model}_$config.log" 2>&1
    echo "Trainer $model $config: wall $(since "$t0") s: $(grep -h '^{' "$out/hf_${model}_$config.log" | tail -1)"
  done
done

# ModernBERT-large (28 layers, hidden 1024, a 128-token band in two of three layers) as a
# user would fine-tune it on long inputs: batch 8 at 1024 tokens, batch 1 at 8192, bf16.
for run in $modernbert_runs; do
  IFS=: read -r seq bs n <<<"$run"
  model=modernbert-large
  tag=${model}_$seq
  t0=$(now)
  build-bench/hone train --model_name_or_path $model --max_seq_length "$seq" --dataset "synthetic:${n}x$seq" \
    --per_device_train_batch_size "$bs" --num_train_epochs 1 --save_strategy no --disable_tqdm --bf16 --tf32 \
    --output_dir "$out/hone_$tag" >"$out/hone_$tag.log" 2>&1
  rc=$?
  echo "$(since "$t0")" >"$out/hone_$tag.wall"
  rm -f "$out/hone_$tag/model.safetensors"
  echo "hone $model seq $seq bs $bs x $n: exit $rc, wall $(cat "$out/hone_$tag.wall") s"
  grep -E "train_samples_per_second|occupied: .*after training|^process:" "$out/hone_$tag.log"
  [ $rc -eq 0 ] || tail -5 "$out/hone_$tag.log"
  [ -n "${SKIP_HF:-}" ] && continue
  for config in $modernbert_hf_configs; do
    t0=$(now)
    python3 bench/hf_family_bench.py $model "$config" --seq "$seq" --batch_size "$bs" --n_samples "$n" \
      >"$out/hf_${tag}_$config.log" 2>&1
    echo "Trainer $model seq $seq bs $bs $config: wall $(since "$t0") s: $(grep -h '^{"' "$out/hf_${tag}_$config.log" | tail -1)"
    grep -h "^hf_family_bench:" "$out/hf_${tag}_$config.log"
  done
done
