#!/usr/bin/env python3
"""Golden optimizer updates from the optimizers Trainer builds, for hone's optimizer tests.

    python3 tools/make_optimizer_fixtures.py tests/fixtures/optim [CASE ...]

For each case it builds a small BertForSequenceClassification (its word embeddings have
4800 elements, past bitsandbytes' 4096-element threshold for 8-bit state, but Trainer keeps
embeddings in 32-bit; the other tensors stay below it, except in the *_blockwise cases,
whose feed-forward matrices have 4800 elements each and so take bitsandbytes' 8-bit path
across more than one 256-element block), lets transformers.Trainer create the optimizer and the schedule
for TrainingArguments(optim=..., optim_args=...), and applies STEPS updates as Trainer
does: seeded gradients (scaled so that clipping engages), clip_grad_norm_, the
optimizer's step, the scheduler's step. torch and transformers optimizers run in
float64 on the CPU (a reference without float32 rounding of its own); bitsandbytes runs
in float32 on a GPU (carry its wheel to the device). Writes CASE/config.json and
CASE/steps.safetensors:
  init.<parameter name>      the parameters before the first update
  grad.<k>.<parameter name>  the gradients of update k (before clipping)
  step.<k>.<parameter name>  the parameters after update k
  lr                         the learning rate of each update
and in the metadata the TrainingArguments flags that hone is given ("args", JSON).
"""
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

STEPS = 4
ARGS = dict(learning_rate=1e-2, weight_decay=0.1, warmup_steps=0, max_grad_norm=1.0, adam_beta1=0.9,
            adam_beta2=0.999, adam_epsilon=1e-8, lr_scheduler_type="linear", max_steps=STEPS + 2)
CONFIG = dict(vocab_size=300, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=40,
              max_position_embeddings=24, type_vocab_size=2, num_labels=3)

# name: (optim, optim_args, device[, CONFIG overrides])
CASES = {
    "adamw_torch": ("adamw_torch", "", "cpu"),
    "adafactor": ("adafactor", "", "cpu"),
    "sgd": ("sgd", "", "cpu"),
    "sgd_nesterov": ("sgd", "momentum=0.9,dampening=0,nesterov=True", "cpu"),
    "sgd_dampening": ("sgd", "momentum=0.8,dampening=0.3", "cpu"),
    "adagrad": ("adagrad", "lr_decay=0.01,eps=1e-8", "cpu"),
    "lion_32bit": ("lion_32bit", "", "cuda"),
    "lion_8bit": ("lion_8bit", "", "cuda"),
    "adamw_bnb_8bit": ("adamw_bnb_8bit", "", "cuda"),
    "adamw_8bit": ("adamw_8bit", "", "cuda"),
    "adamw_8bit_blockwise": ("adamw_8bit", "", "cuda", dict(intermediate_size=300)),
    "lion_8bit_blockwise": ("lion_8bit", "", "cuda", dict(intermediate_size=300)),
}


def run_case(out_dir, name, optim, optim_args, device, config=None):
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(**{**CONFIG, **(config or {})}))
    dtype = torch.float64 if device == "cpu" else torch.float32
    model.to(device=device, dtype=dtype)
    args = dict(ARGS, optim=optim, optim_args=optim_args or None)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(model=model, args=TrainingArguments(output_dir=tmp, use_cpu=device == "cpu",
                                                              report_to="none", **args))
        optimizer = trainer.create_optimizer()
        scheduler = trainer.create_scheduler(num_training_steps=ARGS["max_steps"], optimizer=optimizer)
    params = dict(model.named_parameters())
    tensors = {f"init.{n}": p.detach().float().cpu().clone() for n, p in params.items()}
    gen = torch.Generator().manual_seed(1)
    lrs = []
    for k in range(STEPS):
        # Large enough that clipping to max_grad_norm engages on some updates, not all.
        scale = [3.0, 0.01, 0.5, 2.0][k % 4]
        for n, p in params.items():
            g = (torch.randn(p.shape, generator=gen) * scale / p.numel() ** 0.5).float()
            tensors[f"grad.{k}.{n}"] = g
            p.grad = g.to(device=device, dtype=dtype)
        torch.nn.utils.clip_grad_norm_(model.parameters(), ARGS["max_grad_norm"])
        lrs.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
        for n, p in params.items():
            tensors[f"step.{k}.{n}"] = p.detach().float().cpu().clone()
    tensors["lr"] = torch.tensor(lrs, dtype=torch.float64).float()
    flags = {k: v for k, v in args.items() if k not in ("max_steps",) and v is not None}
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    model.config.to_json_file(os.path.join(case_dir, "config.json"))
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(case_dir, "steps.safetensors"),
              metadata={"args": json.dumps(flags), "steps": str(STEPS), "optimizer": type(optimizer).__name__})
    print(f"{name}: {type(optimizer).__name__}, lr {lrs}")


def main():
    out_dir = sys.argv[1]
    names = sys.argv[2:] or list(CASES)
    for name in names:
        run_case(out_dir, name, *CASES[name])


if __name__ == "__main__":
    main()
