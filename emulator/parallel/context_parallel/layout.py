"""How a sequence is cut over the ranks of a context-parallel group.

* ``"contiguous"``: rank i holds positions ``[i s/c, (i+1) s/c)``.
* ``"zigzag"``: the sequence is cut into ``2c`` chunks and rank i holds chunks ``i`` and
  ``2c - 1 - i``, one from each end. Under a causal mask a query sees only earlier keys,
  so the ranks with late positions would do most of the work; pairing an early chunk with
  a late one gives every rank the same amount (Megatron-LM and Llama 3 use this layout).

``positions(rank, size, n_local, layout)`` gives the global positions of a rank's rows;
``chunks_of`` the pieces (start position, length) it holds, which the ring uses to skip
blocks that a causal mask hides entirely.
"""

import numpy as np

from ...errors import ConfigError

LAYOUTS = ("contiguous", "zigzag")


def _check(size, layout):
    if layout not in LAYOUTS:
        raise ConfigError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1:
        raise ConfigError(f"size must be a positive number of ranks, got {size!r}")


def _pieces(length, size, layout):
    parts = size if layout == "contiguous" else 2 * size
    if length % parts:
        raise ConfigError(f"a sequence of {length} positions does not split into {parts} equal chunks "
                          f"({layout} over {size} ranks needs a length divisible by {parts})")
    return parts, length // parts


def chunks_of(rank, size, n_local, layout="contiguous"):
    """The pieces of the sequence rank ``rank`` holds, as (first position, length), in the
    order its rows hold them; ``n_local`` is its number of rows."""
    _check(size, layout)
    if layout == "contiguous":
        return [(rank * n_local, n_local)]
    if n_local % 2:
        raise ConfigError(f"a zigzag shard has two halves; {n_local} local positions do not split in two")
    half = n_local // 2
    return [(rank * half, half), ((2 * size - 1 - rank) * half, half)]


def positions(rank, size, n_local, layout="contiguous"):
    """Global positions of the ``n_local`` rows rank ``rank`` holds."""
    return np.concatenate([np.arange(start, start + n) for start, n in chunks_of(rank, size, n_local, layout)])


def split_sequence(x, size, layout="contiguous", dim=-2):
    """``x`` cut along ``dim`` into ``size`` shards, one per rank, in ``layout``."""
    _check(size, layout)
    x = np.asarray(x)
    if x.ndim == 0:
        raise ConfigError("split_sequence needs an array with a sequence dimension")
    d = dim % x.ndim
    parts, n = _pieces(x.shape[d], size, layout)
    pieces = np.split(x, parts, axis=d)
    if layout == "contiguous":
        return [p.copy() for p in pieces]
    return [np.concatenate([pieces[i], pieces[parts - 1 - i]], axis=d) for i in range(size)]


def gather_sequence(shards, layout="contiguous", dim=-2):
    """The inverse of :func:`split_sequence`: the whole sequence from every rank's shard."""
    shards = [np.asarray(s) for s in shards]
    _check(len(shards), layout)
    if len({s.shape for s in shards}) != 1:
        raise ConfigError(f"gather_sequence: shards of different shapes {sorted({s.shape for s in shards})}")
    d = dim % shards[0].ndim
    if layout == "contiguous":
        return np.concatenate(shards, axis=d)
    size = len(shards)
    if shards[0].shape[d] % 2:
        raise ConfigError("gather_sequence: zigzag shards have two halves; their length must be even")
    halves = [np.split(s, 2, axis=d) for s in shards]
    order = [halves[i][0] for i in range(size)] + [halves[size - 1 - i][1] for i in range(size)]
    return np.concatenate(order, axis=d)
