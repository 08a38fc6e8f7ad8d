"""Trainer on the CPU beside hone's bench/cpu_bench.sh: fine-tunes MODEL (a directory, or
"bert-base" for a random bert-base-uncased with the MiniLM tokenizer) on the first N lines
of examples/debian-sections/train.jsonl, batch 16, max length 128, padding each batch to
its longest, one epoch, no evaluation, THREADS torch threads; PRECISION bf16 sets Trainer's
--bf16 (autocast on the CPU). Prints one JSON line.
Usage: python3 bench/hf_cpu_bench.py MODEL TOKENIZER N THREADS [fp32|bf16]
"""
import json, resource, sys, time

t_start = time.time()
model_name, tokenizer_dir, n, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
bf16 = len(sys.argv) > 5 and sys.argv[5] == "bf16"
import torch
torch.set_num_threads(threads)
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, BertConfig, DataCollatorWithPadding,
                          Trainer, TrainingArguments, logging)
logging.set_verbosity_error()
rows = [json.loads(l) for l in open("examples/debian-sections/train.jsonl")][:n]
labels = sorted({r["label"] for r in rows})
tok = AutoTokenizer.from_pretrained(tokenizer_dir)
enc = [dict(tok(r["text"], truncation=True, max_length=128), labels=labels.index(r["label"])) for r in rows]
if model_name == "bert-base":
    torch.manual_seed(0)
    model = AutoModelForSequenceClassification.from_config(BertConfig(num_labels=len(labels)))
else:
    model = AutoModelForSequenceClassification.from_pretrained(model_name, num_labels=len(labels))
args = TrainingArguments(output_dir="/tmp/hf_cpu_out", per_device_train_batch_size=16, num_train_epochs=1,
                         learning_rate=1e-4, use_cpu=True, report_to="none", save_strategy="no",
                         logging_strategy="no", eval_strategy="no", dataloader_num_workers=0, bf16=bf16)
trainer = Trainer(model=model, args=args, train_dataset=enc, data_collator=DataCollatorWithPadding(tok))
out = trainer.train()
print(json.dumps({"model": model_name, "n": n, "threads": threads, "bf16": bf16, "torch": torch.__version__,
                  "train_runtime": out.metrics["train_runtime"],
                  "train_samples_per_second": out.metrics["train_samples_per_second"],
                  "train_loss": out.metrics["train_loss"], "process_s": time.time() - t_start,
                  "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)
