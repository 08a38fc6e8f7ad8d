#!/usr/bin/env bash
# Convergence of the memory methods on real text: examples/debian-sections fine-tuned with
# each optimizer (and with gradient checkpointing) from the same weights, seed and schedule,
# then test accuracy. Usage: bench/convergence.sh BUILD OUT
# Environment: CONV_MODEL (default bert-mini), CONV_RUNS (names below, default all),
# CONV_FLAGS (more flags for every run, e.g. --device cpu).
set -uo pipefail
build=$1
out=$2/convergence
data=examples/debian-sections
model=${CONV_MODEL:-bert-mini}
mkdir -p "$out"
declare -A runs=(
  [adamw_torch]="--optim adamw_torch"
  [adafactor]="--optim adafactor"
  [adamw_bnb_8bit]="--optim adamw_bnb_8bit"
  [lion_8bit]="--optim lion_8bit --learning_rate 1e-4"
  [checkpointing]="--optim adamw_torch --gradient_checkpointing"
  [checkpointing_selective]="--optim adamw_torch --gradient_checkpointing --gradient_checkpointing_policy selective"
)
names=${CONV_RUNS:-adamw_torch adafactor adamw_bnb_8bit lion_8bit checkpointing checkpointing_selective}
printf "| run | flags | test accuracy | test loss | train_runtime s |\n|---|---|---|---|---|\n" >"$out/table.md"
for name in $names; do
  rm -rf "$out/$name"
  # The test split is the evaluation set: eval_accuracy after the last epoch is test accuracy.
  $build/hone train --model_name_or_path "$model" --tokenizer_name tests/fixtures/tokenizer/minilm \
    --train_file $data/train.jsonl --validation_file $data/test.jsonl --text_column text --max_seq_length 128 \
    --per_device_train_batch_size 32 --learning_rate 1e-4 --num_train_epochs 3 --seed 42 --do_eval \
    --save_strategy no --disable_tqdm --output_dir "$out/$name" ${runs[$name]} ${CONV_FLAGS:-} \
    >"$out/$name.log" 2>&1 || { echo "$name failed:"; tail -5 "$out/$name.log"; continue; }
  python3 - "$out/$name" "$name" "${runs[$name]}" >>"$out/table.md" <<'PY'
import json, sys
d, name, flags = sys.argv[1:]
ev = json.load(open(f"{d}/eval_results.json"))
tr = json.load(open(f"{d}/train_results.json"))
print(f"| {name} | `{flags}` | {ev['eval_accuracy']:.4f} | {ev['eval_loss']:.4f} | {tr['train_runtime']:.1f} |")
PY
done
cat "$out/table.md"
