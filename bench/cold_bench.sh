#!/usr/bin/env bash
# The seed run as a user runs it (bert-large-uncased, 512 samples of 512 tokens, batch 4, one
# epoch, --bf16 --tf32), hone and HF Trainer in one call: each run a fresh process, the first
# run on the machine reported apart from later ones, the process wall time beside
# train_runtime. Run it first in a call on a fresh machine (nothing built or run there
# before) so that the first run is a user's first.
# Usage: bench/cold_bench.sh HF_TRAINER_BENCH.py [OUT_DIR]
# Environment:
#   RUNS      which runs, in order (default all, this order):
#             hone_bf16_first hone_bf16_second hone_fp16_first cudnn_bf16_first cudnn_bf16_second
#             hone_bf16_steady (4096 samples) hf_bf16_bs4 hf_bf16_fused_bs4
#             hone_*: hone's attention kernels; cudnn_*: HONE_ATTENTION=cudnn; hf_<name>: Trainer's <name>
#   SKIP_HF=1 hone only; HONE_COMMIT as in memory_bench.sh
# Results in OUT_DIR/cold: <run>/train_results.json, <run>.log, <run>.wall (process seconds),
# hf_<name>.jsonl, env.txt, table.md (bench/cold_table.py).
set -uo pipefail
hf_script=${1:+$(realpath -m "$1")}
out=$(realpath -m "${2:-bench-out}")/cold
cd "$(dirname "$0")/.." || exit 1
runs=${RUNS:-hone_bf16_first hone_bf16_second hone_fp16_first cudnn_bf16_first cudnn_bf16_second hone_bf16_steady hf_bf16_bs4 hf_bf16_fused_bs4}
rm -rf "$out"
mkdir -p "$out"
machine=fresh
{ [ -f build-bench/build.ninja ] || [ -d ~/.nv/ComputeCache ]; } && machine=used
commit=${HONE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
IFS=, read -r gpu driver < <(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
printf 'gpu=%s\ndriver=%s\ncommit=%s\nmachine=%s\n' "$gpu" "${driver# }" "$commit" "$machine" >"$out/env.txt"
echo "cold_bench: $gpu, commit $commit, machine $machine"

. bench/build_bench.sh
build_bench_hone "$out"

now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
for run in $runs; do
  t0=$(now)
  case $run in
    hf_*)
      [ -n "${SKIP_HF:-}" ] && continue
      python3 bench/hf_configs.py "$hf_script" all "$out/$run.jsonl" "${run#hf_}" >"$out/$run.log" 2>&1
      echo "$(since "$t0")" >"$out/$run.wall"
      echo "$run: $(since "$t0") s: $(grep -oE '"train_samples_per_second": [0-9.]+' "$out/$run.jsonl")"
      continue ;;
    hone_*|cudnn_*) ;;
    *) echo "cold_bench: unknown run '$run'"; exit 2 ;;
  esac
  prec=$(echo "$run" | cut -d_ -f2)
  n=512; [[ $run == *_steady ]] && n=4096
  attention=; [[ $run == cudnn_* ]] && attention=cudnn
  HONE_ATTENTION=$attention build-bench/hone train --model_name_or_path bert-large-uncased \
    --dataset "synthetic:${n}x512" --per_device_train_batch_size 4 --num_train_epochs 1 --save_strategy no \
    --disable_tqdm --"$prec" --tf32 --output_dir "$out/$run" >"$out/$run.log" 2>&1
  rc=$?
  echo "$(since "$t0")" >"$out/$run.wall"
  rm -f "$out/$run/model.safetensors"
  echo "$run: exit $rc, $(cat "$out/$run.wall") s; $(grep -E '^process:' "$out/$run.log")"
  [ $rc -eq 0 ] || tail -5 "$out/$run.log"
done
python3 bench/cold_table.py "$out" | tee "$out/table.md"
