#!/usr/bin/env bash
# hone serve on one GPU: bert-large (random weights) bf16, 128-token texts; offline hone predict
# on the same texts first, then bench/serve_load.py against the server. On a device image
# without cpp-httplib (or pkg-config), the Debian .deb files carried in .carry/debs
# (libcpp-httplib-dev, libcpp-httplib0.11, libssl-dev, libbrotli-dev, zlib1g-dev, pkgconf,
# pkgconf-bin, libpkgconf3, libutf8proc*) are unpacked for the build. SERVE_FLAGS: more flags
# for hone serve (e.g. --cuda_graphs false).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p /tmp/deps; for d in .carry/debs/*.deb; do dpkg -x $d /tmp/deps; done
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
export PKG_CONFIG_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu/pkgconfig:/tmp/deps/usr/share/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=/tmp/deps
pk=""; command -v pkg-config >/dev/null || { pk="-DPKG_CONFIG_EXECUTABLE=/tmp/deps/usr/bin/pkgconf"; echo "carried pkgconf"; }
t0=$(date +%s)
cmake -S . -B build-serve -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH=/tmp/deps/usr \
  -DCMAKE_CUDA_ARCHITECTURES=90a -DHONE_MPI=OFF $pk > /tmp/cmake.log 2>&1 || { tail -20 /tmp/cmake.log; exit 1; }
grep -E "hone: .*httplib|hone serve" /tmp/cmake.log
ninja -C build-serve hone > /tmp/build.log 2>&1 || { grep -E "error" /tmp/build.log | head -20; exit 1; }
echo "build $(( $(date +%s) - t0 )) s"
python3 - <<'PY'
import json, torch
from transformers import BertConfig, BertForSequenceClassification
c = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096,
               num_labels=2, id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
torch.manual_seed(0)
BertForSequenceClassification(c).save_pretrained("/tmp/bl")
words = "the film was good and plot fine but acting bad .".split()
toks = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words
toks += [f"w{i}" for i in range(30522 - len(toks))]
open("/tmp/bl/vocab.txt", "w").write("\n".join(toks) + "\n")
s = "the film was good and the plot was fine but the acting was bad .".split()
text = " ".join((s * 10)[:126])
open("/tmp/test.jsonl", "w").write("".join(json.dumps({"text": text}) + "\n" for _ in range(8192)))
PY
flags="--model_name_or_path /tmp/bl --bf16 --max_seq_length 128 --per_device_eval_batch_size 64"
build-serve/hone predict $flags --test_file /tmp/test.jsonl --text_column text --output_dir /tmp/pred 2>&1 | tail -2
build-serve/hone serve $flags ${SERVE_FLAGS:-} --port 0 > /tmp/serve.log 2>&1 &
for i in $(seq 100); do grep -q listening /tmp/serve.log && break; sleep 0.2; done
P=$(grep -o '127.0.0.1:[0-9]*' /tmp/serve.log | cut -d: -f2)
head -3 /tmp/serve.log
python3 bench/serve_load.py $P --clients 128 --processes 8 --seconds 10 --words 126
python3 bench/serve_load.py $P --clients 16 --processes 4 --seconds 5 --words 126
python3 bench/serve_load.py $P --clients 1 --processes 1 --seconds 3 --words 126
kill -TERM %1; wait %1; echo "serve exit $?"; tail -1 /tmp/serve.log
