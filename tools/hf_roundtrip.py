#!/usr/bin/env python3
"""Check that a model directory saved by hone loads in transformers and predicts what hone predicts.

Why: hone promises that its output directory (config.json, model.safetensors, tokenizer
files) is a Hugging Face checkpoint. This loads it the way a user would and compares the
logits and predicted labels with the ones hone's predict command wrote.

How it works: AutoTokenizer.from_pretrained(MODEL_DIR) and
AutoModelForSequenceClassification.from_pretrained(MODEL_DIR) (eval mode, float32, TF32
off, on CUDA when available). Each line of TEXTS_JSONL is tokenized alone (truncation to
--max_length, transformers' default 'longest_first' for pairs, no padding) and run one at
a time, so padding cannot change anything. Line i of HONE_PREDICTIONS_JSONL is a JSON
object with at least {"logits": [...], "label": "<name>"}; the logits must agree within
--atol and the label must equal config.id2label[argmax] (not checked when num_labels is 1,
regression). config.json must hold id2label and label2id, inverse of each other and
covering 0..num_labels-1. Every problem found is listed; the exit status is 1 if there is
any, 0 otherwise.

Any family that AutoModelForSequenceClassification knows works (BERT, RoBERTa,
XLM-RoBERTa, DistilBERT, ELECTRA, ModernBERT, ...). The tokenizer's outputs are passed only
where the model takes them: a field that the model's forward does not name (DistilBERT and
ModernBERT have no token_type_ids) is dropped, and so is token_type_ids when
config.type_vocab_size is 1 (RoBERTa, XLM-RoBERTa: their tokenizers give no token types and
the model uses zeros; a BERT tokenizer in front of them would give type 1 to the second
text of a pair).

ModernBERT (model_type "modernbert") loads with attn_implementation="eager": the written-out
softmax(q kᵀ/sqrt(d) + mask) v with the sliding-window layers' band as an additive mask,
rather than whatever the default would pick (sdpa, or flash_attention_2 where asked for).
config.json names no attention implementation, so the choice is the loader's; the line
"attention:" of the output says which one ran.

Run: python3 tools/hf_roundtrip.py MODEL_DIR TEXTS_JSONL HONE_PREDICTIONS_JSONL
         [--text_column text] [--text_pair_column X] [--max_length 128] [--atol 1e-4]
         [--tokenizer DIR (default: MODEL_DIR)]
"""
import argparse
import inspect
import json
import os
import sys

try:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
except ImportError as e:  # 77: tests report a skip, not a failure
    print(f"hf_roundtrip: {e}; install torch and transformers", file=sys.stderr)
    sys.exit(77)


def read_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def check_labels(model_dir, config):
    """Problems with id2label/label2id, as read from config.json (transformers invents
    LABEL_0... defaults when they are missing, so the file itself is checked)."""
    with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as f:
        raw = json.load(f)
    problems = [f"config.json has no {k}" for k in ("id2label", "label2id") if k not in raw]
    if problems:
        return problems
    id2label = {int(k): v for k, v in raw["id2label"].items()}
    label2id = raw["label2id"]
    if sorted(id2label) != list(range(config.num_labels)):
        problems.append(f"id2label keys {sorted(id2label)} are not 0..{config.num_labels - 1}")
    if {v: k for k, v in id2label.items()} != {k: int(v) for k, v in label2id.items()}:
        problems.append(f"label2id {label2id} is not the inverse of id2label {raw['id2label']}")
    return problems


def model_fields(model, config):
    """The tokenizer outputs this model is given: those its forward names, less
    token_type_ids where there is one token type (the model's own zeros stand for it)."""
    params = inspect.signature(model.forward).parameters.values()
    named = {p.name for p in params if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    if getattr(config, "type_vocab_size", 2) <= 1:
        named.discard("token_type_ids")
    return named


# Loader arguments per model_type (config.json's), beside dtype.
LOAD_KWARGS = {"modernbert": {"attn_implementation": "eager"}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model_dir")
    ap.add_argument("texts_jsonl")
    ap.add_argument("hone_predictions_jsonl")
    ap.add_argument("--text_column", default="text")
    ap.add_argument("--text_pair_column", default=None)
    ap.add_argument("--max_length", type=int, default=128)
    ap.add_argument("--atol", type=float, default=1e-4)
    ap.add_argument("--tokenizer", default=None, help="tokenizer directory (default: MODEL_DIR)")
    args = ap.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer or args.model_dir)
    with open(os.path.join(args.model_dir, "config.json"), encoding="utf-8") as f:
        model_type = json.load(f).get("model_type")
    model = AutoModelForSequenceClassification.from_pretrained(args.model_dir, dtype=torch.float32,
                                                               **LOAD_KWARGS.get(model_type, {}))
    model.to(device).eval()
    config = model.config
    problems = check_labels(args.model_dir, config)
    fields = model_fields(model, config)
    passed = set()

    rows = read_jsonl(args.texts_jsonl)
    preds = read_jsonl(args.hone_predictions_jsonl)
    if len(preds) != len(rows):
        problems.append(f"{len(rows)} texts but {len(preds)} predictions")

    max_diff, worst, agree, compared = 0.0, None, 0, 0
    for i, (row, pred) in enumerate(zip(rows, preds)):
        pair = row[args.text_pair_column] if args.text_pair_column else None
        enc = tokenizer(row[args.text_column], pair, truncation=True,
                        max_length=args.max_length, return_tensors="pt").to(device)
        with torch.no_grad():
            inputs = {k: v for k, v in enc.items() if k in fields}
            passed.update(inputs)
            logits = model(**inputs).logits[0].double().cpu()
        theirs = torch.tensor(pred["logits"], dtype=torch.float64)
        if theirs.shape != logits.shape:
            problems.append(f"line {i + 1}: hone has {theirs.numel()} logits, transformers {logits.numel()}")
            continue
        diff = (logits - theirs).abs().max().item()
        if diff > max_diff or worst is None:
            max_diff, worst = diff, i
        if config.num_labels > 1:
            compared += 1
            label = config.id2label[int(logits.argmax())]
            if label == pred["label"]:
                agree += 1
            else:
                problems.append(f"line {i + 1}: hone says {pred['label']!r}, transformers {label!r}")

    n = min(len(rows), len(preds))
    print(f"model: {args.model_dir} ({type(model).__name__}, {config.num_labels} labels, {device})")
    print(f"inputs: {', '.join(sorted(passed)) or 'none'} (model_type {config.model_type})")
    print(f"attention: {getattr(config, '_attn_implementation', None)}")
    print(f"examples: {n}")
    if worst is not None:
        print(f"max abs logit difference: {max_diff:.3e} (line {worst + 1}; atol {args.atol:g})")
    print(f"label agreement: {agree}/{compared}" if config.num_labels > 1
          else "label agreement: not checked (num_labels = 1, regression)")
    if max_diff > args.atol:
        problems.append(f"max abs logit difference {max_diff:.3e} exceeds atol {args.atol:g}")
    if problems:
        shown = problems[:20] + ([f"... and {len(problems) - 20} more"] if len(problems) > 20 else [])
        print("FAIL:\n  " + "\n  ".join(shown), file=sys.stderr)
        return 1
    print("OK: transformers loads the directory and agrees with hone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
