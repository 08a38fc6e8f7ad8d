#!/usr/bin/env bash
# Mixed precision, hone vs Hugging Face Trainer (tf32 + adamw_torch_fused, its best), in one
# call on one GPU, at steady state (thousands of samples of 512 tokens, bert-large-uncased,
# one epoch). Prints a markdown table (bench/mixed_table.py) with the targets met or missed.
# Usage: bench/mixed_bench.sh HF_TRAINER_BENCH.py [OUT_DIR]
#   HF_TRAINER_BENCH.py is the peer's script (carried beside the tree, git-ignored; not part of
#   hone): bench/hf_configs.py imports it and adds the fp16 fused configurations it lacks.
# Environment:
#   CONFIGS        configurations to run, bs<B>_<bf16|fp16>[_tanh]
#                  (default "bs4_bf16 bs4_fp16 bs8_bf16 bs32_bf16"); HF runs <prec>_fused_bs<B>[_tanh].
#                  _tanh: the model with hidden_act gelu_pytorch_tanh (hone: --config_name), whose
#                  GELU hone computes in the products' epilogues; both sides run the same model
#   MIXED_N        samples for every configuration; else MIXED_N_SMALL for B < 32
#                  (default 2048) and MIXED_N_LARGE for B >= 32 (default 4096)
#   HONE_FLAGS     more flags for `hone train` (e.g. --tf32)
#   HONE_TIMEOUT   seconds per hone run (default 300); HF_TIMEOUT the same for HF (default 300)
#   SKIP_HF=1      hone only (the HF columns read "not run")
# Results go to OUT_DIR/mixed: hone_<cfg>/train_results.json, hone_<cfg>.log, hf_<cfg>.jsonl,
# hf_<cfg>.log, table.md. One configuration failing leaves "error" in its row; the rest run.
set -uo pipefail
hf_script=$(realpath -m "$1")
out=$(realpath -m "${2:-bench-out}")/mixed
cd "$(dirname "$0")/.." || exit 1
mkdir -p "$out"
configs=${CONFIGS:-bs4_bf16 bs4_fp16 bs8_bf16 bs32_bf16}
for cfg in $configs; do
  [[ $cfg =~ ^bs[0-9]+_(bf16|fp16)(_tanh)?$ ]] || { echo "mixed_bench: bad configuration '$cfg' (want bs<B>_<bf16|fp16>[_tanh])"; exit 2; }
done
[ -n "${SKIP_HF:-}" ] || [ -f "$hf_script" ] || { echo "mixed_bench: no HF script at $hf_script"; exit 2; }

. bench/build_bench.sh
build_bench_hone "$out"

# bert-large-uncased as a config.json, its GELU the tanh form, for the _tanh configurations.
tanh_config="$out/tanh_config"
mkdir -p "$tanh_config"
cat >"$tanh_config/config.json" <<'EOF'
{"model_type": "bert", "architectures": ["BertForSequenceClassification"], "vocab_size": 30522,
 "hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16, "intermediate_size": 4096,
 "hidden_act": "gelu_pytorch_tanh", "max_position_embeddings": 512, "type_vocab_size": 2}
EOF

# A first run of a precision reads cuBLAS's and cuDNN's kernels for it from a cold disk
# cache, seconds that would land inside the measured steps (bs4 once measured 160 samples/s
# so in bf16, and 200 in fp16 after a bf16-only warm-up): a short run of each precision and
# model (the tanh GELU's epilogue kernels are others) loads them before anything is timed.
for warm in $(printf '%s\n' $configs | sed -E 's/^bs[0-9]+_//' | sort -u); do
  prec=${warm%_tanh}
  model_flags=()
  [[ $warm == *_tanh ]] && model_flags=(--config_name "$tanh_config")
  timeout "${HONE_TIMEOUT:-300}" build-bench/hone train --model_name_or_path bert-large-uncased \
    --dataset synthetic:64x512 --save_strategy no --per_device_train_batch_size 4 --num_train_epochs 1 \
    --disable_tqdm --output_dir "$out/warmup" "--$prec" "${model_flags[@]}" >"$out/warmup_$warm.log" 2>&1 ||
    echo "$warm warm-up failed"
  rm -rf "$out/warmup"
done

for cfg in $configs; do
  b=${cfg%%_*}; b=${b#bs}
  prec=${cfg#*_}; prec=${prec%_tanh}
  model_flags=(); hf_name="${prec}_fused_bs$b"
  if [[ $cfg == *_tanh ]]; then model_flags=(--config_name "$tanh_config"); hf_name+="_tanh"; fi
  if [ -n "${MIXED_N:-}" ]; then n=$MIXED_N
  elif [ "$b" -ge 32 ]; then n=${MIXED_N_LARGE:-4096}
  else n=${MIXED_N_SMALL:-2048}; fi
  echo "== $cfg: batch $b, $prec, $n samples"

  # hone. A stale train_results.json must not pass for this run's.
  rm -rf "$out/hone_$cfg"
  timeout "${HONE_TIMEOUT:-300}" build-bench/hone train --model_name_or_path bert-large-uncased \
    --dataset "synthetic:${n}x512" --save_strategy no --per_device_train_batch_size "$b" --num_train_epochs 1 \
    --disable_tqdm --output_dir "$out/hone_$cfg" "--$prec" "${model_flags[@]}" ${HONE_FLAGS:-} >"$out/hone_$cfg.log" 2>&1
  rc=$?
  rm -f "$out/hone_$cfg/model.safetensors"  # 1.3 GB that the table does not need
  if [ $rc -ne 0 ]; then
    echo "hone $cfg failed (exit $rc):"; tail -15 "$out/hone_$cfg.log"
    rm -f "$out/hone_$cfg/train_results.json"
  else
    grep -E "^model FLOPs|^time split" "$out/hone_$cfg.log"
  fi

  # HF Trainer, one fresh process (hf_configs.py records a failure as an "error" line).
  rm -f "$out/hf_$cfg.jsonl" "$out/hf_$cfg.log"
  if [ -z "${SKIP_HF:-}" ]; then
    N_SAMPLES=$n python3 bench/hf_configs.py "$hf_script" all "$out/hf_$cfg.jsonl" "$hf_name" \
      >"$out/hf_$cfg.log" 2>&1 || { echo "HF $cfg: wrapper failed:"; tail -15 "$out/hf_$cfg.log"; }
  fi
done

python3 bench/mixed_table.py "$out" $configs | tee "$out/table.md"
