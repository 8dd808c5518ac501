"""Sequence parallelism's regions (Korthikanti et al., 2022): the parts of a block that
tensor parallelism leaves replicated (norms, dropout, residuals) are split along the
sequence instead, over the same tp ranks.

Where TP has an all-reduce, SP has a reduce-scatter on one side of the region and an
all-gather on the other; all-reduce = reduce-scatter + all-gather, so the forward moves
the same bytes, and the activations of the replicated regions shrink by t. Megatron's
names (megatron/core/tensor_parallel/mappings.py):

* :func:`gather_from_sequence_parallel_region`: all-gather along the sequence in forward
  (before a column-parallel layer), reduce-scatter in backward;
* :func:`reduce_scatter_to_sequence_parallel_region`: reduce-scatter along the sequence in
  forward (after a row-parallel layer, instead of g's all-reduce), all-gather in backward.

The sequence is dim 1 of (batch, sequence, hidden) activations (Megatron's is dim 0 of
(sequence, batch, hidden)).
"""

import numpy as np

from ..errors import ConfigError

SEQ = 1


def _to_front(x, dim):
    return np.ascontiguousarray(np.moveaxis(x, dim, 0))


def all_gather_dim(comm, x, dim=SEQ):
    """Every rank's x, concatenated along ``dim``."""
    return np.moveaxis(comm.all_gather(_to_front(x, dim)), 0, dim)


def reduce_scatter_dim(comm, x, dim=SEQ):
    """Sum over ranks, this rank keeping its slice of ``dim``."""
    return np.moveaxis(comm.reduce_scatter(_to_front(x, dim)), 0, dim)


def gather_from_sequence_parallel_region(comm, x_local):
    """Forward: all-gather this rank's (b, s/t, h) slice into the whole (b, s, h)."""
    return all_gather_dim(comm, x_local)


def gather_from_sequence_parallel_region_backward(comm, dy_full):
    """Backward: each rank's gradient of the whole sequence is a partial sum;
    reduce-scatter it, keeping this rank's positions."""
    return reduce_scatter_dim(comm, dy_full)


def reduce_scatter_to_sequence_parallel_region(comm, y_partial):
    """Forward: sum the row-parallel layer's partial (b, s, h) outputs, keeping this
    rank's (b, s/t, h) positions."""
    return reduce_scatter_dim(comm, y_partial)


def reduce_scatter_to_sequence_parallel_region_backward(comm, dy_local):
    """Backward: all-gather the output gradient's slices into the whole sequence."""
    return all_gather_dim(comm, dy_local)


def sequence_slice(comm, s):
    """This rank's slice of a sequence of length s (s must divide by the group size)."""
    if s % comm.size:
        raise ConfigError(f"sequence length {s} does not split over {comm.size} tensor-parallel ranks")
    n = s // comm.size
    return slice(comm.rank * n, (comm.rank + 1) * n)
