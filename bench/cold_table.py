#!/usr/bin/env python3
"""The table of bench/cold_bench.sh: python3 bench/cold_table.py OUT/cold"""
import json
import os
import sys

d = sys.argv[1]
env = dict(l.strip().split("=", 1) for l in open(os.path.join(d, "env.txt")) if "=" in l)
print(f"GPU: {env['gpu']}, driver {env['driver']}; hone commit {env['commit']}; machine {env['machine']} "
      f"at the first run; bert-large-uncased, batch 4, seq 512, one epoch\n")
print("| run | samples | train_runtime s | samples/s | process wall s | where the process's time went (s) |")
print("|---|---|---|---|---|---|")
hf_rate = {}
# In the order they ran.
order = sorted(os.listdir(d), key=lambda f: os.path.getmtime(os.path.join(d, f)))
runs = [f[:-5] for f in order if f.endswith(".wall")]
for run in runs:
    wall = open(os.path.join(d, run + ".wall")).read().strip()
    if run.startswith("hf_"):
        recs = [json.loads(l) for l in open(os.path.join(d, run + ".jsonl"))] if os.path.exists(
            os.path.join(d, run + ".jsonl")) else []
        r = recs[-1] if recs else {"error": "no output"}
        if "error" in r:
            print(f"| {run} (Trainer) | | error | | {wall} | {r['error'][-80:]!r} |")
            continue
        hf_rate[run] = r["train_samples_per_second"]
        print(f"| {run} (Trainer) | {r['n_samples']} | {r['train_runtime']:.2f} | {r['train_samples_per_second']:.1f} "
              f"| {wall} | trainer.train() {r['wall_s']:.1f} |")
        continue
    path = os.path.join(d, run, "train_results.json")
    if not os.path.exists(path):
        print(f"| {run} | | failed | | {wall} | |")
        continue
    r = json.load(open(path))
    steps = r.get("process_seconds", {})
    before, parts = 0.0, []
    for k, v in steps.items():
        parts.append(f"{k} {v - before:.2f}")
        before = v
    n = round(r["train_samples_per_second"] * r["train_runtime"])
    print(f"| {run} | {n} | {r['train_runtime']:.2f} | {r['train_samples_per_second']:.1f} | {wall} | "
          f"{', '.join(parts)} |")
if hf_rate:
    print()
    first = os.path.join(d, "hone_bf16_first", "train_results.json")
    if os.path.exists(first):
        r = json.load(open(first))
        for name, rate in hf_rate.items():
            print(f"- hone_bf16_first against {name}: {r['train_samples_per_second'] / rate:.2f}x "
                  f"(target >= 4x)")
    second = os.path.join(d, "hone_bf16_second", "train_results.json")
    if os.path.exists(first) and os.path.exists(second):
        a, b = (json.load(open(p))["train_samples_per_second"] for p in (first, second))
        print(f"- first run at {a / b:.2f}x the second's samples/s (target >= 0.9)")
    if os.path.exists(os.path.join(d, "hone_bf16_first.wall")):
        print(f"- hone_bf16_first process wall {open(os.path.join(d, 'hone_bf16_first.wall')).read().strip()} s "
              f"(target <= 6 s)")
