"""Writes N texts whose lengths are uniform in LO..HI tokens under a WordPiece vocabulary:
each text is L - 2 whole words of the vocabulary (one token each) for [CLS] and [SEP], with
a label of two. Usage: python3 bench/varlen_data.py VOCAB_TXT N LO HI OUT_JSONL"""
import json, random, re, sys

vocab, n, lo, hi, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
words = [w for w in (l.rstrip("\n") for l in open(vocab, encoding="utf-8")) if re.fullmatch(r"[a-z]{3,}", w)]
rng = random.Random(0)
with open(out, "w") as f:
    for _ in range(n):
        length = rng.randint(lo, hi)
        f.write(json.dumps({"text": " ".join(rng.choices(words, k=length - 2)), "label": rng.choice("ab")}) + "\n")
