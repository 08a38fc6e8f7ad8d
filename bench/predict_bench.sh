#!/usr/bin/env bash
# hone predict as a user runs it offline: bert-large (random weights, a vocabulary of its own)
# in bf16, 4096 texts of 8 to 500 words drawn uniformly (seeded), --max_seq_length 512, batch 64,
# each run a fresh process. With several builds, their runs alternate ROUNDS times (default 2)
# and each run's predictions are compared with the first build's.
# Usage: bench/predict_bench.sh BUILD_DIR [BUILD_DIR ...]   (each holds a built `hone`)
set -uo pipefail
[ $# -ge 1 ] || { echo "usage: bench/predict_bench.sh BUILD_DIR [BUILD_DIR ...]"; exit 2; }
work=${PREDICT_WORK:-/tmp/predict_bench}
mkdir -p "$work"
if [ ! -f "$work/model/model.safetensors" ]; then
  python3 - "$work" <<'PY'
import json, random, sys, torch
from transformers import BertConfig, BertForSequenceClassification
work = sys.argv[1]
c = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
               num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
torch.manual_seed(0)
BertForSequenceClassification(c).save_pretrained(f"{work}/model")
words = "the film was good and plot fine but acting bad .".split()
toks = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
toks += [f"w{i}" for i in range(30522 - len(toks))]
open(f"{work}/model/vocab.txt", "w").write("\n".join(toks) + "\n")
r = random.Random(0)
vocab = words + [f"w{i}" for i in range(2000)]
with open(f"{work}/test.jsonl", "w") as f:
    for _ in range(4096):
        f.write(json.dumps({"text": " ".join(r.choice(vocab) for _ in range(r.randint(8, 500)))}) + "\n")
PY
fi
flags="--model_name_or_path $work/model --bf16 --max_seq_length 512 --per_device_eval_batch_size 64 --test_file $work/test.jsonl --text_column text"
for round in $(seq "${ROUNDS:-2}"); do
  i=0
  for build in "$@"; do
    out="$work/out_$i"
    t0=$(date +%s.%N)
    "$build/hone" predict $flags --output_dir "$out" >"$work/log_$i" 2>&1
    rc=$?
    wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')
    same=""
    [ $i -gt 0 ] && { cmp -s "$out/predictions.jsonl" "$work/out_0/predictions.jsonl" && same=", predictions as the first build's" || same=", predictions DIFFER from the first build's"; }
    echo "round $round $build: exit $rc, wall $wall s: $(grep -E 'predictions in' "$work/log_$i" | sed 's/ written.*//')$same"
    [ $rc -eq 0 ] || tail -3 "$work/log_$i"
    i=$((i + 1))
  done
done
