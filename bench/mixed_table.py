#!/usr/bin/env python3
"""Prints the mixed-precision hone vs HF Trainer table from one bench/mixed_bench.sh folder.
Usage: python3 bench/mixed_table.py OUT_DIR/mixed [CONFIG...]   (CONFIG: bs<B>_<bf16|fp16>[_tanh])

Throughput: train_samples_per_second of each. MFU: model FLOPs per second over the GPU's
dense bf16 peak (fp16 is the same) as hone's src/core/peak_flops.cpp lists it; for hone the
FLOPs are its train_results.json's model_flops over its train_runtime (bert.h's
training_flops summed over the steps run), for HF the same count per sample times HF's
samples/s. Process memory (shared/anchors/README.md): NVML used after training less NVML
used at start, for both.
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_CONFIGS = ["bs4_bf16", "bs4_fp16", "bs8_bf16", "bs32_bf16"]

# bert-large-uncased, BertForSequenceClassification with 2 labels, at sequence length 512.
H, I, L, S, LABELS = 1024, 4096, 24, 512, 2


def training_flops_per_sample(seq=S):
    """BertForSequenceClassification::training_flops(1, seq) (include/hone/bert.h)."""
    per_token = L * (2 * (4 * H * H + 2 * H * I) + 4 * seq * H)
    per_sequence = 2 * (H * H + H * LABELS)
    return 3 * (seq * per_token + per_sequence)


# (part of the CUDA device name, bf16 TFLOP/s); the first match wins. Read from hone's table
# when the source is there, so that both columns use the peak hone uses.
FALLBACK_PEAKS = [("H100 PCIe", 756.0), ("H100", 989.4), ("H200", 989.4), ("A100", 312.0)]


def bf16_peaks():
    try:
        with open(os.path.join(HERE, "..", "src", "core", "peak_flops.cpp")) as f:
            src = f.read()
        rows = re.findall(r'\{\s*"([^"]+)"\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*,\s*([\d.]+)\s*\}', src)
        if rows:
            return [(name, float(bf16)) for name, _fp32, _tf32, bf16 in rows], "src/core/peak_flops.cpp"
    except OSError:
        pass
    return FALLBACK_PEAKS, "bench/mixed_table.py's copy of src/core/peak_flops.cpp"


def peak_for(gpu, peaks):
    if not gpu:
        return None
    for part, tflops in peaks:
        if part in gpu:
            return tflops * 1e12
    return None


def load_hone(out, cfg):
    path = os.path.join(out, f"hone_{cfg}", "train_results.json")
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def load_hf(out, cfg):
    """The last record of hf_<cfg>.jsonl; None when HF did not run, {"error": ...} when it failed."""
    path = os.path.join(out, f"hf_{cfg}.jsonl")
    if not os.path.exists(path):
        if os.path.exists(os.path.join(out, f"hf_{cfg}.log")):  # tried, but the wrapper wrote nothing
            return {"error": f"no record; see hf_{cfg}.log"}
        return None
    rec = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rec = json.loads(line)
                except ValueError:
                    rec = {"error": "unreadable line"}
    return rec if rec is not None else {"error": "no record"}


def num(d, key):
    v = d.get(key) if d else None
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def fmt(v, spec):
    return "?" if v is None else format(v, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


def main(argv):
    if len(argv) < 2:
        sys.exit(__doc__)
    out = argv[1]
    configs = argv[2:] or DEFAULT_CONFIGS
    peaks, peak_source = bf16_peaks()
    per_sample = training_flops_per_sample()

    rows, notes, res = [], [], {}
    gpus = set()
    for cfg in configs:
        m = re.fullmatch(r"bs(\d+)_(bf16|fp16)(_tanh)?", cfg)
        label = f"bs{m.group(1)} {m.group(2)}{' tanh GELU' if m.group(3) else ''}" if m else cfg
        h, p = load_hone(out, cfg), load_hf(out, cfg)
        r = {}
        n = num(p, "n_samples")  # hf_configs.py records it on error lines too
        if h is not None:
            gpu = h.get("gpu")
            if isinstance(gpu, str):  # hone says "cuda:0 (NVIDIA H100 80GB HBM3)"
                gpus.add(re.sub(r"^cuda:\d+ \((.*)\)$", r"\1", gpu))
            r["h_sps"] = num(h, "train_samples_per_second")
            flops, runtime, peak = num(h, "model_flops"), num(h, "train_runtime"), peak_for(gpu, peaks)
            if r["h_sps"] and runtime:
                n = n or round(r["h_sps"] * runtime)
            if flops and runtime and peak:
                r["h_mfu"] = flops / runtime / peak
            elif r["h_sps"] and peak:  # no model_flops: the same count per sample as HF's
                r["h_mfu"] = per_sample * r["h_sps"] / peak
                notes.append(f"{cfg}: hone MFU from samples/s (no model_flops / train_runtime in train_results.json)")
            start, after = num(h, "gpu_memory_start_mb"), num(h, "gpu_memory_after_train_mb")
            r["h_mb"] = after - start if start is not None and after is not None else None
            own = f", hone's own mfu field {100 * h['mfu']:.1f}%" if num(h, "mfu") is not None else ""
            if own or "planned_mb" in h or "gpu_memory_process_mb" in h:
                notes.append(f"{cfg}: hone plan {h.get('planned_mb', '?')} MB, this process per NVML "
                             f"{h.get('gpu_memory_process_mb', '?')} MB{own}")
        elif os.path.exists(os.path.join(out, f"hone_{cfg}.log")):
            with open(os.path.join(out, f"hone_{cfg}.log"), errors="replace") as f:
                last = [l.strip() for l in f if l.strip()][-1:] or ["(empty log)"]
            notes.append(f"{cfg}: hone error: {last[0][-300:]} (hone_{cfg}.log)")
        if p is not None and "error" not in p:
            gpus.add(p.get("gpu"))
            r["p_sps"] = num(p, "train_samples_per_second")
            peak = peak_for(p.get("gpu"), peaks)
            if r["p_sps"] and peak:
                r["p_mfu"] = per_sample * r["p_sps"] / peak
            start, after = num(p, "nvml_start_mb"), num(p, "nvml_after_train_mb")
            r["p_mb"] = after - start if start is not None and after is not None else None
        elif p is not None:
            notes.append(f"{cfg}: HF error: " + " ".join(str(p.get("error", "")).split())[-300:])
        res[cfg] = r

        # A missing result reads "error" when the run was tried (its log is there), else "not run".
        h_state = None if h is not None else ("error" if os.path.exists(os.path.join(out, f"hone_{cfg}.log")) else "not run")
        p_state = "not run" if p is None else ("error" if "error" in p else None)
        hcell = lambda key, f: h_state or f(r.get(key))
        pcell = lambda key, f: p_state or f(r.get(key))
        sps = lambda v: fmt(v, ".1f")
        pct = lambda v: "?" if v is None else f"{100 * v:.1f}%"
        mb = lambda v: "?" if v is None else f"{v:.0f}"
        both = h_state is None and p_state is None
        r["state"] = h_state or (p_state if p_state == "not run" else None)
        hs, ps = hcell("h_sps", sps), pcell("p_sps", sps)
        hm, pm = hcell("h_mfu", pct), pcell("p_mfu", pct)
        hb, pb = hcell("h_mb", mb), pcell("p_mb", mb)
        sr = fmt(ratio(r.get("h_sps"), r.get("p_sps")), ".2f") if both else ""
        mr = fmt(ratio(r.get("h_mb"), r.get("p_mb")), ".2f") if both else ""
        n_txt = f" (n={n})" if n else ""
        rows.append(f"| {label}{n_txt} | {hs} | {ps} | {sr} | {hm} | {pm} | {hb} | {pb} | {mr} |")

    print("| config | hone samples/s | HF samples/s | hone/HF | hone MFU | HF MFU | hone process MB | HF process MB | hone/HF |")
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()

    def target(desc, cfg, key, ok, show):
        r = res.get(cfg)
        if r is None:
            return f"{desc}: not run"
        v = r.get(key) if key != "mem" else ratio(r.get("h_mb"), r.get("p_mb"))
        if v is None:
            state = r.get("state")
            return f"{desc}: {'HF not run' if state == 'not run' and key == 'mem' else state or 'error'}"
        return f"{desc}: {show(v)} {'met' if ok(v) else 'missed'}"

    targets = [
        target("bs4 bf16 ≥ 250 samples/s", "bs4_bf16", "h_sps", lambda v: v >= 250, lambda v: f"{v:.1f}"),
        target("bs32 bf16 ≥ 45% MFU", "bs32_bf16", "h_mfu", lambda v: v >= 0.45, lambda v: f"{100 * v:.1f}%"),
        target("memory bs4 bf16 ≤ 0.9× HF", "bs4_bf16", "mem", lambda v: v <= 0.9, lambda v: f"{v:.2f}×"),
        target("memory bs32 bf16 ≤ 0.8× HF", "bs32_bf16", "mem", lambda v: v <= 0.8, lambda v: f"{v:.2f}×"),
    ]
    print("Targets: " + "; ".join(targets))
    print()
    gpus.discard(None)
    print(f"GPU: {', '.join(sorted(gpus)) or '?'}. MFU: {per_sample / 1e12:.4g} TFLOP per sample (bert.h training_flops, "
          f"seq 512) against the bf16 peak from {peak_source}; hone's from its model_flops / train_runtime. "
          "Process MB: NVML used after training less NVML used at start.")
    for note in notes:
        print(f"- {note}")


if __name__ == "__main__":
    main(sys.argv)
