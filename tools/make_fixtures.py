#!/usr/bin/env python3
"""Golden fixtures from real transformers, for hone's parity tests.

Run where torch and transformers are installed (it forces the CPU):
    python3 tools/make_fixtures.py tests/fixtures                      every case
    python3 tools/make_fixtures.py tests/fixtures --cases roberta_cls,electra_cls

For each case it builds a small <Family>ForSequenceClassification (hidden size not a power
of two, padding at the end of rows in the attention mask with the family's pad token id in
input_ids there, dropout off), saves it with save_pretrained (config.json +
model.safetensors), then computes in float64 (so the reference has no float32 rounding of
its own) and writes golden.safetensors:
  input_ids, attention_mask, token_type_ids, labels        the batch
  logits, loss                                             forward
  grad.<parameter name>                                    backward, every parameter
  train.<field>.<k> for k < STEPS                          the batches of a short run
  train.loss, train.grad_norm, train.lr                    per optimizer step
  final.<parameter name>                                   weights after the run
The short run applies what Trainer applies per step: loss.backward(), clip_grad_norm_,
AdamW with Trainer's weight-decay grouping, then the linear schedule with warmup.
train_args.json records the arguments, the decay group and the parameter names in
named_parameters order. After writing, each case reloads its directory with
AutoModelForSequenceClassification and checks that it gives the same logits.

Every batch has the same fields, so one loader reads them all: token_type_ids is written
for every family, but it is only passed to models whose forward takes it.

The families (tests/fixtures/FAMILIES.md has the parameter names and config fields):
  bert_cls, bert_reg (BertForSequenceClassification): sentence pairs (token type 1 on the
    second half of each row), absolute positions 0..seq-1, pooler (dense + tanh on [CLS]),
    then dropout and classifier. Pad id 0.
  roberta_cls (RobertaForSequenceClassification), xlm_roberta_reg
    (XLMRobertaForSequenceClassification, the same code under other names; regression with
    gelu_new): position ids come from the input ids, not from the mask:
    padding_idx + cumsum(input_ids != padding_idx) at real tokens and padding_idx (1) at
    pad tokens, so the first token has position 2 and max_position_embeddings must be at
    least seq + 2 (15 here, the tightest). The real tokens never hold the pad id 1.
    type_vocab_size 1 and all-zero token_type_ids (RoBERTa tokenizers give no types),
    layer_norm_eps 1e-5 as in the released checkpoints. No pooler: the head is
    dropout -> dense -> tanh -> dropout -> out_proj on the first token.
  distilbert_cls (DistilBertForSequenceClassification): its config says dim, n_layers,
    n_heads, hidden_dim, activation, dropout, attention_dropout, seq_classif_dropout;
    no token types at all (forward takes no token_type_ids: zeros are written, not
    passed), every LayerNorm has eps 1e-12 whatever the config, no pooler: the head is
    pre_classifier -> ReLU -> dropout -> classifier on the first token.
  electra_cls (ElectraForSequenceClassification): embedding_size (24) differs from
    hidden_size (48), so embeddings_project (a Linear 24 -> 48) follows the embeddings'
    LayerNorm; BERT's sentence pairs and positions otherwise. No pooler: the head is
    dropout -> dense -> gelu (exact, erf; not the config's hidden_act) -> dropout ->
    out_proj on the first token.
"""
import argparse
import inspect
import json
import os
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # float64 on the CPU; Trainer must not move the model
import torch
from safetensors.torch import save_file
from transformers import (AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification,
                          DistilBertConfig, DistilBertForSequenceClassification, ElectraConfig,
                          ElectraForSequenceClassification, RobertaConfig, RobertaForSequenceClassification,
                          TrainingArguments, Trainer, XLMRobertaConfig, XLMRobertaForSequenceClassification)

STEPS = 3
ARGS = dict(learning_rate=1e-3, weight_decay=0.01, warmup_steps=1, max_grad_norm=0.5,
            adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, lr_scheduler_type="linear",
            max_steps=STEPS)
BATCH, SEQ = 3, 13

# Shared by the BERT-like families (BertConfig's field names).
BERT_LIKE = dict(vocab_size=101, hidden_size=48, num_hidden_layers=3, num_attention_heads=3,
                 intermediate_size=80, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
ROBERTA_LIKE = dict(BERT_LIKE, max_position_embeddings=SEQ + 2, type_vocab_size=1, layer_norm_eps=1e-5,
                    pad_token_id=1, bos_token_id=0, eos_token_id=2)

# family: (config class, model class, base config fields, token types: "pair" or "zeros")
FAMILIES = {
    "bert": (BertConfig, BertForSequenceClassification,
             dict(BERT_LIKE, max_position_embeddings=40, type_vocab_size=2), "pair"),
    "roberta": (RobertaConfig, RobertaForSequenceClassification, ROBERTA_LIKE, "zeros"),
    "xlm-roberta": (XLMRobertaConfig, XLMRobertaForSequenceClassification, ROBERTA_LIKE, "zeros"),
    "distilbert": (DistilBertConfig, DistilBertForSequenceClassification,
                   dict(vocab_size=101, dim=48, n_layers=3, n_heads=3, hidden_dim=80, max_position_embeddings=40,
                        dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, pad_token_id=0,
                        sinusoidal_pos_embds=False), "zeros"),
    "electra": (ElectraConfig, ElectraForSequenceClassification,
                dict(BERT_LIKE, embedding_size=24, max_position_embeddings=40, type_vocab_size=2), "pair"),
}

CASES = {
    # name: (family, config overrides)
    "bert_cls": ("bert", dict(num_labels=3, hidden_act="gelu")),
    "bert_reg": ("bert", dict(num_labels=1, hidden_act="gelu_new")),
    "roberta_cls": ("roberta", dict(num_labels=3, hidden_act="gelu")),
    "xlm_roberta_reg": ("xlm-roberta", dict(num_labels=1, hidden_act="gelu_new")),
    "distilbert_cls": ("distilbert", dict(num_labels=3, activation="gelu")),
    "electra_cls": ("electra", dict(num_labels=3, hidden_act="gelu")),
}


def make_batch(gen, vocab, batch, seq, num_labels, pad_id=0, types_kind="pair"):
    if pad_id == 0:
        ids = torch.randint(1, vocab, (batch, seq), generator=gen)
    else:  # every id but the pad id, which would change RoBERTa's positions
        ids = torch.randint(0, vocab - 1, (batch, seq), generator=gen)
        ids += (ids >= pad_id).long()
    mask = torch.ones(batch, seq, dtype=torch.long)
    types = torch.zeros(batch, seq, dtype=torch.long)
    for b in range(batch):
        length = seq - 4 * b  # 13, 9, 5: padding at the end of all but the first
        mask[b, length:] = 0
        ids[b, length:] = pad_id
        if types_kind == "pair":
            types[b, length // 2:length] = 1  # a sentence pair: second segment has type 1
    if num_labels == 1:
        # float32 values, so that the saved labels are exactly what was used
        labels = torch.randn(batch, generator=gen).double()
    else:
        labels = torch.randint(0, num_labels, (batch,), generator=gen)
    return dict(input_ids=ids, attention_mask=mask, token_type_ids=types, labels=labels)


def model_inputs(model, batch):
    """The batch less the fields the model's forward does not take (DistilBERT: token_type_ids)."""
    accepted = inspect.signature(model.forward).parameters
    return {k: v for k, v in batch.items() if k in accepted}


def as_saved(v):
    return (v.float() if v.is_floating_point() else v).contiguous()


def decay_names(model):
    # Trainer's own grouping (needs accelerate, as Trainer does).
    args = TrainingArguments(output_dir="/tmp/hone_fixture_trainer", report_to="none", **ARGS)
    trainer = Trainer(model=model, args=args)
    return set(trainer.get_decay_parameter_names(model))


def check_reload(case_dir, batch, want_logits):
    """The saved directory, loaded the way a user would, gives the logits of the fixture."""
    model, info = AutoModelForSequenceClassification.from_pretrained(case_dir, dtype=torch.float32,
                                                                     output_loading_info=True)
    bad = {k: v for k, v in info.items() if v}
    assert not bad, f"{case_dir}: loading info {bad}"
    model = model.double().eval()
    with torch.no_grad():
        logits = model(**model_inputs(model, batch)).logits
    diff = (logits - want_logits).abs().max().item()
    assert diff < 1e-10, f"{case_dir}: reloaded logits differ by {diff:.3e}"
    return type(model).__name__, diff


def make_case(out_dir, name, family, overrides):
    config_class, model_class, base, types_kind = FAMILIES[family]
    torch.manual_seed(0)
    cfg = config_class(**base, **overrides)
    model = model_class(cfg)
    # Non-trivial LayerNorm and bias values, so that their gradients are exercised.
    with torch.no_grad():
        for pname, p in model.named_parameters():
            if "LayerNorm" in pname or "layer_norm" in pname or pname.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    case_dir = os.path.join(out_dir, name)
    os.makedirs(case_dir, exist_ok=True)
    model.save_pretrained(case_dir, safe_serialization=True)

    model = model.double()
    model.eval()  # dropout is 0 anyway; eval keeps it out of the question
    names = [n for n, _ in model.named_parameters()]
    gen = torch.Generator().manual_seed(1)
    golden = {}

    def batch_of():
        return make_batch(gen, cfg.vocab_size, BATCH, SEQ, cfg.num_labels, cfg.pad_token_id, types_kind)

    batch = batch_of()
    out = model(**model_inputs(model, batch))
    out.loss.backward()
    ref_logits = out.logits.detach().clone()
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
        b = batch_of()
        for f, v in b.items():
            golden[f"train.{f}.{k}"] = as_saved(v)
        loss = model(**model_inputs(model, b)).loss
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
    cls, diff = check_reload(case_dir, batch, ref_logits)
    print(f"{name}: reloaded as {cls} by AutoModelForSequenceClassification, logits within {diff:.1e}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_dir", nargs="?", default="tests/fixtures")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated cases to write (default: all of {','.join(CASES)})")
    args = ap.parse_args()
    cases = [c for c in args.cases.split(",") if c]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {','.join(unknown)}; known: {','.join(CASES)}")
    import transformers
    print("transformers", transformers.__version__, "torch", torch.__version__)
    for name in cases:
        family, overrides = CASES[name]
        make_case(args.out_dir, name, family, overrides)


if __name__ == "__main__":
    main()
