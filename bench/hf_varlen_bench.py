"""Trainer beside bench/varlen_bench.sh: a random bert-large-uncased fine-tuned on DATA (the
jsonl of bench/varlen_data.py) tokenized by TOKENIZER, each batch padded to its longest
(DataCollatorWithPadding), one epoch, bf16. Prints one JSON line.
Usage: python3 bench/hf_varlen_bench.py DATA TOKENIZER BATCH CONFIG   (CONFIG: bf16 or bf16_fused)"""
import json, sys, time

t_start = time.time()
data, tokenizer_dir, batch, config = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
import torch, transformers
from pynvml import nvmlInit, nvmlDeviceGetHandleByIndex, nvmlDeviceGetMemoryInfo
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, BertConfig, DataCollatorWithPadding,
                          Trainer, TrainingArguments, logging)
logging.set_verbosity_error()
nvmlInit()
gpu = nvmlDeviceGetHandleByIndex(0)
rows = [json.loads(l) for l in open(data)]
tok = AutoTokenizer.from_pretrained(tokenizer_dir)
enc = [dict(tok(r["text"], truncation=True, max_length=512), labels=int(r["label"] == "b")) for r in rows]
torch.manual_seed(0)
cfg = BertConfig(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096, num_labels=2)
model = AutoModelForSequenceClassification.from_config(cfg).cuda()
extra = dict(tf32=True, optim="adamw_torch_fused") if config == "bf16_fused" else {}
args = TrainingArguments(output_dir="/tmp/hf_varlen_out", per_device_train_batch_size=batch, num_train_epochs=1,
                         bf16=True, report_to="none", save_strategy="no", logging_strategy="no", eval_strategy="no",
                         **extra)
out = Trainer(model=model, args=args, train_dataset=enc, data_collator=DataCollatorWithPadding(tok)).train()
print(json.dumps({"config": config, "batch": batch, "n": len(enc),
                  "tokens": sum(len(e["input_ids"]) for e in enc),
                  "train_runtime": out.metrics["train_runtime"],
                  "train_samples_per_second": out.metrics["train_samples_per_second"],
                  "train_loss": out.metrics["train_loss"],
                  "nvml_after_train_mb": nvmlDeviceGetMemoryInfo(gpu).used // 2**20,
                  "process_s_before_exit": time.time() - t_start, "gpu": torch.cuda.get_device_name(0),
                  "torch": torch.__version__, "transformers": transformers.__version__}), flush=True)
