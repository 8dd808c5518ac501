"""DeepSpeed-Ulysses (Jacobs et al., 2023): context parallelism by all-to-all.

The sequence is split over the ``c`` ranks of a context-parallel group, but attention needs
every position of a head. An all-to-all turns "my positions, every head" into "every
position, my heads" (:func:`to_head_shards`); each rank runs ordinary attention on
``h / c`` heads; a second all-to-all turns the output back (:func:`to_sequence_shards`).
Its messages shrink as ``c`` grows, but ``c`` can be at most the number of heads.

The swap is defined here once. Two attentions run it:

* :func:`~.alternatives.ulysses_attention`: forward only, beside the ring and the
  all-gather of K/V (q, k and v stacked into one all-to-all);
* :class:`~emulator.parallel.attention_cores.UlyssesCore`: the block's attention core, with
  a backward (the same swaps for the gradients), grouped-query attention, any layout, its
  messages in the precision policy's ``cp`` dtype, its work declared and charged.

:func:`gathered_positions` gives the global position of each row after the swap (the
shards in rank order, each in its layout): a causal mask compares those.
"""

import numpy as np

from ...arrays.shape_only import contiguous
from ...errors import ConfigError
from .layout import positions


def heads_per_rank(comm, h):
    """``h / c``: the heads each rank of ``comm`` computes (``h`` must divide by ``c``)."""
    c = comm.size
    if h % c:
        raise ConfigError(f"rank {comm.global_rank}: Ulysses gives each of the {c} context-parallel ranks whole "
                          f"heads; {h} heads do not split over {c} ranks (c can be at most the number of heads)")
    return h // c


def _part(t, dim, start, n):
    return t[(slice(None),) * dim + (slice(start, start + n),)]


def _swap(comm, t, split, join, n, send):
    """All-to-all of ``t``'s ``c`` slices of ``n`` along ``split`` (slice j to rank j), the
    pieces received joined along ``join`` in rank order; sent in ``send`` (None: t's dtype)."""
    send = t.dtype if send is None else send
    parts = comm.all_to_all([contiguous(_part(t, split, j * n, n).astype(send, copy=False)) for j in range(comm.size)])
    return np.concatenate(parts, axis=join).astype(t.dtype, copy=False)


def to_head_shards(comm, t, heads=1, seq=2, send=None):
    """(..., h, n, ...) this rank's n positions, every head -> (..., h/c, c n, ...) every
    position (the shards in rank order), this rank's heads. ``heads``, ``seq``: the dims."""
    return _swap(comm, t, heads, seq, heads_per_rank(comm, t.shape[heads]), send)


def to_sequence_shards(comm, t, n, heads=1, seq=2, send=None):
    """The inverse of :func:`to_head_shards`: (..., h/c, c n, ...) -> (..., h, n, ...)."""
    return _swap(comm, t, seq, heads, n, send)


def gathered_positions(c, n, layout="contiguous"):
    """The global positions of the ``c n`` rows :func:`to_head_shards` gathers."""
    return np.concatenate([positions(r, c, n, layout) for r in range(c)])


def causal_allowed(c, n, layout="contiguous"):
    """(allowed, positions): True where a gathered query may attend to a gathered key."""
    pos = gathered_positions(c, n, layout)
    return pos[None, :] <= pos[:, None], pos
