"""Resharding: reading the block a rank needs from the chunks another mesh saved.

A sharded checkpoint stores each tensor as **chunks**: rectangular blocks, each given by
its ``offsets`` (where it starts, along every dim of the whole tensor) and its ``sizes``
(its shape), as ``torch.distributed.checkpoint`` records them
(``ChunkStorageMetadata(offsets, sizes)`` in ``torch/distributed/checkpoint/metadata.py``).
A rank of a new mesh needs one block (its placement says which); from every saved chunk
that overlaps it, it reads the overlap. Along each dim the overlap of ``[a, a + n)`` and
``[b, b + m)`` is ``[max(a, b), min(a + n, b + m))``; two blocks overlap when every dim
does, and the overlap is the block of those ranges (``overlap``; torch's version is
``_shards_get_overlap_region_wrt_saved_tensor`` in ``torch/distributed/checkpoint/resharding.py``).

ZeRO does not cut blocks: it cuts a layer's parameters laid end to end, so a rank holds a
*range* of a tensor's elements in C order. A range is a union of at most ``2 ndim - 1``
blocks (a partial first row, whole rows, a partial last row, recursively):
``flat_range_blocks``, so saving and loading ZeRO's slices is block reading too.

* :func:`overlap`: the overlap of a saved chunk and a wanted block, relative to each;
* :func:`read_block`: the wanted block, assembled from every saved chunk that overlaps it
  (the loader; a rank that needs ``[0:4, 8:16]`` of a tensor saved as four row blocks
  reads parts of two of them);
* :func:`flat_range_blocks`: the blocks of a C-order range of elements.
"""

from typing import NamedTuple

import numpy as np

from ..errors import ConfigError


class Chunk(NamedTuple):
    """A block of a tensor: ``offsets`` (per dim, where it starts) and ``sizes`` (its shape)."""

    offsets: tuple
    sizes: tuple


class Overlap(NamedTuple):
    """The region two blocks share: where it starts in the saved chunk, where in the
    wanted block, and its lengths (each per dim)."""

    saved_start: tuple
    wanted_start: tuple
    lengths: tuple


def overlap(saved, wanted):
    """The :class:`Overlap` of ``saved`` and ``wanted`` (two :class:`Chunk`\\ s of one
    tensor), or None if they share no element."""
    s_start, w_start, lengths = [], [], []
    for so, ss, wo, ws in zip(saved.offsets, saved.sizes, wanted.offsets, wanted.sizes):
        lo, hi = max(so, wo), min(so + ss, wo + ws)
        if hi <= lo:
            return None
        s_start.append(lo - so)
        w_start.append(lo - wo)
        lengths.append(hi - lo)
    return Overlap(tuple(s_start), tuple(w_start), tuple(lengths))


def read_block(saved, offsets, sizes):
    """The block ``[offsets, offsets + sizes)`` of a tensor saved as ``saved``: a list of
    ``(offsets, array)`` chunks that tile it. Every element of the block must come from
    exactly one chunk (a ConfigError says how many did)."""
    offsets, sizes = tuple(int(o) for o in offsets), tuple(int(s) for s in sizes)
    if not saved:
        raise ConfigError(f"read_block: no saved chunk to read the block at {offsets} of shape {sizes} from")
    out = np.empty(sizes, dtype=np.asarray(saved[0][1]).dtype)
    covered = 0
    for off, data in saved:
        data = np.asarray(data)
        ov = overlap(Chunk(tuple(off), data.shape), Chunk(offsets, sizes))
        if ov is None:
            continue
        src = tuple(slice(a, a + n) for a, n in zip(ov.saved_start, ov.lengths))
        dst = tuple(slice(a, a + n) for a, n in zip(ov.wanted_start, ov.lengths))
        out[dst] = data[src]
        covered += int(np.prod(ov.lengths))
    want = int(np.prod(sizes))
    if covered != want:
        raise ConfigError(f"read_block: the saved chunks cover {covered} of the {want} values of the block at "
                          f"{offsets} of shape {sizes}; the checkpoint is incomplete, or its chunks overlap")
    return out


def flat_range_blocks(shape, start, stop):
    """The blocks (:class:`Chunk`\\ s, in C order) whose union is elements ``[start,
    stop)`` of a C-order tensor of ``shape``: at most ``2 len(shape) - 1`` of them."""
    shape = tuple(int(n) for n in shape)
    if not 0 <= start <= stop <= int(np.prod(shape)):
        raise ConfigError(f"flat_range_blocks: [{start}, {stop}) is not a range of the {int(np.prod(shape))} "
                          f"elements of shape {shape}")
    if start == stop:
        return []
    if len(shape) == 1:
        return [Chunk((start,), (stop - start,))]
    inner = int(np.prod(shape[1:]))
    rest = shape[1:]

    def within(row, a, b):  # part of one row
        return [Chunk((row,) + c.offsets, (1,) + c.sizes) for c in flat_range_blocks(rest, a, b)]

    first, last = start // inner, stop // inner
    if first == last:
        return within(first, start - first * inner, stop - first * inner)
    out = []
    whole_from = first
    if start % inner:
        out += within(first, start % inner, inner)
        whole_from = first + 1
    if last > whole_from:
        out.append(Chunk((whole_from,) + (0,) * len(rest), (last - whole_from,) + rest))
    if stop % inner:
        out += within(last, 0, stop % inner)
    return out
