#!/usr/bin/env python3
"""Writes the non-BERT variants of tests/fixtures/tokenizer/ (run after
tools/make_tokenizer_fixture.py, which writes the corpus and BERT's variants): tokenizers
trained here with the `tokenizers` package on a multilingual corpus, shaped like the
published ones, with the ids `tokenizers` gives.

usage: python3 tools/make_tokenizer_fixtures_families.py [OUT_DIR]

Variants (tokenizer.json + expected.jsonl, as BERT's; max_lengths 0, 4, 7, 16, since
RoBERTa's pair template holds 4 special tokens):
  roberta          byte-level BPE as roberta-base: ByteLevel (add_prefix_space false),
                   RobertaProcessing, <s> <pad> </s> <unk> <mask> (<mask> lstrip), merges in
                   the older "a b" string form
  modernbert       byte-level BPE as ModernBERT: NFC, ByteLevel, TemplateProcessing with
                   [CLS]/[SEP], [MASK] lstrip, non-special added tokens
  bpe_options      byte-level BPE as GPT-2 with options: add_prefix_space, ignore_merges,
                   ByteLevel post-processor, NFKC + Lowercase + Strip + Replace, merges as
                   [["a", "b"]] lists
  xlmr             Unigram as xlm-roberta-base: Precompiled (sentencepiece's nmt_nfkc
                   charsmap) + Replace(" {2,}" -> " "), Metaspace (prepend always), the <s>
                   template, <mask> lstrip
  unigram_options  Unigram with NFKC + Lowercase + Replace(String), WhitespaceSplit then
                   Metaspace (prepend first, no split), a template with type ids 1

Their corpus is tests/fixtures/tokenizer/corpus.jsonl followed by corpus_families.jsonl
(texts for these families: their special tokens in the text, spaces, contractions,
Metaspace and byte-level characters); expected.jsonl has a line for each.

The Precompiled charsmap is the one in huggingface/spm_precompiled's src/precompiled.json
(commit 3795b14343d25782df654b49f5c3e9f2a7db7d6f), sentencepiece's nmt_nfkc map as
xlm-roberta-base's tokenizer.json holds it; it is read from PRECOMPILED_JSON (default
/work/.mirror/huggingface+spm_precompiled/precompiled.json) or, when absent, from the
stored xlmr/tokenizer.json.
"""
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import tokenizer_parity as tp  # noqa: E402

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, processors, trainers, decoders  # noqa: E402

MAX_LENGTHS = [0, 4, 7, 16]

FAMILY_TEXTS = [
    "<s>hello</s> world", "a <mask> b", "a<mask>b", "   <mask>   x", "<mask>", "x <mask>", "<pad><unk></s>",
    "<s> <s>", "[CLS] x [SEP] y [MASK] z", " [MASK]", "  [MASK]  end", "word[MASK]word",
    "multiple   spaces    here", " leading space", "trailing space ", "  both  ", "a\t\tb\n\nc \n d",
    "it's I'll we've they're she'd I'm don't IT'S", "'s'll 'd '' ``quoted''", "numbers 12345 ١٢٣ ๑๒๓ 3.14 x2",
    "▁already ▁metaspace▁▁here", "Ġbyte Ċlevel ĠĠ", "|||EMAIL_ADDRESS||| mail|||EMAIL_ADDRESS|||",
    "a  b   c    d", "ＡＢＣ１２３ ﬁ ① ™ ㍿ ¼", "e\u0301 vs é, n\u0303 vs ñ", "Ǆ ǅ ǆ Ⅷ", "\u00a0nbsp\u00a0 \u3000ideo",
    "Hello World HELLO", "The café on the Straße near Αθήνα and Москва",
    "日本語のテキストと中文混合 한국어", "عربي مع English و 123", "emoji 😀👍🏽 👨\u200d👩\u200d👧 🇺🇸",
]
FAMILY_PAIRS = [
    ("<s>q</s>", "a <mask> b"), ("  spaced  ", "   "), ("Привет мир", "Γειά σου Κόσμε"),
    ("中文", "日本語のテキスト"), ("it's", "they're"), ("one two three four five", "six seven eight nine ten"),
]

# Training text: the shared corpus, these texts, and sentences in several scripts.
TRAINING = [
    "The quick brown fox jumps over the lazy dog. Tokenizers split words into pieces.",
    "Le café était délicieux, et la crème brûlée aussi. Où est la bibliothèque?",
    "Der schnelle braune Fuchs springt über den faulen Hund. Straße, Größe, Übung.",
    "El niño comió una manzana. ¿Dónde está la estación? ¡Qué bueno!",
    "Tiếng Việt có nhiều dấu thanh. Năm mới vui vẻ.",
    "Быстрая коричневая лиса прыгает через ленивую собаку. Привет, как дела?",
    "Η γρήγορη καφέ αλεπού πηδά πάνω από τον τεμπέλη σκύλο. Καλημέρα κόσμε.",
    "敏捷的棕色狐狸跳过了懒狗。我们今天去公园散步。", "素早い茶色の狐が怠惰な犬を飛び越える。今日はいい天気ですね。",
    "빠른 갈색 여우가 게으른 개를 뛰어넘는다. 안녕하세요.", "الثعلب البني السريع يقفز فوق الكلب الكسول. مرحبا بالعالم.",
    "שועל חום מהיר קופץ מעל הכלב העצלן.", "तेज़ भूरी लोमड़ी आलसी कुत्ते के ऊपर कूदती है।",
    "สุนัขจิ้งจอกสีน้ำตาลกระโดดข้ามสุนัขขี้เกียจ", "I love it 🥰🔥💯 so much 😀😀 👍🏽",
    "it's, don't, we're, they've, I'll, she'd, I'm — contractions", "1234567890 3.14159 1,000,000 50% $5.00",
    "   indented    text\twith\ttabs\nand newlines   ", "café naïve résumé Ångström façade São Paulo",
]


def rows_of(texts, pairs):
    return [{"text": t} for t in texts] + [{"text": a, "text_pair": b} for a, b in pairs]


def training_lines(corpus):
    lines = TRAINING * 20 + FAMILY_TEXTS * 3
    for r in corpus:
        lines.append(r["text"])
        if r.get("text_pair"):
            lines.append(r["text_pair"])
    return lines


def set_added(tok_json, content, **flags):
    for a in tok_json["added_tokens"]:
        if a["content"] == content:
            a.update(flags)
            return
    raise KeyError(content)


def save(tok, d, edit=None):
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "tokenizer.json")
    tok.save(path)
    with open(path, encoding="utf-8") as f:
        j = json.load(f)
    j["truncation"] = j["padding"] = None
    if edit:
        edit(j)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(j, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    Tokenizer.from_file(path)  # `tokenizers` must read what was written


def byte_level_bpe(lines, specials, vocab_size, add_prefix_space, normalizer=None):
    tok = Tokenizer(models.BPE())
    if normalizer:
        tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    return tok


def unigram(lines, specials, vocab_size, normalizer, pre_tokenizer):
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizer
    tok.pre_tokenizer = pre_tokenizer
    trainer = trainers.UnigramTrainer(vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>",
                                      show_progress=False)
    tok.train_from_iterator(lines, trainer)
    return tok


def precompiled_charsmap(out):
    src = os.environ.get("PRECOMPILED_JSON", "/work/.mirror/huggingface+spm_precompiled/precompiled.json")
    if os.path.exists(src):
        with open(src, encoding="utf-8") as f:
            return json.load(f)["precompiled_charsmap"]
    with open(os.path.join(out, "xlmr", "tokenizer.json"), encoding="utf-8") as f:
        return json.load(f)["normalizer"]["normalizers"][0]["precompiled_charsmap"]


def main():
    import base64
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "tokenizer")
    corpus = tp.read_jsonl(os.path.join(out, "corpus.jsonl"))
    extra = rows_of(FAMILY_TEXTS, FAMILY_PAIRS)
    with open(os.path.join(out, "corpus_families.jsonl"), "w", encoding="utf-8") as f:
        for r in extra:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    lines = training_lines(corpus + extra)
    charsmap = precompiled_charsmap(out)

    # roberta
    tok = byte_level_bpe(lines, ["<s>", "<pad>", "</s>", "<unk>", "<mask>"], 1500, False)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True,
                                                      add_prefix_space=False)

    def roberta_edit(j):
        for a in j["added_tokens"]:
            a["normalized"] = a["content"] != "<mask>"
        set_added(j, "<mask>", lstrip=True)
        j["model"]["merges"] = [" ".join(m) for m in j["model"]["merges"]]
    save(tok, os.path.join(out, "roberta"), roberta_edit)

    # modernbert
    tok = byte_level_bpe(lines, ["<|endoftext|>", "[UNK]", "[CLS]", "[SEP]", "[PAD]", "[MASK]"], 1500, False,
                         normalizers.NFC())
    tok.add_tokens([AddedToken("|||EMAIL_ADDRESS|||", normalized=True, special=False),
                    AddedToken("  ", normalized=False, special=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    save(tok, os.path.join(out, "modernbert"), lambda j: set_added(j, "[MASK]", lstrip=True))

    # bpe_options
    norm = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip(),
                                 normalizers.Replace("``", '"')])
    tok = byte_level_bpe(lines, ["<|endoftext|>"], 1200, True, norm)
    tok.post_processor = processors.ByteLevel(trim_offsets=True)

    def options_edit(j):
        j["model"]["ignore_merges"] = True
    save(tok, os.path.join(out, "bpe_options"), options_edit)

    # xlmr
    norm = normalizers.Sequence([normalizers.Precompiled(base64.b64decode(charsmap)),
                                 normalizers.Replace(Regex(" {2,}"), " ")])
    tok = unigram(lines, ["<s>", "<pad>", "</s>", "<unk>"], 2000, norm,
                  pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always", split=True))
    tok.add_special_tokens([AddedToken("<mask>", lstrip=True, special=True, normalized=False)])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>",
        special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))])
    save(tok, os.path.join(out, "xlmr"))

    # unigram_options
    norm = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Replace("''", '"')])
    pre = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                   pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)])
    tok = unigram(lines, ["[CLS]", "[SEP]", "<pad>", "<unk>"], 1500, norm, pre)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS]:0 $A:0 [SEP]:0", pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    save(tok, os.path.join(out, "unigram_options"))

    rows = corpus + extra
    for name in ("roberta", "modernbert", "bpe_options", "xlmr", "unigram_options"):
        d = os.path.join(out, name)
        ref = tp.load_reference(d)
        per_m = {m: tp.reference_encode(ref, rows, m) for m in MAX_LENGTHS}
        with open(os.path.join(d, "expected.jsonl"), "w", encoding="utf-8") as f:
            for i in range(len(rows)):
                f.write(json.dumps({"ids": {str(m): per_m[m][i]["ids"] for m in MAX_LENGTHS},
                                    "type_ids": {str(m): per_m[m][i]["type_ids"] for m in MAX_LENGTHS}},
                                   separators=(",", ":")) + "\n")
        size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
        print(f"{name}: vocab {ref.get_vocab_size()}, {len(rows)} lines, {size / 1e3:.0f} kB")


if __name__ == "__main__":
    main()
