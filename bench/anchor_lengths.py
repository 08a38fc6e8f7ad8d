"""The row lengths of the varlen batch (64 x 512, lengths uniform in 16..512) that
shared/anchors/hf_infer_bench.py times, drawn from its generator in its order, comma-separated
for `infer_bench --lengths`: HF pads those rows to 512 and computes every position, so its
figure does not depend on them, where hone's packed batch does. With `bf16-only`, the rows of a
run of its bf16 configurations alone (as .carry's copy of the script runs); by default, of its
bf16 pass after the fp32 + tf32 pass, as the whole script runs.
Usage: python3 bench/anchor_lengths.py [bf16-only]"""
import sys
import torch

g = torch.Generator().manual_seed(0)
passes_before = 0 if sys.argv[1:] == ["bf16-only"] else 1
for _ in range(passes_before):  # a whole pass: ids of each shape, and the varlen batch's lengths
    for bs, seq in [(64, 128), (64, 512), (64, 512)]:
        torch.randint(100, 30000, (bs, seq), generator=g)
    torch.randint(16, 512 + 1, (64,), generator=g)
    torch.randint(100, 30000, (1, 128), generator=g)
for bs, seq in [(64, 128), (64, 512), (64, 512)]:
    torch.randint(100, 30000, (bs, seq), generator=g)
print(",".join(str(int(n)) for n in torch.randint(16, 512 + 1, (64,), generator=g)))
