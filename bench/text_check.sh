#!/usr/bin/env bash
# Text data on the GPU: fine-tune on examples/debian-sections with evaluation and
# checkpoints, predict the test split, and load the saved directory in transformers
# (tools/hf_roundtrip.py, on the GPU when torch sees one). Usage: bench/text_check.sh BUILD OUT
set -uo pipefail
build=$1
out=$2
data=examples/debian-sections
model=${TEXT_MODEL:-bert-mini}
tok=${TEXT_TOKENIZER:-tests/fixtures/tokenizer/minilm}
$build/hone train --model_name_or_path "$model" --tokenizer_name "$tok" \
  --train_file $data/train.jsonl --validation_file $data/validation.jsonl --text_column text \
  --max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 1e-4 --num_train_epochs 3 \
  --eval_strategy epoch --save_strategy epoch --save_total_limit 1 --load_best_model_at_end \
  --metric_for_best_model accuracy --do_eval --dataloader_num_workers 2 --report_to tensorboard \
  --disable_tqdm --output_dir "$out/text" >"$out/text_train.log" 2>&1
echo "text train exit $?"
grep -E "^\{'eval_loss'|train_runtime|error|loaded the best" "$out/text_train.log" | tail -6
$build/hone predict --model_name_or_path "$out/text" --test_file $data/test.jsonl --text_column text \
  --max_seq_length 128 --per_device_eval_batch_size 64 --output_dir "$out/text" 2>&1 | tail -2
python3 tools/hf_roundtrip.py "$out/text" $data/test.jsonl "$out/text/predictions.jsonl" --text_column text \
  --max_length 128 --atol 1e-4 2>&1 | grep -vi "loading weights" | tail -6
