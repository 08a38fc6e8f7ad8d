#!/usr/bin/env python3
"""Sums an `ncu --metrics gpu__time_duration.sum --csv` log by kind of kernel: where a
training step's GPU time goes. Usage: kernel_profile.py NCU_CSV"""
import csv
import sys
from collections import defaultdict

KINDS = [("attention (cuDNN fused flash)", ("fmha", "sdpa", "flash", "cudnn", "fused_lengths", "zero_padded")),
         ("matrix products (cuBLAS/cuBLASLt)", ("gemm", "xmma", "cutlass", "sm90_", "sm80_", "splitk", "reduce_")),
         ("attention softmax", ("softmax",)),
         ("layernorm", ("layernorm",)),
         ("optimizer (AdamW, norm)", ("adamw", "sum_squares", "clip")),
         ("embeddings", ("embedding", "first_token")),
         ("element-wise (dropout, GELU, tanh, add, fill)", ("dropout", "activation", "gelu", "tanh", "fill",
                                                            "add_scaled", "column_sum", "loss", "entropy", "mse", "cast"))]

rows = [r for r in csv.reader(open(sys.argv[1])) if len(r) > 10]
header = rows[0]
name_col, metric_col, value_col = header.index("Kernel Name"), header.index("Metric Name"), header.index("Metric Value")
unit_col = header.index("Metric Unit")
to_ns = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6}
total = defaultdict(float)
count = defaultdict(int)
for r in rows[1:]:
    if r[metric_col] != "gpu__time_duration.sum":
        continue
    name = r[name_col].lower()
    kind = next((k for k, keys in KINDS if any(key in name for key in keys)), "other: " + r[name_col][:60])
    total[kind] += float(r[value_col].replace(",", "")) * to_ns.get(r[unit_col], 1.0)
    count[kind] += 1
grand = sum(total.values())
print(f"| kernels | launches | GPU time (ms) | share |")
print("|---|---|---|---|")
for kind, t in sorted(total.items(), key=lambda kv: -kv[1]):
    print(f"| {kind} | {count[kind]} | {t / 1e6:.2f} | {100 * t / grand:.1f}% |")
print(f"| total | {sum(count.values())} | {grand / 1e6:.2f} | |")
