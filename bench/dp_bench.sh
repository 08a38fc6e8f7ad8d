#!/usr/bin/env bash
# Data parallel on this machine's GPUs: bert-large bf16 (--tf32), batch 32 per GPU, hone on
# 1 and N GPUs (hone launch) beside Trainer on 1 and N GPUs (torchrun, DDP), each a fresh
# process, SAMPLES_PER_GPU samples per GPU so that every run takes as many steps.
# Usage: bench/dp_bench.sh HF_TRAINER_BENCH.py [OUT_DIR]
# Environment: GPUS (default: all), SAMPLES_PER_GPU (default 4096), ZERO_STAGES (hone on N GPUs
# at these ZeRO stages too, default "1 2"), ONE_GPU=0 (no single-GPU run), BATCH (per GPU,
# default 32), HONE_FLAGS (more flags for hone, e.g. --gradient_checkpointing), TAG (a suffix
# of the results' folder), SKIP_HF=1, HONE_COMMIT, HF_CONFIG (Trainer's configuration, from the
# peer's script or bench/hf_configs.py, default bf16_fused_bs32), HF_ZERO_CONFIG (a Trainer +
# DeepSpeed configuration run on N GPUs too, e.g. bf16_ds_zero2_ckpt_bs8; needs deepspeed),
# HF_TIMEOUT (seconds a Trainer run may take, default 300).
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
  hf_runs="$gpus"; [ "${ONE_GPU:-1}" = 0 ] || hf_runs="1 $hf_runs"
  [ -n "${HF_ZERO_CONFIG:-}" ] && hf_runs="$hf_runs ${gpus}z"
  for spec in $hf_runs; do
    n=${spec%z}
    config=${HF_CONFIG:-bf16_fused_bs32}; [[ $spec == *z ]] && config=$HF_ZERO_CONFIG
    t0=$(now)
    N_SAMPLES=$((per_gpu * n)) timeout "${HF_TIMEOUT:-300}" torchrun --nproc_per_node "$n" bench/hf_ddp.py "$hf_script" "$config" \
      >"$out/hf_$spec.jsonl" 2>"$out/hf_$spec.log"
    echo "$(since "$t0")" >"$out/hf_$spec.wall"
    echo "hf_$spec ($config): $(since "$t0") s: $(grep -oE '"train_samples_per_second": [0-9.]+' "$out/hf_$spec.jsonl")"
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
def process_mb(r, keys):  # what the run holds on rank 0's GPU: NVML's used after training less used at start
    return r.get(keys[0], 0) - next((r[k] for k in keys[1:] if k in r), 0)
print("| run | GPUs | samples/s | per GPU | scaling efficiency | process s | GPU memory (MiB, NVML used, rank 0's GPU) "
      "| process memory (MiB) | memory / plain DP | planned (MiB, rank 0) | NCCL (MiB, measured) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
# (used after training, then the readings at start, the first present taken): hone reads its
# start before its CUDA context; Trainer's wrapper before torch's (hf_ddp.py).
HONE = ("gpu_memory_after_train_mb", "gpu_memory_start_mb")
TRAINER = ("nvml_after_train_mb", "nvml_before_context_mb", "nvml_start_mb")
runs = [("hone", "hone_", hone, k, HONE) for k in ["1", str(n)]]
runs += [("hone, ZeRO stage " + d.split("z")[1], "hone_", hone, d[5:], HONE)
         for d in sorted(os.listdir(out)) if d.startswith(f"hone_{n}z") and os.path.isdir(f"{out}/{d}")]
runs += [("Trainer (DDP)", "hf_", hf, k, TRAINER) for k in ["1", str(n)]]
runs += [("Trainer + DeepSpeed (" + (hf(f"{n}z") or {}).get("name", "") + ")", "hf_", hf, f"{n}z", TRAINER)]
for name, prefix, get, k, keys in runs:
    gpus = int(k.rstrip("z").split("z")[0])
    r, one = get(k), get("1")
    if not os.path.exists(f"{out}/{prefix}{k}.wall"): continue
    if not r: print(f"| {name} | {gpus} | failed | | | | | | | | |"); continue
    sps = r["train_samples_per_second"]
    eff = f"{100 * sps / gpus / one['train_samples_per_second']:.1f}%" if one else ""
    wall = open(f"{out}/{prefix}{k}.wall").read().strip()
    proc = process_mb(r, keys)
    plain = get(str(n)) if gpus == n else None
    ratio = f"{proc / process_mb(plain, keys):.3f}" if plain and proc and process_mb(plain, keys) else ""
    print(f"| {name} | {gpus} | {sps:.1f} | {sps / gpus:.1f} | {eff} | {wall} | {r.get(keys[0], '')} | {proc or ''} | {ratio} "
          f"| {r.get('planned_mb', '')} | {r.get('communicator_mb', '')} |")
PY
