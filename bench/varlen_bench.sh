#!/usr/bin/env bash
# Training on texts of varied length on the GPU (issue 16's packed training): a random
# bert-large-uncased, bf16, on N texts whose lengths are uniform in 16..512 tokens, one
# epoch. hone packs each batch's tokens (batches of at least 4096 tokens on CUDA); Trainer
# pads each batch to its longest. Each run a fresh process, in one call; process wall beside
# train_runtime.
# Usage: bench/varlen_bench.sh TOKENIZER_DIR [OUT_DIR]   (a WordPiece tokenizer with vocab.txt)
# Environment: N (default 2048), BATCHES (default "32 8"), HF_CONFIGS (default "bf16
#   bf16_fused"; empty for none).
set -uo pipefail
tokenizer=$(realpath "$1")
out=$(realpath -m "${2:-bench-out}")/varlen
cd "$(dirname "$0")/.." || exit 1
n=${N:-2048}
rm -rf "$out"
mkdir -p "$out"
IFS=, read -r gpu driver < <(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
echo "varlen_bench: $gpu, driver${driver}, commit $(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
. bench/build_bench.sh
build_bench_hone "$out"
python3 bench/varlen_data.py "$tokenizer/vocab.txt" "$n" 16 512 "$out/data.jsonl" || exit 1

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
for batch in ${BATCHES:-32 8}; do
  t0=$(now)
  build-bench/hone train --model_name_or_path bert-large-uncased --tokenizer_name "$tokenizer" \
    --train_file "$out/data.jsonl" --text_column text --max_seq_length 512 --per_device_train_batch_size "$batch" \
    --num_train_epochs 1 --save_strategy no --disable_tqdm --bf16 --tf32 --output_dir "$out/hone_bs$batch" \
    >"$out/hone_bs$batch.log" 2>&1
  echo "hone bs$batch: exit $?, process $(since "$t0") s: $(grep -oE "'train_(runtime|samples_per_second)': [0-9.]+" \
    "$out/hone_bs$batch.log" | tr '\n' ' ')$(grep -E "GPU memory|packed|tokens" "$out/hone_bs$batch.log" | head -3 | tr '\n' ' ')"
  for config in ${HF_CONFIGS-bf16 bf16_fused}; do
    t0=$(now)
    python3 bench/hf_varlen_bench.py "$out/data.jsonl" "$tokenizer" "$batch" "$config" >"$out/hf_bs${batch}_$config.log" 2>&1
    echo "Trainer bs$batch $config: process $(since "$t0") s: $(grep '^{' "$out/hf_bs${batch}_$config.log" | tail -1)"
  done
done
