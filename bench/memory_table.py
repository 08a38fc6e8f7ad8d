#!/usr/bin/env python3
"""Prints the memory-method hone vs HF Trainer table from bench/memory_bench.sh folders.
Usage: python3 bench/memory_table.py OUT_DIR/memory [OUT_DIR2/memory ...]

Several folders (calls that each ran part of CONFIGS) make one table: a configuration's hone
result comes from the first folder that has one, and so does each Trainer configuration's.
Process MB, both sides (as shared/anchors/README.md): NVML device-wide used after training less
used at start. The estimate (`hone estimate ... --device cuda`: the CUDA context and libraries
as measured in its own process, plus the plan) predicts NVML's figure for the training process
itself, so it is compared with that: hone's gpu_memory_process_mb (NVML's per-process used after
training). Seconds: hone's train_runtime and the whole process (start to exit, saving the model
included); Trainer's wall_s (around trainer.train()) and the whole wrapper process.
"""
import json
import os
import re
import sys

PREDICTED = re.compile(r"predicted GPU memory of the run \(NVML, this process\): (\d+) MB")


def read_kv(path):
    try:
        with open(path) as f:
            return dict(line.rstrip("\n").split("=", 1) for line in f if "=" in line)
    except OSError:
        return {}


def read_text(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return None


def last_line(path):
    text = read_text(path)
    lines = [l.strip() for l in (text or "").splitlines() if l.strip()]
    return lines[-1] if lines else "(empty log)"


def num(d, key):
    v = d.get(key) if d else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def wall(path):
    text = read_text(path)
    try:
        return float(text) if text else None
    except ValueError:
        return None


def diff(a, b):
    return a - b if a is not None and b is not None else None


def ratio(a, b):
    return a / b if a is not None and b else None


def failed_state(log):
    """"skipped" or "error" for a run whose log is there and whose result is not, else "not run"."""
    if read_text(log) is None:
        return "not run"
    return "skipped" if last_line(log).startswith("skipped") else "error"


def load_hone(d, name, cfg):
    """hone's figures of run hone_<name> in folder d: a dict with "state" None when it ran."""
    text = read_text(os.path.join(d, f"hone_{name}", "train_results.json"))
    try:
        h = json.loads(text) if text else None
    except ValueError:
        h = None
    log = os.path.join(d, f"hone_{name}.log")
    if h is None:
        state = failed_state(log)
        return {"state": state, "note": f"hone {name}: {last_line(log)[-300:]}" if state != "not run" else None}
    est = PREDICTED.search(read_text(os.path.join(d, f"estimate_{cfg}.log")) or "")
    return {"state": None, "sps": num(h, "train_samples_per_second"), "runtime": num(h, "train_runtime"),
            "mb": diff(num(h, "gpu_memory_after_train_mb"), num(h, "gpu_memory_start_mb")),
            "proc_mb": num(h, "gpu_memory_process_mb"), "wall": wall(os.path.join(d, f"hone_{name}.wall")),
            "est_mb": int(est.group(1)) if est else None}


def load_hf(d, name):
    """The last record of hf_<name>.jsonl in folder d, as a dict like load_hone's."""
    log = os.path.join(d, f"hf_{name}.log")
    rec = None
    for line in (read_text(os.path.join(d, f"hf_{name}.jsonl")) or "").splitlines():
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                rec = {"error": "unreadable line"}
    if rec is None:
        state = failed_state(log)
        return {"state": state, "note": f"HF {name}: {last_line(log)[-300:]}" if state != "not run" else None}
    if "error" in rec:
        return {"state": "error", "note": f"HF {name}: " + " ".join(str(rec["error"]).split())[-300:]}
    return {"state": None, "sps": num(rec, "train_samples_per_second"), "runtime": num(rec, "wall_s"),
            "mb": diff(num(rec, "nvml_after_train_mb"), num(rec, "nvml_start_mb")),
            "wall": wall(os.path.join(d, f"hf_{name}.wall"))}


def first_result(dirs, load):
    """The first folder's result that ran, else the first that was tried, else "not run"."""
    results = [load(d) for d in dirs]
    for r in results:
        if r["state"] is None:
            return r
    for r in results:
        if r["state"] != "not run":
            return r
    return {"state": "not run", "note": None}


def fmt(v, spec, unit=""):
    return "?" if v is None else format(v, spec) + unit


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    dirs = argv[1:]
    configs = {}  # configuration -> (Trainer's name, hone flags), in the order first listed
    for d in dirs:
        for line in (read_text(os.path.join(d, "configs.tsv")) or "").splitlines():
            parts = line.split("\t")
            if len(parts) == 3:
                configs.setdefault(parts[0], (parts[1], parts[2]))
    if not configs:
        sys.exit(f"memory_table.py: no configs.tsv in {', '.join(dirs)}")
    envs = [read_kv(os.path.join(d, "env.txt")) for d in dirs]

    hone = {c: first_result(dirs, lambda d, c=c: load_hone(d, c, c)) for c in configs}
    hf = {}
    for name, _ in configs.values():
        hf.setdefault(name, first_result(dirs, lambda d, name=name: load_hf(d, name)))
    colds = []  # (configuration, folder's env, result) of each folder's cold run
    for d, env in zip(dirs, envs):
        for c in configs:
            r = load_hone(d, f"{c}_cold", c)
            if r["state"] != "not run":
                colds.append((c, env, r))

    def row(label, h, p):
        hs = lambda key, spec: h["state"] or fmt(h.get(key), spec)
        ps = lambda key, spec: p["state"] or fmt(p.get(key), spec)
        both = h["state"] is None and p["state"] is None
        est = ""
        if h["state"] is None and h.get("est_mb") is not None:
            err = ratio(diff(h["est_mb"], h.get("proc_mb")), h.get("proc_mb"))
            est = f"{h['est_mb']} vs {fmt(h.get('proc_mb'), '.0f')} ({fmt(err and 100 * err, '+.1f', '%')})"
        elif h["state"] is None:
            est = "no estimate"
        secs = lambda r: r["state"] or f"{fmt(r.get('runtime'), '.1f')} / {fmt(r.get('wall'), '.1f')}"
        return (f"| {label} | {hs('sps', '.1f')} | {ps('sps', '.1f')} | "
                f"{fmt(ratio(h.get('sps'), p.get('sps')), '.2f') if both else ''} | {hs('mb', '.0f')} | "
                f"{ps('mb', '.0f')} | {fmt(ratio(h.get('mb'), p.get('mb')), '.2f') if both else ''} | {est} | "
                f"{secs(h)} | {secs(p)} |")

    for env in {tuple(sorted(e.items())) for e in envs}:
        e = dict(env)
        print(f"GPU: {e.get('gpu', '?')}, driver {e.get('driver', '?')}; hone commit {e.get('commit', '?')}; "
              f"{e.get('n', '?')} samples of 512 tokens, bert-large-uncased, 1 epoch")
    print()
    print("| config | hone samples/s | HF samples/s | hone/HF | hone process MB | HF process MB | hone/HF | "
          "hone estimate vs NVML process MB (error) | hone s: train / process | HF s: train() / process |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c, (name, _) in configs.items():
        for cold_cfg, env, r in colds:
            if cold_cfg == c:
                when = ("cold (first run on this machine)" if env.get("machine") == "fresh"
                        else "first run of its call (machine used before: not cold)")
                print(row(f"{c}, {when}", r, hf[name]))
        print(row(c if name == c else f"{c} (HF: {name})", hone[c], hf[name]))
    print()

    def judge(v, ok, show):
        return f"{show(v)} {'met' if ok(v) else 'missed'}"

    def versus(c, key, ok):
        h, p = hone[c], hf[configs[c][0]]
        if h["state"] or p["state"]:
            return f"hone {h['state']}" if h["state"] else f"HF {p['state']}"
        v = ratio(h.get(key), p.get(key))
        return "?" if v is None else judge(v, ok, lambda v: f"{v:.2f}×")

    def estimate(c):
        h = hone[c]
        if h["state"]:
            return f"hone {h['state']}"
        if h.get("est_mb") is None:
            return f"no estimate (estimate_{c}.log)"
        if h.get("proc_mb") is None:
            return "no NVML figure for the process"
        err = ratio(diff(h["est_mb"], h["proc_mb"]), h["proc_mb"])
        return "?" if err is None else judge(err, lambda v: abs(v) <= 0.01, lambda v: f"{100 * v:+.1f}%")

    print("| config | samples/s ≥ 3× HF | process memory ≤ 0.8× HF | estimate within 1% |")
    print("|---|---|---|---|")
    for c in configs:
        print(f"| {c} | {versus(c, 'sps', lambda v: v >= 3)} | {versus(c, 'mb', lambda v: v <= 0.8)} | {estimate(c)} |")
    print()
    lines = []
    if "combined_bs1x4" in configs:
        h = hone["combined_bs1x4"]
        v = h.get("mb") if h["state"] is None else None
        lines.append("combined_bs1x4 process memory ≤ 3000 MB: "
                     + (h["state"] or ("?" if v is None else judge(v, lambda v: v <= 3000, lambda v: f"{v:.0f} MB"))))
    for c in ("bf16_ckpt_bs32", "bf16_ckpt_selective_bs32"):
        if c not in configs:
            continue
        mem = versus(c, "mb", lambda v: v <= 0.4)
        base = hone.get("bf16_bs32")
        if base is None:
            speed = "bf16_bs32 not in CONFIGS"
        elif hone[c]["state"] or base["state"]:
            speed = f"hone {hone[c]['state'] or base['state']}"
        else:
            v = ratio(hone[c].get("sps"), base.get("sps"))
            speed = "?" if v is None else judge(v, lambda v: v >= 0.75, lambda v: f"{v:.2f}×")
        lines.append(f"{c} memory ≤ 0.4× HF {configs[c][0]}: {mem}; samples/s ≥ 0.75× hone bf16_bs32: {speed}")
    for line in lines:
        print(f"- {line}")
    print()
    print("Process MB: NVML device-wide used after training less used at start, both sides. The estimate "
          "(`hone estimate <same flags> --device cuda`: CUDA context and libraries measured in its own process, "
          "plus the plan) is compared with NVML's figure for the training process after training "
          "(train_results.json gpu_memory_process_mb), the quantity it predicts. Seconds: hone train_runtime / "
          "whole process (saving the model included); HF wall_s around trainer.train() / whole wrapper process.")
    for c, (name, flags) in configs.items():
        print(f"- {c}: hone {flags}; Trainer {name}")
    notes = [r["note"] for r in list(hone.values()) + list(hf.values()) + [r for _, _, r in colds] if r.get("note")]
    for note in dict.fromkeys(notes):
        print(f"- {note}")


if __name__ == "__main__":
    main(sys.argv)
