"""Exercise 7.2's first test: a tensor saved as chunks of a random tiling (1 to 3 dims,
uneven cuts), and blocks of it (the whole, one element, an edge, a random one) read back
and compared with slicing the whole tensor."""

import numpy as np

from ..parallel import reshard
from .common import CheckFailed, expect
from .refuse import refusing


READ = (reshard.read_block,)


def tiling(rng, shape):
    """A random grid of chunks (uneven cuts) that tiles ``shape``: [(offsets, sizes)]."""
    edges = []
    for n in shape:
        k = int(rng.integers(0, min(n - 1, 3) + 1)) if n > 1 else 0
        edges.append([0] + sorted(rng.choice(np.arange(1, n), k, replace=False).tolist()) + [n] if k else [0, n])
    out = []
    for idx in np.ndindex(*[len(e) - 1 for e in edges]):
        lo = tuple(edges[d][i] for d, i in enumerate(idx))
        out.append((lo, tuple(edges[d][i + 1] - edges[d][i] for d, i in enumerate(idx))))
    return out


def blocks(rng, shape):
    whole = ((0,) * len(shape), tuple(shape))
    one = (tuple(int(rng.integers(0, n)) for n in shape), (1,) * len(shape))
    edge = (tuple(n - max(1, n // 3) for n in shape), tuple(max(1, n // 3) for n in shape))
    offs = tuple(int(rng.integers(0, n)) for n in shape)
    rand = (offs, tuple(int(rng.integers(1, n - o + 1)) for o, n in zip(offs, shape)))
    return [whole, one, edge, rand]


READ_SHAPES = [(10,), (1,), (7, 5), (8, 8), (1, 9), (4, 6, 5), (3, 1, 7), (64, 48), (32, 16, 12)]


def check_blocks(fn, what):
    rng = np.random.default_rng(7)
    for shape in READ_SHAPES:
        full = rng.standard_normal(shape)
        chunks = tiling(rng, shape)
        saved = [(off, full[tuple(slice(o, o + s) for o, s in zip(off, size))].copy()) for off, size in chunks]
        order = rng.permutation(len(saved))
        for offsets, sizes in blocks(rng, shape):
            want = full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))]
            with refusing(what, *READ):
                got = fn([saved[i] for i in order], offsets, sizes)
            got = np.asarray(got)
            expect(got.shape == tuple(sizes), f"{what}: the block at offsets {offsets} of sizes {sizes} came back with "
                                              f"shape {got.shape}; return an array of shape `sizes`")
            if not np.array_equal(got, want):
                bad = tuple(int(i) for i in np.argwhere(got != want)[0])
                raise CheckFailed(f"{what}: a tensor of shape {shape} saved as {len(saved)} chunks; the block at "
                                  f"offsets {offsets}, sizes {sizes} is wrong at {bad} (of the block). Along "
                                  f"each dim the overlap of a chunk and the block is [max of the starts, min of the "
                                  f"ends); where it starts inside the chunk is that start minus the chunk's offset, "
                                  f"inside the block minus the block's")
