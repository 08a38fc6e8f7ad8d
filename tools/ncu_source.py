#!/usr/bin/env python3
"""Where a kernel's warps wait, per SASS instruction, from Nsight Compute's source page.

Usage: tools/ncu_source.py SOURCE_CSV [--top N] [--from OFFSET --to OFFSET]
  SOURCE_CSV: `ncu -i REPORT --page source --csv --print-source sass > SOURCE_CSV` of a
  report taken with `--set full --import-source yes` (one kernel launch).
Prints the samples by stall reason, the instructions by how often they ran (an instruction
run once per block and warp shows the block loop's share), and the N instructions with the
most samples: offset from the kernel's start, samples, executions, the instruction, and its
two commonest stall reasons. Warps asleep in an mbarrier wait carry no samples; the runs of
each TRYWAIT (a wait's first try, then its retry loop) show how often barriers were not
ready. --from/--to (hex offsets) sum the samples of a range.
"""
import argparse
import collections
import csv
import sys


def main(argv):
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--from", dest="lo", type=lambda s: int(s, 16))
    ap.add_argument("--to", dest="hi", type=lambda s: int(s, 16))
    args = ap.parse_args(argv)
    try:
        with open(args.csv, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        sys.exit(f"tools/ncu_source.py: cannot read {args.csv}: {e.strerror}")
    header_at = next((i for i, r in enumerate(rows) if r and r[0] == "Address"), None)
    if header_at is None:
        sys.exit(f"tools/ncu_source.py: {args.csv} has no 'Address' header row: expected the output of "
                 "`ncu -i REPORT --page source --csv --print-source sass`")
    hdr, data = rows[header_at], [r for r in rows[header_at + 1:] if r and r[0].startswith("0x")]
    ix = {h: i for i, h in enumerate(hdr)}
    needed = ["Source", "Warp Stall Sampling (All Samples)", "Instructions Executed"]
    missing = [h for h in needed if h not in ix]
    if missing or not data:
        sys.exit(f"tools/ncu_source.py: {args.csv} lacks " + (", ".join(missing) if missing else "instruction rows") +
                 ": take the report with `--set full --import-source yes`")
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]
    base = int(data[0][ix["Address"]], 16)

    def num(r, h):
        v = r[ix[h]].replace(",", "")
        return int(float(v)) if v else 0

    insts = []
    for r in data:
        reasons = sorted(((num(r, h), h[6:]) for h in stalls), reverse=True)
        insts.append((int(r[ix["Address"]], 16) - base, num(r, "Warp Stall Sampling (All Samples)"),
                      num(r, "Instructions Executed"), r[ix["Source"]].strip(), reasons))
    total = sum(i[1] for i in insts) or 1
    print(f"{rows[0][1] if len(rows[0]) > 1 else ''}\n{total} samples, {sum(i[2] for i in insts)} warp instructions")
    by_reason = collections.Counter()
    for *_, reasons in insts:
        for n, h in reasons:
            by_reason[h] += n
    print("stalls: " + ", ".join(f"{h} {100 * n / total:.1f}%" for h, n in by_reason.most_common() if n))
    by_count = collections.defaultdict(lambda: [0, 0])
    for _, s, e, _, _ in insts:
        by_count[e][0] += 1
        by_count[e][1] += s
    print("runs      instructions  samples")
    for e, (n, s) in sorted(by_count.items(), key=lambda kv: -kv[1][1])[:8]:
        print(f"{e:9d} {n:13d} {100 * s / total:7.1f}%")
    if args.lo is not None:
        hi = args.hi if args.hi is not None else 1 << 62
        s = sum(i[1] for i in insts if args.lo <= i[0] < hi)
        print(f"[{args.lo:x}, {hi:x}): {100 * s / total:.1f}% of the samples")
    # A warp asleep in mbarrier.try_wait is not sampled: how often each wait's retry loop
    # ran (its TRYWAIT after the first) says how often the barrier was not ready.
    waits = [(off, e, src) for off, _, e, src, _ in insts if "TRYWAIT" in src]
    if waits:
        print("mbarrier waits (a barrier's retry loop runs once per failed try):")
        for off, e, src in waits:
            print(f"  {off:6x} {e:9d}  {src[:70]}")
    print("offset  samples      runs  instruction / commonest stalls")
    for off, s, e, src, reasons in sorted(insts, key=lambda i: -i[1])[:args.top]:
        why = ", ".join(f"{h} {n}" for n, h in reasons[:2] if n)
        print(f"{off:6x} {100 * s / total:7.1f}% {e:9d}  {src[:70]}  ({why})")


if __name__ == "__main__":
    main(sys.argv[1:])
