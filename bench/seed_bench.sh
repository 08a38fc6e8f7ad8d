#!/usr/bin/env bash
# The seed experiment (bert-large-uncased, 512 x 512 synthetic tokens, batch 4, one epoch)
# with hone and with Hugging Face Trainer, in one call on one GPU, in fp32 and tf32.
# Usage: bench/seed_bench.sh HF_TRAINER_BENCH.py [OUT_DIR]
#   HF_TRAINER_BENCH.py is the peer's script (shared/anchors/hf_trainer_bench.py), carried
#   to the GPU machine beside the tree; it is not part of hone.
set -euo pipefail
hf_script=$1
out=${2:-bench-out}
mkdir -p "$out"
cmake -S . -B build-bench -G Ninja -DCMAKE_BUILD_TYPE=Release "-DCMAKE_CUDA_ARCHITECTURES=$(bash tools/cuda-arch.sh)" \
  ${HONE_CMAKE_FLAGS:-} >/dev/null
ninja -C build-bench hone >/dev/null
for precision in fp32 tf32; do
  flag=""
  [ "$precision" = tf32 ] && flag="--tf32"
  build-bench/hone train --model_name_or_path bert-large-uncased --dataset synthetic:512x512 --save_strategy no \
    --per_device_train_batch_size 4 --num_train_epochs 1 --disable_tqdm --output_dir "$out/hone_$precision" \
    $flag >"$out/hone_$precision.log" 2>&1 || { tail -20 "$out/hone_$precision.log"; exit 1; }
  rm -f "$out/hone_$precision/model.safetensors"  # 1.3 GB that the table does not need
done
rm -f "$out/hf.jsonl"
python3 "$hf_script" all "$out/hf.jsonl" vanilla_bs4 tf32_bs4 >/dev/null
python3 bench/table.py "$out"
