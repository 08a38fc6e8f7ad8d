"""A model of the Hopper attention forward's tile orders (docs/design/fused-attention.md).

Packed batches of 64 sequences, lengths uniform in 16..512, 16 heads; tiles of 192 query
rows (three warpgroups of 64) walking key blocks of 128; 132 persistent CTAs. A tile's
work is its key blocks (model 0) or its key blocks weighted by the warpgroups with rows
(model 1). Prints, per order, the busiest CTA's work over the mean (1.0 is perfect).
"""
import heapq
import math
import random

CTAS, HEADS, ROWS, KEYS = 132, 16, 192, 128


def tiles(lengths):
    out = []
    for b, n in enumerate(lengths):
        for qt in range(math.ceil(n / ROWS)):
            groups = min(3, math.ceil((n - qt * ROWS) / 64))
            out += [(b, h, qt, math.ceil(n / KEYS), groups) for h in range(HEADS)]
    return out


def work(t, model):
    blocks, groups = t[3], t[4]
    return blocks if model == 0 else blocks * (1 + groups) / 4 + 0.3


def turns_order(lengths):  # tile_coords, packed: the last query tiles of every pair first
    return sorted(tiles(lengths), key=lambda t: (-t[2], t[0], t[1]))


def by_work(lengths):  # sort_pairs_by_work: key blocks x 4 + groups, heaviest first, stable
    return sorted(tiles(lengths), key=lambda t: (-(t[3] * 4 + t[4]), t[0] * 3 + t[2], t[1]))


def turns(order, model, snake=False):
    load = [0.0] * CTAS
    for i, t in enumerate(order):
        r, c = divmod(i, CTAS)
        load[CTAS - 1 - c if snake and r % 2 else c] += work(t, model)
    return max(load)


def greedy(order, model):  # each CTA takes the next tile when it is free (tickets)
    free = [(0.0, c) for c in range(CTAS)]
    for t in order:
        at, c = heapq.heappop(free)
        heapq.heappush(free, (at + work(t, model), c))
    return max(at for at, _ in free)


random.seed(1)
for model in (0, 1):
    rows = {}
    for _ in range(5):
        lengths = [random.randint(16, 512) for _ in range(64)]
        mean = sum(work(t, model) for t in tiles(lengths)) / CTAS
        for name, busiest in (("turns", turns(turns_order(lengths), model)),
                              ("tickets", greedy(turns_order(lengths), model)),
                              ("heaviest first, turns", turns(by_work(lengths), model)),
                              ("heaviest first, forward and back", turns(by_work(lengths), model, snake=True))):
            rows.setdefault(name, []).append(busiest / mean)
    print(f"model {model}: " + ", ".join(f"{k} {sum(v) / len(v):.3f}" for k, v in rows.items()))
