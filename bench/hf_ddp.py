#!/usr/bin/env python3
"""The peer's HF Trainer bench under torchrun (DDP): each rank runs the peer's own
run_one(NAME) on its own GPU; rank 0's JSON line is the result (Trainer reports the global
samples per second). The peer's script is imported by path, never copied or changed, with
bench/hf_configs.py's added configurations (DeepSpeed's among them: Trainer's --deepspeed
takes torchrun's process group).

Each rank must pick its GPU before run_one's first CUDA call, and picking it makes torch's
CUDA context, so the peer's nvml_start_mb already counts that context. The JSON line gains
nvml_before_context_mb: NVML's used on the rank's GPU before it (an idle GPU's reservation).

Usage: torchrun --nproc_per_node N bench/hf_ddp.py HF_TRAINER_BENCH.py NAME
N_SAMPLES (the global sample count) passes to run_one.
"""
import contextlib
import io
import json
import os
import sys

import torch
from pynvml import nvmlDeviceGetHandleByIndex, nvmlDeviceGetMemoryInfo, nvmlInit

sys.dont_write_bytecode = True  # no __pycache__ in bench/
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_configs  # noqa: E402

local_rank = int(os.environ.get("LOCAL_RANK", "0"))
nvmlInit()
before_context = nvmlDeviceGetMemoryInfo(nvmlDeviceGetHandleByIndex(local_rank)).used // 2**20
torch.cuda.set_device(local_rank)
peer = hf_configs.load_peer(sys.argv[1])
if sys.argv[2] not in peer.CONFIGS:
    sys.exit(f"hf_ddp.py: unknown configuration {sys.argv[2]!r}; known: {list(peer.CONFIGS)}")
printed = io.StringIO()
with contextlib.redirect_stdout(printed):
    peer.run_one(sys.argv[2])
if int(os.environ.get("RANK", "0")) == 0:  # one JSON line per run, rank 0's
    for line in printed.getvalue().splitlines():
        try:  # the peer's JSON line (Trainer prints its metrics as a Python dict, not JSON)
            record = json.loads(line)
            record["nvml_before_context_mb"] = before_context
            line = json.dumps(record)
        except (json.JSONDecodeError, TypeError):
            pass
        print(line, flush=True)
