#!/usr/bin/env python3
"""The peer's HF Trainer bench with the configurations it lacks (fp16 fused, 8-bit AdamW,
torchao's CPU-offload optimizer, DeepSpeed's ZeRO-Offload and ZeRO-2, gradient checkpointing at batch 8).

Usage: python3 bench/hf_configs.py HF_TRAINER_BENCH.py NAME            (one run; prints one JSON line)
       python3 bench/hf_configs.py HF_TRAINER_BENCH.py all OUTFILE [NAME...]
       python3 bench/hf_configs.py HF_TRAINER_BENCH.py list            (the configuration names)

HF_TRAINER_BENCH.py is the peer's script (not part of hone, never copied or changed): it is
imported by path, its CONFIGS dict gains the entries below (existing names are left as the
peer wrote them), and a run is the peer's own run_one(NAME). `all` does what the peer's
`all` does (one fresh process per configuration, the last JSON line of each appended to
OUTFILE), except that each child is this wrapper, so it sees the added configurations too,
and that a child which times out gives an error line instead of ending the loop.
N_SAMPLES (read by run_one) and the rest of the environment pass to the children.
HF_TIMEOUT: seconds per child (default 300, the peer's).
A name ending in _tanh (not listed, and not in a bare `all`) runs the configuration without
the suffix on bert-large with hidden_act gelu_pytorch_tanh: BertConfig's default activation
is changed before the peer's run_one builds its BertConfig(...), which names no activation,
and the log says so.
"""
import importlib.util
import json
import os
import subprocess
import sys

BENCH = os.path.dirname(os.path.abspath(__file__))
DS_OFFLOAD = os.path.join(BENCH, "ds_offload.json")
DS_ZERO2 = os.path.join(BENCH, "ds_zero2.json")

# HF's best settings (tf32 + fused AdamW) in fp16 too; bf16 has them in the peer's CONFIGS.
# adamw8bit_bs4: bitsandbytes' 8-bit AdamW, beside the peer's adafactor_bs4 (needs bitsandbytes).
EXTRA_CONFIGS = {
    "fp16_fused_bs4": dict(per_device_train_batch_size=4, fp16=True, tf32=True, optim="adamw_torch_fused"),
    "fp16_fused_bs8": dict(per_device_train_batch_size=8, fp16=True, tf32=True, optim="adamw_torch_fused"),
    "fp16_fused_bs32": dict(per_device_train_batch_size=32, fp16=True, tf32=True, optim="adamw_torch_fused",
                            dataloader_pin_memory=True),
    "adamw8bit_bs4": dict(per_device_train_batch_size=4, optim="adamw_bnb_8bit"),
    # torchao's CPUOffloadOptimizer around torch's fused AdamW (needs torchao): Trainer's
    # create_optimizer is replaced, since no --optim name builds it.
    "bf16_torchao_offload_bs4": dict(per_device_train_batch_size=4, bf16=True),
    # DeepSpeed ZeRO-2 with the optimizer offloaded to the host (needs deepspeed): Trainer's
    # --deepspeed with bench/ds_offload.json, the file hone's offloaded rows read; its
    # optimizer block makes DeepSpeed update with its CPU Adam.
    "bf16_ds_offload_bs4": dict(per_device_train_batch_size=4, bf16=True, deepspeed=DS_OFFLOAD),
    "bf16_ds_offload_bs4x8": dict(per_device_train_batch_size=4, gradient_accumulation_steps=8, bf16=True,
                                  deepspeed=DS_OFFLOAD),
    # Data parallel where the model's state is most of the memory (bench/dp_bench.sh, torchrun):
    # DDP, and DeepSpeed ZeRO-2 (bench/ds_zero2.json; Trainer's fused AdamW on the shards).
    "bf16_fused_ckpt_bs8": dict(per_device_train_batch_size=8, bf16=True, tf32=True, optim="adamw_torch_fused",
                                gradient_checkpointing=True),
    "bf16_ds_zero2_ckpt_bs8": dict(per_device_train_batch_size=8, bf16=True, tf32=True, optim="adamw_torch_fused",
                                   gradient_checkpointing=True, deepspeed=DS_ZERO2),
}
TORCHAO_OFFLOAD = {"bf16_torchao_offload_bs4"}
TANH = "_tanh"


def use_tanh_gelu():
    """Makes gelu_pytorch_tanh the default hidden_act of transformers' BertConfig."""
    import transformers
    original = transformers.BertConfig.__init__

    def init(self, *args, **kwargs):
        kwargs.setdefault("hidden_act", "gelu_pytorch_tanh")
        original(self, *args, **kwargs)

    transformers.BertConfig.__init__ = init
    act = transformers.BertConfig(num_labels=2).hidden_act
    if act != "gelu_pytorch_tanh":
        sys.exit(f"hf_configs.py: could not make the tanh GELU BertConfig's default (got {act!r})")
    print(f"hf_configs.py: BertConfig(...) without hidden_act now gives {act}", file=sys.stderr, flush=True)


def use_torchao_offload():
    """Makes Trainer build torchao's CPUOffloadOptimizer (AdamW states and the update on the
    host). Its backward hooks move each gradient to the host and drop the device's, so
    Trainer's gradient clipping sees no gradients (a no-op), and it does not accumulate
    gradients over micro-steps: only runs without accumulation are comparable."""
    import torch
    import transformers
    from torchao.optim import CPUOffloadOptimizer

    def create_optimizer(self):
        if self.optimizer is None:
            a = self.args
            self.optimizer = CPUOffloadOptimizer(self.model.parameters(), torch.optim.AdamW, lr=a.learning_rate,
                                                 betas=(a.adam_beta1, a.adam_beta2), eps=a.adam_epsilon,
                                                 weight_decay=a.weight_decay, fused=True)
        return self.optimizer

    transformers.Trainer.create_optimizer = create_optimizer
    print("hf_configs.py: Trainer's optimizer is torchao's CPUOffloadOptimizer(AdamW, fused)", file=sys.stderr,
          flush=True)


def use_single_process_group():
    """DeepSpeed starts a process group even on one GPU: give it a world of one, as its
    launcher would, unless the environment already names one."""
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                       ("MASTER_PORT", "29511")):
        os.environ.setdefault(key, value)


def load_peer(path):
    sys.dont_write_bytecode = True  # no __pycache__ beside the peer's script
    spec = importlib.util.spec_from_file_location("hf_trainer_bench", path)
    if spec is None or spec.loader is None:
        sys.exit(f"hf_configs.py: cannot import {path}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the peer's main block does not run: __name__ is not "__main__"
    for name, overrides in EXTRA_CONFIGS.items():
        mod.CONFIGS.setdefault(name, overrides)
    return mod


def known(configs, name):
    return name in configs or (name.endswith(TANH) and name[: -len(TANH)] in configs)


def run_all(peer_path, configs, outfile, names):
    timeout = float(os.environ.get("HF_TIMEOUT", "300"))
    me = os.path.abspath(__file__)
    for name in names or list(configs):
        try:
            p = subprocess.run([sys.executable, me, peer_path, name], capture_output=True, text=True, timeout=timeout)
            line = [l for l in p.stdout.splitlines() if l.startswith("{")]
            rec = json.loads(line[-1]) if line else {"name": name, "error": p.stderr[-1500:] or f"exit {p.returncode}"}
        except subprocess.TimeoutExpired:
            rec = {"name": name, "error": f"timed out after {timeout:g} s"}
        except json.JSONDecodeError as e:
            rec = {"name": name, "error": f"unreadable JSON line: {e}"}
        rec.setdefault("n_samples", int(os.environ.get("N_SAMPLES", "512")))
        with open(outfile, "a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    peer_path = os.path.abspath(argv[1])
    peer = load_peer(peer_path)
    cmd = argv[2]
    if cmd == "list":
        print("\n".join(peer.CONFIGS))
    elif cmd == "all":
        if len(argv) < 4:
            sys.exit(__doc__)
        unknown = [n for n in argv[4:] if not known(peer.CONFIGS, n)]
        if unknown:
            sys.exit(f"hf_configs.py: unknown configurations {unknown}; known: {list(peer.CONFIGS)}")
        run_all(peer_path, peer.CONFIGS, argv[3], argv[4:])
    else:
        if not known(peer.CONFIGS, cmd):
            sys.exit(f"hf_configs.py: unknown configuration {cmd!r}; known: {list(peer.CONFIGS)}")
        if cmd in TORCHAO_OFFLOAD:
            use_torchao_offload()
        if "deepspeed" in peer.CONFIGS.get(cmd, {}):
            use_single_process_group()
        if cmd not in peer.CONFIGS:  # NAME_tanh: NAME's arguments, the tanh GELU
            use_tanh_gelu()
            peer.CONFIGS[cmd] = peer.CONFIGS[cmd[: -len(TANH)]]
        peer.run_one(cmd)


if __name__ == "__main__":
    main(sys.argv)
