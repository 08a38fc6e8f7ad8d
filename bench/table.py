#!/usr/bin/env python3
"""Prints the hone vs HF Trainer table from one bench/seed_bench.sh output folder."""
import json
import sys

out = sys.argv[1]
hf = {}
with open(f"{out}/hf.jsonl") as f:
    for line in f:
        r = json.loads(line)
        hf[r["name"]] = r

rows = [("fp32", "vanilla_bs4"), ("tf32", "tf32_bs4")]
print("| config | hone samples/s | HF samples/s | hone/HF | hone process MB | HF process MB | hone/HF |")
print("|---|---|---|---|---|---|---|")
for precision, hf_name in rows:
    with open(f"{out}/hone_{precision}/train_results.json") as f:
        h = json.load(f)
    p = hf.get(hf_name, {})
    if "error" in p or not p:
        print(f"| bs4 {precision} | {h['train_samples_per_second']:.1f} | error | | | | |")
        continue
    # Process memory: NVML device-wide used after training, less what was in use before start.
    h_mb = h["gpu_memory_after_train_mb"] - h["gpu_memory_start_mb"]
    p_mb = p["nvml_after_train_mb"] - p["nvml_start_mb"]
    print(f"| bs4 {precision} | {h['train_samples_per_second']:.1f} | {p['train_samples_per_second']:.1f} | "
          f"{h['train_samples_per_second'] / p['train_samples_per_second']:.2f} | {h_mb} | {p_mb} | {h_mb / p_mb:.2f} |")
print()
print(f"GPU: {h.get('gpu')}; hone plan {h.get('planned_mb')} MB, hone process (NVML) {h.get('gpu_memory_process_mb')} MB")
