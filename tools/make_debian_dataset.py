#!/usr/bin/env python3
"""A small real text-classification dataset: Debian package descriptions labelled by section.

Why: hone needs a real (not synthetic) dataset that is public, offline and small enough
to commit, to show that fine-tuning learns something measurable.

What: it reads the APT package index already on the machine (/var/lib/apt/lists/*_Packages*,
plain or compressed; `apt-cache dumpavail` when there is none), takes each package's
Section (without a "contrib/" or "non-free/" prefix) and its Description: the short line,
plus the long description joined with spaces where the index or a Translation-en file
(keyed by Package + Description-md5) carries one. The text is the description only: no
package name, no section, no tags.

To keep the task honest it
  - keeps one binary package per source package and section, so that "foo", "foo-data"
    and "foo-doc" (near-identical descriptions) cannot land in different splits;
  - drops transitional and dummy packages (their text says nothing about the content);
  - drops texts that occur more than once (all copies where they carry different labels).
Then it takes up to PER_CLASS packages of each section in SECTIONS, shuffles them with a
fixed seed, splits each class 80/10/10 and writes train/validation/test.jsonl with fields
{"text", "label"} to examples/debian-sections/, and prints the counts and the
majority-class baseline.

Run: python3 tools/make_debian_dataset.py [--out examples/debian-sections] [--seed 42]
(the output depends on the APT lists of the machine: the README written next to the data
records which index files were read).
"""
import argparse
import collections
import glob
import json
import os
import random
import re
import subprocess

# Topical sections with enough source packages, whose descriptions carry the signal.
# Not chosen: libs/libdevel/python/perl/... (the language, not the topic, decides),
# doc/utils/misc/admin (generic), web and math (they overlap net and science).
SECTIONS = ["games", "fonts", "sound", "graphics", "science", "net", "text"]
PER_CLASS = 600
LISTS = "/var/lib/apt/lists"
DROP = re.compile(r"\b(transitional|dummy) package\b", re.I)


def read_index(path):
    """The text of an APT index file, decompressed by apt itself when needed."""
    helper = "/usr/lib/apt/apt-helper"
    if os.path.exists(helper):
        return subprocess.run([helper, "cat-file", path], check=True,
                              capture_output=True, text=True).stdout
    with open(path, encoding="utf-8") as f:  # plain file, no apt-helper
        return f.read()


def paragraphs(text):
    """deb822 paragraphs as dicts; a field's continuation lines stay as its extra lines."""
    for block in text.split("\n\n"):
        fields, key = {}, None
        for line in block.split("\n"):
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line
            elif ":" in line:
                key, value = line.split(":", 1)
                fields[key] = value.strip()
        if "Package" in fields:
            yield fields


def join_description(value):
    """Short line + long description lines (" ." is a paragraph break) as one line."""
    lines = [l.strip() for l in value.split("\n")]
    return " ".join(l for l in lines if l and l != ".")


def load_packages():
    files = sorted(f for f in glob.glob(os.path.join(LISTS, "*_Packages*")) if not f.endswith(".diff"))
    if files:
        texts = [read_index(f) for f in files]
    else:
        texts = [subprocess.run(["apt-cache", "dumpavail"], check=True,
                                capture_output=True, text=True).stdout]
    packages = {}  # later files (security, updates) overwrite the same package
    for text in texts:
        for p in paragraphs(text):
            packages[p["Package"]] = p
    return files or ["apt-cache dumpavail"], packages


def load_translations():
    """Long descriptions from Translation-en files: (Package, Description-md5) -> text."""
    files = sorted(glob.glob(os.path.join(LISTS, "*Translation-en*")))
    long = {}
    for f in files:
        for p in paragraphs(read_index(f)):
            if "Description-en" in p:
                long[(p["Package"], p.get("Description-md5", ""))] = join_description(p["Description-en"])
    return files, long


def pick(candidates, source):
    """The package that stands for its source: the one named like it, else the shortest name."""
    return min(candidates, key=lambda p: (p["Package"] != source, len(p["Package"]), p["Package"]))


def tfidf_reference(splits):
    """Accuracy of TF-IDF + logistic regression, a cheap reference point (needs scikit-learn)."""
    try:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
    except ImportError:
        return None
    vec = TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True)
    x = vec.fit_transform([r["text"] for r in splits["train"]])
    clf = LogisticRegression(max_iter=2000, C=10).fit(x, [r["label"] for r in splits["train"]])
    return {n: float((clf.predict(vec.transform([r["text"] for r in splits[n]]))
                      == [r["label"] for r in splits[n]]).mean()) for n in ("validation", "test")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="examples/debian-sections")
    ap.add_argument("--seed", type=int, default=42)
    args = ap.parse_args()

    files, packages = load_packages()
    tfiles, long = load_translations()

    by_source = collections.defaultdict(list)  # (section, source) -> packages
    for p in packages.values():
        section = p.get("Section", "").split("/")[-1]
        if section not in SECTIONS or "Description" not in p:
            continue
        source = p.get("Source", p["Package"]).split()[0]
        by_source[(section, source)].append(p)

    examples = []
    for (section, source), candidates in by_source.items():
        p = pick(candidates, source)
        text = long.get((p["Package"], p.get("Description-md5", "")))
        text = text or join_description(p["Description"])
        text = " ".join(text.split())
        if text and not DROP.search(text):
            examples.append((text, section))

    labels_of = collections.defaultdict(set)
    for text, section in examples:
        labels_of[text].add(section)
    seen, unique = set(), []
    for text, section in examples:
        if len(labels_of[text]) == 1 and text not in seen:
            seen.add(text)
            unique.append((text, section))

    rng = random.Random(args.seed)
    splits = {"train": [], "validation": [], "test": []}
    for section in SECTIONS:
        rows = sorted(t for t, s in unique if s == section)  # sorted first: same seed, same data
        rng.shuffle(rows)
        rows = rows[:PER_CLASS]
        n_val = n_test = len(rows) // 10
        n_train = len(rows) - n_val - n_test
        parts = {"train": rows[:n_train], "validation": rows[n_train:n_train + n_val],
                 "test": rows[n_train + n_val:]}
        for name, part in parts.items():
            splits[name] += [{"text": t, "label": section} for t in part]

    os.makedirs(args.out, exist_ok=True)
    counts = {}
    for name, rows in splits.items():
        rng.shuffle(rows)
        with open(os.path.join(args.out, f"{name}.jsonl"), "w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        counts[name] = collections.Counter(r["label"] for r in rows)

    # Report: counts per class and split, majority-class baseline (majority of train).
    majority = max(SECTIONS, key=lambda s: counts["train"][s])  # ties: first in SECTIONS
    lines = ["| section | train | validation | test | total |", "|---|---:|---:|---:|---:|"]
    for s in SECTIONS:
        c = [counts[n][s] for n in splits]
        lines.append(f"| {s} | {c[0]} | {c[1]} | {c[2]} | {sum(c)} |")
    tot = [sum(counts[n].values()) for n in splits]
    lines.append(f"| **all** | {tot[0]} | {tot[1]} | {tot[2]} | {sum(tot)} |")
    baseline = {n: counts[n][majority] / sum(counts[n].values()) for n in ("validation", "test")}
    table = "\n".join(lines)
    print(table)
    print(f"majority class (train): {majority}; baseline accuracy: "
          f"validation {baseline['validation']:.4f}, test {baseline['test']:.4f}")
    tfidf = tfidf_reference(splits)
    tfidf_note = ""
    if tfidf:
        print(f"TF-IDF + logistic regression: validation {tfidf['validation']:.4f}, test {tfidf['test']:.4f}")
        tfidf_note = (f"\nA cheap reference that does learn from the text, TF-IDF (1-2 grams) + logistic "
                      f"regression trained on train:\naccuracy {tfidf['validation']:.4f} on validation, "
                      f"{tfidf['test']:.4f} on test.\n")

    sizes = sum(os.path.getsize(os.path.join(args.out, f"{n}.jsonl")) for n in splits)
    source_note = ", ".join(os.path.basename(f) for f in files)
    long_note = (f"long descriptions from {', '.join(os.path.basename(f) for f in tfiles)} "
                 f"({len(long)} entries)" if tfiles else
                 "no Translation-en file was present, so each text is the package's one-line short description")
    readme = f"""# debian-sections

A small real text-classification dataset: Debian package descriptions labelled by the
package's archive section. Built offline by `tools/make_debian_dataset.py` (seed {args.seed})
from the APT package index of the build machine ({source_note}); {long_note}.

- **Text:** the description only (no package name, section or tags).
- **Label:** the section, one of {", ".join(SECTIONS)}.
- **Deduplication:** one binary package per source package, so "foo" and "foo-data" never
  split across train and test; transitional/dummy packages dropped; duplicate texts dropped.
- **Balance:** at most {PER_CLASS} packages per section; each section split 80/10/10.
- Files: `train.jsonl`, `validation.jsonl`, `test.jsonl`, one `{{"text": ..., "label": ...}}`
  per line ({sizes / 1e6:.2f} MB in all).

{table}

Majority-class baseline (always predict `{majority}`, a largest class of train):
accuracy {baseline['validation']:.4f} on validation, {baseline['test']:.4f} on test.
{tfidf_note}"""
    with open(os.path.join(args.out, "README.md"), "w", encoding="utf-8") as f:
        f.write(readme)
    print(f"wrote {args.out}/{{train,validation,test}}.jsonl ({sizes / 1e6:.2f} MB) and README.md")


if __name__ == "__main__":
    main()
