#!/usr/bin/env python3
"""DeepSpeed's CPU Adam (the optimizer of its ZeRO-Offload) on bert-large's parameter count,
beside hone's host_optimizer_bench: the same buffers (fp32 parameters, gradients and both
moments, one flat tensor each), the same AdamW step, timed as the best of several steps after
one that touches the memory. DeepSpeed's step reads parameters, gradients and moments and
writes parameters and moments (28 bytes a parameter; the half-precision copy for the GPU is
made apart from it, where hone's update writes it in the same pass: 30 bytes).

Usage: python3 bench/ds_cpu_adam_bench.py [parameters, default 335141890] [passes, default 5]
Needs deepspeed importable (carried as a wheel) and a C++ compiler: DeepSpeed builds its
CPU Adam at first use (torch's cpp_extension). Threads: OMP_NUM_THREADS, else every core.
Prints one JSON line.
"""
import json
import os
import sys
import time


def main(argv):
    n = int(argv[1]) if len(argv) > 1 else 335141890
    passes = int(argv[2]) if len(argv) > 2 else 5
    threads = int(os.environ.get("OMP_NUM_THREADS", os.cpu_count()))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch
    torch.set_num_threads(threads)
    import deepspeed
    from deepspeed.ops.adam import DeepSpeedCPUAdam

    t0 = time.time()
    p = torch.nn.Parameter(torch.empty(n, dtype=torch.float32).uniform_(-0.05, 0.05))
    p.grad = torch.empty(n, dtype=torch.float32).uniform_(-1e-3, 1e-3)
    opt = DeepSpeedCPUAdam([p], lr=5e-5, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, adamw_mode=True)
    opt.step()  # builds nothing more; creates and touches both moments
    setup = time.time() - t0
    best = float("inf")
    for _ in range(passes):
        t = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - t)
    bytes_moved = 28.0 * n
    print(json.dumps({
        "tool": "deepspeed_cpu_adam", "deepspeed": deepspeed.__version__, "torch": torch.__version__,
        "parameters": n, "threads": threads, "best_step_ms": round(best * 1e3, 2),
        "gb_per_s": round(bytes_moved / best / 1e9, 1), "ns_per_parameter_per_core": round(best * 1e9 * threads / n, 2),
        "setup_s": round(setup, 1),
    }), flush=True)


if __name__ == "__main__":
    main(sys.argv)
