"""Resharding's pieces: the overlap of two blocks, reading a block from saved chunks, and the
blocks of a C-order range (how ZeRO's flat slices become blocks)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator import ConfigError
from emulator.parallel.reshard import Chunk, flat_range_blocks, overlap, read_block


def mask(shape, chunk):
    m = np.zeros(shape, bool)
    m[tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes))] = True
    return m


@st.composite
def two_blocks(draw):
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 7)) for _ in range(ndim))

    def block():
        offs = tuple(draw(st.integers(0, n - 1)) for n in shape)
        return Chunk(offs, tuple(draw(st.integers(1, n - o)) for o, n in zip(offs, shape)))

    return shape, block(), block()


@settings(max_examples=300, deadline=None)
@given(two_blocks())
def test_overlap_is_the_intersection(case):
    shape, a, b = case
    both = mask(shape, a) & mask(shape, b)
    ov = overlap(a, b)
    if not both.any():
        assert ov is None
        return
    assert ov is not None
    # the region, placed at a's offsets + saved_start, is exactly the intersection
    at = Chunk(tuple(o + s for o, s in zip(a.offsets, ov.saved_start)), ov.lengths)
    assert np.array_equal(mask(shape, at), both)
    assert tuple(o + s for o, s in zip(b.offsets, ov.wanted_start)) == at.offsets


def test_overlap_edges():
    assert overlap(Chunk((0,), (4,)), Chunk((4,), (4,))) is None  # touching is not overlapping
    assert overlap(Chunk((0, 0), (4, 4)), Chunk((2, 4), (2, 2))) is None  # apart along one dim only
    assert overlap(Chunk((2, 3), (4, 4)), Chunk((0, 0), (8, 8))) == ((0, 0), (2, 3), (4, 4))  # inside
    assert overlap(Chunk((0, 0), (8, 8)), Chunk((2, 3), (1, 1))) == ((2, 3), (0, 0), (1, 1))  # one element


@st.composite
def tiling(draw):
    """A tensor, a grid of saved chunks that tiles it (uneven cuts), and a wanted block."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 9)) for _ in range(ndim))
    cuts = [sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=3)) if n > 1 else [])) for n in shape]
    offs = tuple(draw(st.integers(0, n - 1)) for n in shape)
    sizes = tuple(draw(st.integers(1, n - o)) for o, n in zip(offs, shape))
    return shape, cuts, Chunk(offs, sizes)


def chunks_of(full, cuts):
    edges = [[0] + c + [n] for c, n in zip(cuts, full.shape)]
    out = []
    for idx in np.ndindex(*[len(e) - 1 for e in edges]):
        lo = tuple(edges[d][i] for d, i in enumerate(idx))
        hi = tuple(edges[d][i + 1] for d, i in enumerate(idx))
        out.append((lo, full[tuple(slice(a, b) for a, b in zip(lo, hi))].copy()))
    return out


@settings(max_examples=200, deadline=None)
@given(tiling())
def test_read_block_from_any_tiling(case):
    shape, cuts, want = case
    full = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
    saved = chunks_of(full, cuts)
    got = read_block(saved[::-1], want.offsets, want.sizes)  # order of the chunks does not matter
    assert np.array_equal(got, full[tuple(slice(o, o + s) for o, s in zip(*want))])


def test_read_block_refuses_holes_and_double_cover():
    full = np.arange(16.0).reshape(4, 4)
    chunks = chunks_of(full, [[2], [2]])
    with pytest.raises(ConfigError, match="cover 12 of the 16"):
        read_block(chunks[:3], (0, 0), (4, 4))
    with pytest.raises(ConfigError, match="cover 20 of the 16"):
        read_block(chunks + chunks[:1], (0, 0), (4, 4))
    with pytest.raises(ConfigError, match="no saved chunk"):
        read_block([], (0,), (1,))


@st.composite
def ranges(draw):
    shape = tuple(draw(st.integers(1, 6)) for _ in range(draw(st.integers(1, 4))))
    n = int(np.prod(shape))
    a = draw(st.integers(0, n))
    return shape, a, draw(st.integers(a, n))


@settings(max_examples=300, deadline=None)
@given(ranges())
def test_flat_range_blocks_cover_the_range_in_order(case):
    shape, start, stop = case
    full = np.arange(int(np.prod(shape))).reshape(shape)
    blocks = flat_range_blocks(shape, start, stop)
    assert len(blocks) <= 2 * len(shape) - 1
    pieces = [full[tuple(slice(o, o + s) for o, s in zip(*b))].reshape(-1) for b in blocks]
    got = np.concatenate(pieces) if pieces else np.zeros(0, int)
    assert np.array_equal(got, np.arange(start, stop))


def test_flat_range_blocks_examples_and_bad_ranges():
    assert flat_range_blocks((4, 5), 3, 17) == [((0, 3), (1, 2)), ((1, 0), (2, 5)), ((3, 0), (1, 2))]
    assert flat_range_blocks((4, 5), 5, 15) == [((1, 0), (2, 5))]
    assert flat_range_blocks((4, 5), 7, 7) == []
    with pytest.raises(ConfigError, match="not a range"):
        flat_range_blocks((4, 5), 3, 21)
