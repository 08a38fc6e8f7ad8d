#!/usr/bin/env bash
# The seed's memory methods (bert-large-uncased, 512 samples of 512 tokens, one epoch), hone vs
# Hugging Face Trainer in one call on one GPU: gradient accumulation, checkpointing (hone's
# selective policy too), Adafactor, 8-bit AdamW, all combined, and bf16 batch 32 with and
# without checkpointing. For every hone run, `hone estimate` of the same flags predicts its GPU
# memory. Prints a markdown table (bench/memory_table.py) with the targets met or missed.
# Usage: bench/memory_bench.sh HF_TRAINER_BENCH.py [OUT_DIR]
#   HF_TRAINER_BENCH.py is the peer's script (carried beside the tree, git-ignored; not part of
#   hone): bench/hf_configs.py imports it and adds adamw8bit_bs4 (bitsandbytes must be importable).
# Environment:
#   CONFIGS        configurations to run, hone and HF (default: all, in this order)
#                  gradacc_bs1x4 gradckpt_bs1x4 gradckpt_selective_bs1x4 adafactor_bs4 combined_bs1x4
#                  adamw8bit_bs4 bf16_bs32 bf16_ckpt_bs32 bf16_ckpt_selective_bs32
#                  (not by default: bf16_bs4 offload_bf16_bs4 bf16_bs4x8 offload_bf16_bs4x8
#                  offload_bf16_bs4_torchao offload_bf16_bs4_ds offload_bf16_bs4x8_ds)
#                  (HF runs each distinct Trainer configuration once: the selective and bs32 rows share)
#   MEM_N          samples (default 512, the seed's)
#   HONE_TIMEOUT   seconds per hone run (default 180); HF_TIMEOUT the same for HF (default 300)
#   MEM_DEADLINE   seconds after the start past which no run starts, and to which each run's
#                  timeout is cut, so that the table comes out within a 10-minute call (default 540)
#   SKIP_HF=1      hone only (the HF columns read "not run")
#   HONE_COMMIT    the commit to print where there is no .git (default: git rev-parse HEAD)
# Results go to OUT_DIR/memory: configs.tsv (configuration, Trainer's name, hone flags), env.txt,
# hone_<cfg>/train_results.json, hone_<cfg>.log, hone_<cfg>.wall (process seconds),
# estimate_<cfg>.log, hf_<name>.jsonl, hf_<name>.log, hf_<name>.wall, table.md (rewritten after
# every run, so a call cut short still has one). The first configuration runs twice: its first
# run (hone_<cfg>_cold) loads the kernels from a cold disk cache and is reported apart.
# One run failing leaves "error" in its row; the rest run.
# All of CONFIGS takes about 9 minutes on an H100 (Trainer's rows alone about 5): give a 10-minute
# call a part, e.g. CONFIGS="gradckpt_bs1x4 gradckpt_selective_bs1x4 combined_bs1x4" and the
# rest, then join the two: python3 bench/memory_table.py A/memory B/memory.
set -uo pipefail
hf_script=${1:+$(realpath -m "$1")}
out=$(realpath -m "${2:-bench-out}")/memory
cd "$(dirname "$0")/.." || exit 1
deadline=${MEM_DEADLINE:-540}
n=${MEM_N:-512}

# configuration -> Trainer's configuration (hf_configs.py name) and hone's flags
declare -A hf_of flags_of
add() { hf_of[$1]=$2; flags_of[$1]=$3; }
add gradacc_bs1x4 gradacc_bs1x4 "--per_device_train_batch_size 1 --gradient_accumulation_steps 4"
add gradckpt_bs1x4 gradckpt_bs1x4 "--per_device_train_batch_size 1 --gradient_accumulation_steps 4 --gradient_checkpointing"
add gradckpt_selective_bs1x4 gradckpt_bs1x4 "--per_device_train_batch_size 1 --gradient_accumulation_steps 4 --gradient_checkpointing --gradient_checkpointing_policy selective"
add adafactor_bs4 adafactor_bs4 "--per_device_train_batch_size 4 --optim adafactor"
add combined_bs1x4 combined_bs1x4 "--per_device_train_batch_size 1 --gradient_accumulation_steps 4 --gradient_checkpointing --fp16 --optim adafactor"
add adamw8bit_bs4 adamw8bit_bs4 "--per_device_train_batch_size 4 --optim adamw_bnb_8bit"
add bf16_bs32 bf16_fused_bs32 "--per_device_train_batch_size 32 --bf16"
add bf16_ckpt_bs32 bf16_fused_bs32 "--per_device_train_batch_size 32 --bf16 --gradient_checkpointing"
add bf16_ckpt_selective_bs32 bf16_fused_bs32 "--per_device_train_batch_size 32 --bf16 --gradient_checkpointing --gradient_checkpointing_policy selective"
# ZeRO-Offload (bench/ds_offload.json, as Trainer users write it) against bf16 on the GPU,
# at batch 4 and with accumulation 8; Trainer's row is its bf16 batch 4 (without DeepSpeed).
add bf16_bs4 bf16_bs4 "--per_device_train_batch_size 4 --bf16"
add offload_bf16_bs4 bf16_bs4 "--per_device_train_batch_size 4 --bf16 --deepspeed bench/ds_offload.json"
add bf16_bs4x8 bf16_bs4 "--per_device_train_batch_size 4 --gradient_accumulation_steps 8 --bf16"
add offload_bf16_bs4x8 bf16_bs4 "--per_device_train_batch_size 4 --gradient_accumulation_steps 8 --bf16 --deepspeed bench/ds_offload.json"
# The same offloaded runs against Trainer + DeepSpeed ZeRO-Offload with the same file (carry
# deepspeed: its CPU Adam builds at first use, which the first such row pays).
add offload_bf16_bs4_ds bf16_ds_offload_bs4 "--per_device_train_batch_size 4 --bf16 --deepspeed bench/ds_offload.json"
add offload_bf16_bs4x8_ds bf16_ds_offload_bs4x8 "--per_device_train_batch_size 4 --gradient_accumulation_steps 8 --bf16 --deepspeed bench/ds_offload.json"
# The same offloaded run against Trainer with torchao's CPU-offload optimizer (carry torchao).
add offload_bf16_bs4_torchao bf16_torchao_offload_bs4 "--per_device_train_batch_size 4 --bf16 --offload_optimizer"
configs=${CONFIGS:-gradacc_bs1x4 gradckpt_bs1x4 gradckpt_selective_bs1x4 adafactor_bs4 combined_bs1x4 adamw8bit_bs4 bf16_bs32 bf16_ckpt_bs32 bf16_ckpt_selective_bs32}
for cfg in $configs; do
  [ -n "${hf_of[$cfg]:-}" ] || { echo "memory_bench: unknown configuration '$cfg' (known: ${!hf_of[*]})"; exit 2; }
done
[ -n "${SKIP_HF:-}" ] || [ -f "$hf_script" ] || { echo "memory_bench: no HF script at '${1:-}'"; exit 2; }

rm -rf "$out"
mkdir -p "$out"
for cfg in $configs; do printf '%s\t%s\t%s\n' "$cfg" "${hf_of[$cfg]}" "${flags_of[$cfg]}"; done >"$out/configs.tsv"
# build-bench already there means an earlier call on this machine: its first run is not cold.
machine=fresh
[ -f build-bench/build.ninja ] && machine=used
commit=${HONE_COMMIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo "unknown (no .git; set HONE_COMMIT)")}
IFS=, read -r gpu driver < <(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)
printf 'gpu=%s\ndriver=%s\ncommit=%s\nmachine=%s\nn=%s\n' "$gpu" "${driver# }" "$commit" "$machine" "$n" >"$out/env.txt"
echo "memory_bench: $gpu, driver ${driver# }, commit $commit, $n samples, machine $machine"

. bench/build_bench.sh
build_bench_hone "$out"
echo "built in $SECONDS s"

table() { python3 bench/memory_table.py "$out" >"$out/table.md" 2>"$out/table.err" || tail -5 "$out/table.err"; }
# Seconds left before MEM_DEADLINE; those a run may take: its own limit, cut to what is left.
left() { echo $((deadline - SECONDS)); }
limit() { local l; l=$(left); echo $((l < $1 ? l : $1)); }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }
precision() { case " $1 " in *" --bf16 "*) echo bf16 ;; *" --fp16 "*) echo fp16 ;; *) echo fp32 ;; esac; }

# hone train of configuration $1 into hone_$2; then, unless $2 is a cold run, hone estimate.
run_hone() {
  local cfg=$1 name=$2 log="$out/hone_$2.log" t0 rc wall lim
  local args=(--model_name_or_path bert-large-uncased --dataset "synthetic:${n}x512" --num_train_epochs 1 ${flags_of[$cfg]})
  if [ "$(left)" -lt 15 ]; then
    echo "skipped: past MEM_DEADLINE ($deadline s)" >"$log"; echo "hone $name: skipped (deadline)"; return
  fi
  lim=$(limit "${HONE_TIMEOUT:-180}")
  t0=$(now)
  timeout "$lim" build-bench/hone train "${args[@]}" --disable_tqdm --save_strategy no \
    --output_dir "$out/hone_$name" >"$log" 2>&1
  rc=$?
  wall=$(since "$t0")
  echo "$wall" >"$out/hone_$name.wall"
  rm -f "$out/hone_$name/model.safetensors"  # 1.3 GB that the table does not need
  if [ $rc -ne 0 ]; then
    [ $rc -eq 124 ] && echo "timed out after $lim s (HONE_TIMEOUT / MEM_DEADLINE)" >>"$log"
    rm -f "$out/hone_$name/train_results.json"  # a partial run's must not pass for a result
    echo "hone $name: failed (exit $rc, $wall s): $(grep -v '^\s*$' "$log" | tail -1 | cut -c1-200)"
  else
    echo "hone $name: $(grep -oE "'train_samples_per_second': [0-9.]+" "$log" | grep -oE '[0-9.]+$') samples/s," \
      "train $(grep -oE "'train_runtime': [0-9.]+" "$log" | grep -oE '[0-9.]+$') s, process $wall s," \
      "$(grep -oE '[0-9]+ MB. \(after training' "$log" | cut -d' ' -f1) MB used after training"
  fi
  [[ $name == *_cold ]] && return
  [ "$(left)" -ge 5 ] || return
  if timeout "$(limit 60)" build-bench/hone estimate "${args[@]}" --device cuda >"$out/estimate_$cfg.log" 2>&1; then
    grep -oE "predicted GPU memory of the run \(NVML, this process\): [0-9]+ MB" "$out/estimate_$cfg.log" |
      sed "s/^/estimate $cfg: /" || echo "estimate $cfg: no prediction in estimate_$cfg.log"
  else
    echo "estimate $cfg failed: $(tail -1 "$out/estimate_$cfg.log" | cut -c1-200)"
  fi
}

# The first run on a machine reads the CUDA libraries and their kernels from a cold disk cache:
# the first configuration runs twice, the first reported apart. cuBLAS's kernels of another
# precision load on their first use too (mixed_bench.sh measured bs4 bf16 at 160 samples/s cold),
# so a short untimed run of each other precision goes before the timed ones.
first=${configs%% *}
run_hone "$first" "${first}_cold"
for prec in $(for cfg in $configs; do precision "${flags_of[$cfg]}"; done | sort -u); do
  [ "$prec" = "$(precision "${flags_of[$first]}")" ] && continue
  [ "$(left)" -ge 15 ] || continue
  pflag=(); [ "$prec" = fp32 ] || pflag=("--$prec")
  timeout "$(limit 60)" build-bench/hone train --model_name_or_path bert-large-uncased --dataset synthetic:64x512 \
    --per_device_train_batch_size 4 --num_train_epochs 1 --disable_tqdm --save_strategy no \
    --output_dir "$out/warmup" "${pflag[@]}" >"$out/warmup_$prec.log" 2>&1 || echo "$prec warm-up failed"
  rm -rf "$out/warmup"
done
for cfg in $configs; do
  run_hone "$cfg" "$cfg"
  table
done

# HF Trainer, one fresh process per distinct configuration (hf_configs.py records a failure or
# a timeout as an "error" line).
if [ -z "${SKIP_HF:-}" ]; then
  for name in $(for cfg in $configs; do echo "${hf_of[$cfg]}"; done | awk '!seen[$0]++'); do
    log="$out/hf_$name.log"
    if [ "$(left)" -lt 20 ]; then
      echo "skipped: past MEM_DEADLINE ($deadline s)" >"$log"; echo "HF $name: skipped (deadline)"; continue
    fi
    t0=$(now)
    HF_TIMEOUT=$(limit "${HF_TIMEOUT:-300}") N_SAMPLES=$n python3 bench/hf_configs.py "$hf_script" all "$out/hf_$name.jsonl" "$name" \
      >"$log" 2>&1 || echo "HF $name: wrapper failed: $(tail -1 "$log" | cut -c1-200)"
    since "$t0" >"$out/hf_$name.wall"
    python3 - "$out/hf_$name.jsonl" "$name" "$(cat "$out/hf_$name.wall")" <<'EOF'
import json, sys
path, name, wall = sys.argv[1:]
try:
    with open(path) as f:
        r = json.loads(f.readlines()[-1])
except (OSError, IndexError, ValueError) as e:
    sys.exit(f"HF {name}: no record ({e})")
if "error" in r:
    print(f"HF {name}: error after {wall} s: {' '.join(str(r['error']).split())[-200:]}")
else:
    print(f"HF {name}: {r.get('train_samples_per_second')} samples/s, train {r.get('wall_s', 0):.1f} s, "
          f"process {wall} s, {r.get('nvml_after_train_mb')} MB used after training (start {r.get('nvml_start_mb')})")
EOF
    table
  done
fi

table
echo
cat "$out/table.md"
