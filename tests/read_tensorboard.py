#!/usr/bin/env python3
"""Reads the TensorBoard event file that tests/tensorboard_test.cpp wrote, with
TensorBoard's own EventAccumulator, and compares it with what the test expected.

usage: read_tensorboard.py LOG_DIR EXPECTED_JSON

EXPECTED_JSON: {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text], ...]}}
with text tags as written (the reader sees them with "/text_summary" appended, as
torch's SummaryWriter.add_text names them).

Exit status: 0 when everything matches, 1 on any mismatch (each one printed),
77 when python3 cannot import tensorboard (the test then skips).
"""
import json
import os
import struct
import sys
import time

try:
    import numpy as np
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c
    from tensorboard.util import tensor_util
except Exception as e:  # ImportError, or a broken installation
    print(f"tensorboard is not importable by {sys.executable}: {e!r}")
    sys.exit(77)


def records(path):
    """Every TFRecord of the file, checking both CRCs of each (the loader would
    otherwise stop at a bad record without saying so)."""
    with open(path, "rb") as f:
        data = f.read()
    out, pos = [], 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"truncated record header at byte {pos}")
        header = data[pos : pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8 : pos + 12])
        if length_crc != masked_crc32c(header):
            raise ValueError(f"bad length crc at byte {pos}")
        body = data[pos + 12 : pos + 12 + length]
        if len(body) != length or pos + 16 + length > len(data):
            raise ValueError(f"truncated record at byte {pos}")
        (data_crc,) = struct.unpack("<I", data[pos + 12 + length : pos + 16 + length])
        if data_crc != masked_crc32c(body):
            raise ValueError(f"bad data crc at byte {pos}")
        out.append(body)
        pos += 16 + length
    return out


def main():
    log_dir, expected_path = sys.argv[1], sys.argv[2]
    with open(expected_path) as f:
        expected = json.load(f)
    errors = []

    files = [n for n in os.listdir(log_dir) if n.startswith("events.out.tfevents.")]
    if len(files) != 1:
        print(f"expected one event file in {log_dir}, found {files}")
        return 1
    path = os.path.join(log_dir, files[0])
    n_expected = 1 + sum(len(v) for v in expected["scalars"].values()) + sum(
        len(v) for v in expected["texts"].values())
    try:
        n_records = len(records(path))
        if n_records != n_expected:
            errors.append(f"{n_records} records in the file, expected {n_expected}")
    except ValueError as e:
        errors.append(f"{path}: {e}")

    acc = event_accumulator.EventAccumulator(
        log_dir, size_guidance=event_accumulator.STORE_EVERYTHING_SIZE_GUIDANCE)
    acc.Reload()
    if acc.file_version != 2.0:
        errors.append(f"file_version {acc.file_version}, expected 2.0 (brain.Event:2)")

    tags = acc.Tags()
    want_scalars = expected["scalars"]
    if sorted(tags["scalars"]) != sorted(want_scalars):
        errors.append(f"scalar tags {sorted(tags['scalars'])}, expected {sorted(want_scalars)}")
    now = time.time()
    for tag, points in want_scalars.items():
        if tag not in tags["scalars"]:
            continue
        got = acc.Scalars(tag)
        if len(got) != len(points):
            errors.append(f"{tag}: {len(got)} scalars, expected {len(points)}")
            continue
        for ev, (step, value) in zip(got, points):
            # simple_value is a float: the double must arrive rounded to float32, exactly.
            want = float(np.float32(value))
            if ev.step != step or ev.value != want:
                errors.append(f"{tag}: (step {ev.step}, {ev.value!r}), expected (step {step}, {want!r})")
            if abs(ev.wall_time - now) > 3600:
                errors.append(f"{tag} step {step}: wall_time {ev.wall_time} is not now ({now})")

    want_texts = {tag + "/text_summary": v for tag, v in expected["texts"].items()}
    if sorted(tags["tensors"]) != sorted(want_texts):
        errors.append(f"tensor tags {sorted(tags['tensors'])}, expected {sorted(want_texts)}")
    for tag, entries in want_texts.items():
        if tag not in tags["tensors"]:
            continue
        plugin = acc.SummaryMetadata(tag).plugin_data.plugin_name
        if plugin != "text":
            errors.append(f"{tag}: plugin_name {plugin!r}, expected 'text'")
        got = acc.Tensors(tag)
        if len(got) != len(entries):
            errors.append(f"{tag}: {len(got)} entries, expected {len(entries)}")
            continue
        for ev, (step, text) in zip(got, entries):
            arr = tensor_util.make_ndarray(ev.tensor_proto)
            if arr.shape != (1,):
                errors.append(f"{tag} step {step}: tensor shape {arr.shape}, expected (1,)")
                continue
            got_text = arr[0].decode("utf-8")
            if ev.step != step or got_text != text:
                errors.append(f"{tag}: (step {ev.step}, {got_text!r}), expected (step {step}, {text!r})")

    for e in errors:
        print(e)
    if not errors:
        n = sum(len(v) for v in want_scalars.values())
        print(f"ok: {n} scalars under {len(want_scalars)} tags and "
              f"{sum(len(v) for v in want_texts.values())} text entries read back from {files[0]}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
