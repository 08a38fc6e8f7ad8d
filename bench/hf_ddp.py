#!/usr/bin/env python3
"""The peer's HF Trainer bench under torchrun (DDP): each rank runs the peer's own
run_one(NAME) on its own GPU; rank 0's JSON line is the result (Trainer reports the global
samples per second). The peer's script is imported by path, never copied or changed.

Usage: torchrun --nproc_per_node N bench/hf_ddp.py HF_TRAINER_BENCH.py NAME
N_SAMPLES (the global sample count) passes to run_one.
"""
import importlib.util
import os
import sys

import torch

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
torch.cuda.set_device(local_rank)  # before run_one's first CUDA call, so each rank has its own GPU
spec = importlib.util.spec_from_file_location("hf_trainer_bench", sys.argv[1])
peer = importlib.util.module_from_spec(spec)
spec.loader.exec_module(peer)
if int(os.environ.get("RANK", "0")) != 0:
    sys.stdout = open(os.devnull, "w")  # one JSON line per run, rank 0's
peer.run_one(sys.argv[2])
