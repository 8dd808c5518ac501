"""Dropout whose mask is a function of each element's position in the whole tensor.

``dropout_mask(seed, global_shape, index, p)`` gives the keep-mask (uint8, 1 byte per
element, as Megatron stores it) of the part ``index`` (a tuple of slices) of a tensor of
``global_shape``: every element's bit comes from a hash of (seed, its flat position), so
a rank holding a slice of a tensor (by heads, by columns, along the sequence) draws
exactly the bits one device would draw for that slice. A parallel run then drops the same
elements as the single-device run it is checked against.
"""

import numpy as np

_M1, _M2 = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB)


def _mix(z):
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def dropout_mask(seed, global_shape, index, p):
    """uint8 keep-mask (1 = kept) for ``index`` of a tensor of ``global_shape``."""
    grids = np.ix_(*[np.arange(n)[sl] for n, sl in zip(global_shape, index)])
    flat = np.ravel_multi_index(tuple(np.broadcast_arrays(*grids)), global_shape).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = _mix(flat + np.uint64(seed) * np.uint64(0x9E3779B97F4A7C15))
    u = (h >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return (u >= p).astype(np.uint8)


def apply(x, mask, p):
    """Dropout forward (and backward: the same on the gradient): zero the dropped, scale
    the kept by 1/(1-p)."""
    return x * mask * (1.0 / (1.0 - p)) if p else x
