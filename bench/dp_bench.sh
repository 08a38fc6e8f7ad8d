#!/usr/bin/env bash
# Data parallel on this machine's GPUs: bert-large bf16 (--tf32), batch 32 per GPU, hone on
# 1 and N GPUs (hone launch) beside Trainer on 1 and N GPUs (torchrun, DDP), each a fresh
# process, SAMPLES_PER_GPU samples per GPU so that every run takes as many steps.
# Usage: bench/dp_bench.sh HF_TRAINER_BENCH.py [OUT_DIR]
# Environment: GPUS (default: all), SAMPLES_PER_GPU (default 4096), ZERO_STAGES (hone on N GPUs
# at these ZeRO stages too, default "1 2"), ONE_GPU=0 (no single-GPU run), BATCH (per GPU,
# default 32), HONE_FLAGS (more flags for hone, e.g. --gradient_checkpointing), TAG (a suffix
# of the results' folder), SKIP_HF=1, HONE_COMMIT.
# Results in OUT_DIR/dp$TAG: <run>.log, <run>/train_results.json, hf_<n>.jsonl, env.txt, table.md.
set -uo pipefail
hf_script=${1:+$(realpath -m "$1")}
out=$(realpath -m "${2:-bench-out}")/dp${TAG:-}
cd "$(dirname "$0")/.." || exit 1
rm -rf "$out"
mkdir -p "$out"
export NCCL_NVLS_ENABLE=0
gpus=${GPUS:-$(nvidia-smi -L | grep -c '^GPU')}
per_gpu=${SAMPLES_PER_GPU:-4096}
batch=${BATCH:-32}
read -ra hone_flags <<<"${HONE_FLAGS:-}"
commit=${HONE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
IFS=, read -r gpu driver < <(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
printf 'gpu=%s\ndriver=%s\ncommit=%s\ngpus=%s\nsamples_per_gpu=%s\nbatch=%s\nhone_flags=%s\n' "$gpu" "${driver# }" \
  "$commit" "$gpus" "$per_gpu" "$batch" "${HONE_FLAGS:-}" >"$out/env.txt"
nvidia-smi topo -m >"$out/topology.txt" 2>&1
echo "dp_bench: $gpus x $gpu, commit $commit, batch $batch per GPU ${HONE_FLAGS:-}"
. bench/build_bench.sh
build_bench_hone "$out"
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
runs="$gpus"; [ "${ONE_GPU:-1}" = 0 ] || runs="1 $runs"
for z in ${ZERO_STAGES-1 2}; do runs="$runs ${gpus}z$z"; done
for spec in $runs; do
  n=${spec%z*}
  zero=0; [[ $spec == *z* ]] && zero=${spec#*z}
  run=hone_$spec
  t0=$(now)
  launch=(); [ "$n" -gt 1 ] && launch=(launch --nproc_per_node "$n")
  build-bench/hone "${launch[@]}" train --model_name_or_path bert-large-uncased \
    --dataset "synthetic:$((per_gpu * n))x512" --per_device_train_batch_size "$batch" --num_train_epochs 1 \
    --save_strategy no --disable_tqdm --bf16 --tf32 --zero_stage "$zero" "${hone_flags[@]}" \
    --output_dir "$out/$run" >"$out/$run.log" 2>&1
  rc=$?
  echo "$(since "$t0")" >"$out/$run.wall"
  rm -f "$out/$run/model.safetensors"
  echo "$run: exit $rc, $(cat "$out/$run.wall") s: $(grep -E "^\{'train_runtime'" "$out/$run.log")"
  [ $rc -eq 0 ] || tail -8 "$out/$run.log"
done
if [ -z "${SKIP_HF:-}" ]; then
  for n in 1 "$gpus"; do
    t0=$(now)
    N_SAMPLES=$((per_gpu * n)) torchrun --nproc_per_node "$n" bench/hf_ddp.py "$hf_script" bf16_fused_bs32 \
      >"$out/hf_$n.jsonl" 2>"$out/hf_$n.log"
    echo "$(since "$t0")" >"$out/hf_$n.wall"
    echo "hf_$n: $(since "$t0") s: $(grep -oE '"train_samples_per_second": [0-9.]+' "$out/hf_$n.jsonl")"
  done
fi
python3 - "$out" "$gpus" <<'PY' | tee "$out/table.md"
import json, os, sys
out, n = sys.argv[1], int(sys.argv[2])
def hone(k):
    try: return json.load(open(f"{out}/hone_{k}/train_results.json"))
    except Exception: return None
def hf(k):
    try: return json.loads([l for l in open(f"{out}/hf_{k}.jsonl") if l.startswith("{")][-1])
    except Exception: return None
print("| run | GPUs | samples/s | per GPU | scaling efficiency | process s | GPU memory (MiB, NVML, rank 0's GPU) | planned (MiB, rank 0) | NCCL (MiB, measured) |")
print("|---|---|---|---|---|---|---|---|---|")
runs = [("hone", "hone_", hone, k, "gpu_memory_after_train_mb") for k in ["1", str(n)]]
runs += [("hone, ZeRO stage " + d.split("z")[1], "hone_", hone, d[5:], "gpu_memory_after_train_mb")
         for d in sorted(os.listdir(out)) if d.startswith(f"hone_{n}z") and os.path.isdir(f"{out}/{d}")]
runs += [("Trainer (DDP)", "hf_", hf, k, "nvml_after_train_mb") for k in ["1", str(n)]]
for name, prefix, get, k, mem in runs:
    gpus = int(k.split("z")[0])
    r, one = get(k), get("1")
    if not r: print(f"| {name} | {gpus} | failed | | | | | | |"); continue
    sps = r["train_samples_per_second"]
    eff = sps / gpus / one["train_samples_per_second"] if one else float("nan")
    wall = open(f"{out}/{prefix}{k}.wall").read().strip()
    print(f"| {name} | {gpus} | {sps:.1f} | {sps / gpus:.1f} | {100 * eff:.1f}% | {wall} | {r.get(mem, '')} | {r.get('planned_mb', '')} | {r.get('communicator_mb', '')} |")
PY
