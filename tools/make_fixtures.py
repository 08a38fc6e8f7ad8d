#!/usr/bin/env python3
"""Golden fixtures from real transformers, for hone's parity tests.

Run where torch and transformers are installed (the device machine):
    python3 tools/make_fixtures.py tests/fixtures

For each case it builds a small BertForSequenceClassification (hidden size not a power
of two, padding in the attention mask, mixed token_type_ids, dropout off), saves it with
save_pretrained (config.json + model.safetensors), then computes in float64 (so the
reference has no float32 rounding of its own) and writes golden.safetensors:
  input_ids, attention_mask, token_type_ids, labels        the batch
  logits, loss                                             forward
  grad.<parameter name>                                    backward, every parameter
  train.<field>.<k> for k < STEPS                          the batches of a short run
  train.loss, train.grad_norm, train.lr                    per optimizer step
  final.<parameter name>                                   weights after the run
The short run applies what Trainer applies per step: loss.backward(), clip_grad_norm_,
AdamW with Trainer's weight-decay grouping, then the linear schedule with warmup.
train_args.json records the arguments.
"""
import json
import os
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # float64 on the CPU; Trainer must not move the model
import torch
from safetensors.torch import save_file
from transformers import BertConfig, BertForSequenceClassification, TrainingArguments, Trainer

STEPS = 3
ARGS = dict(learning_rate=1e-3, weight_decay=0.01, warmup_steps=1, max_grad_norm=0.5,
            adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, lr_scheduler_type="linear",
            max_steps=STEPS)

CASES = {
    # name: (config overrides, labels dtype)
    "bert_cls": dict(num_labels=3, hidden_act="gelu"),
    "bert_reg": dict(num_labels=1, hidden_act="gelu_new"),
}


def make_batch(gen, vocab, batch, seq, num_labels):
    ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    mask = torch.ones(batch, seq, dtype=torch.long)
    types = torch.zeros(batch, seq, dtype=torch.long)
    for b in range(batch):
        length = seq - 4 * b  # 13, 9, 5: padding at the end of all but the first
        mask[b, length:] = 0
        ids[b, length:] = 0
        types[b, length // 2:length] = 1  # a sentence pair: second segment has type 1
    if num_labels == 1:
        # float32 values, so that the saved labels are exactly what was used
        labels = torch.randn(batch, generator=gen).double()
    else:
        labels = torch.randint(0, num_labels, (batch,), generator=gen)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)


def as_saved(v):
    return (v.float() if v.is_floating_point() else v).contiguous()


def decay_names(model):
    # Trainer's own grouping when available; its documented rule otherwise.
    args = TrainingArguments(output_dir="/tmp/hone_fixture_trainer", report_to="none", **ARGS)
    trainer = Trainer(model=model, args=args)
    return set(trainer.get_decay_parameter_names(model))


def make_case(out_dir, name, overrides):
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=101, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                     intermediate_size=80, max_position_embeddings=40, type_vocab_size=2,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, **overrides)
    model = BertForSequenceClassification(cfg)
    # Non-trivial LayerNorm and bias values, so that their gradients are exercised.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "LayerNorm" in pname or pname.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    model.save_pretrained(case_dir, safe_serialization=True)

    model = model.double()
    model.eval()  # dropout is 0 anyway; eval keeps it out of the question
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(1)
    golden = {}

    batch = make_batch(gen, cfg.vocab_size, 3, 13, cfg.num_labels)
    out = model(**batch)
    out.loss.backward()
    golden.update({k: as_saved(v) for k, v in batch.items()})
    golden["logits"] = out.logits.detach().float()
    golden["loss"] = out.loss.detach().float().reshape(1)
    for n, p in model.named_parameters():
        golden["grad." + n] = p.grad.detach().float().contiguous()
    model.zero_grad(set_to_none=True)

    decay = decay_names(model)
    groups = [
        {"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": ARGS["weight_decay"]},
        {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=ARGS["learning_rate"], betas=(ARGS["adam_beta1"], ARGS["adam_beta2"]),
                            eps=ARGS["adam_epsilon"])
    from transformers import get_scheduler
    sched = get_scheduler("linear", opt, num_warmup_steps=ARGS["warmup_steps"], num_training_steps=STEPS)
    losses, norms, lrs = [], [], []
    for k in range(STEPS):
        b = make_batch(gen, cfg.vocab_size, 3, 13, cfg.num_labels)
        for f, v in b.items():
            golden[f"train.{f}.{k}"] = as_saved(v)
        loss = model(**b).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), ARGS["max_grad_norm"])))
        lrs.append(sched.get_last_lr()[0])
        losses.append(float(loss))
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    golden["train.loss"] = torch.tensor(losses, dtype=torch.float32)
    golden["train.grad_norm"] = torch.tensor(norms, dtype=torch.float32)
    golden["train.lr"] = torch.tensor(lrs, dtype=torch.float32)
    for n, p in model.named_parameters():
        golden["final." + n] = p.detach().float().contiguous()
    save_file(golden, os.path.join(case_dir, "golden.safetensors"))
    with open(os.path.join(case_dir, "train_args.json"), "w") as f:
        json.dump(dict(ARGS, decay_parameters=sorted(decay), parameters=names), f, indent=1)
    print(f"{name}: loss {float(golden['loss'][0]):.6f}, train losses {losses}, grad norms {norms}, lrs {lrs}")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else "tests/fixtures"
    import transformers
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for name, overrides in CASES.items():
        make_case(out_dir, name, overrides)


if __name__ == "__main__":
    main()
