"""Megatron-LM's tensor-parallel linear layers and their f/g operators (Shoeybi et al.,
"Megatron-LM", 2019).

Y = X A + b with A of shape (d_in, d_out), on the ranks of a tp group (``comm``):

* :class:`ColumnParallelLinear`: A split by columns. Rank r holds A[:, block r] and b's
  block r; X is replicated; the rank computes its slice of Y, no communication. In
  backward each rank's dX is a partial sum, so the layer is preceded by the f operator,
  :func:`copy_to_tp_region`: identity in forward, all-reduce of the gradient in backward.
* :class:`RowParallelLinear`: A split by rows. Rank r holds A[block r, :] and sees the
  matching block of X's columns (the column-parallel layer's output); its product is a
  partial sum of Y, completed by the g operator, :func:`reduce_from_tp_region`: all-reduce
  in forward, identity in backward. The bias is replicated and added once, after the
  reduce (added before, it would be summed ``size`` times).

Column then row (the Megatron MLP) needs one all-reduce in forward and one in backward.
"""

import numpy as np

from ..errors import ConfigError
from ..nn.linear import Linear


def copy_to_tp_region(comm, x):
    """f in forward: identity (every rank already holds x)."""
    return x


def copy_to_tp_region_backward(comm, dx):
    """f in backward: the ranks' partial input gradients are summed."""
    return comm.all_reduce(dx)


def reduce_from_tp_region(comm, y_partial):
    """g in forward: sum the partial outputs."""
    return comm.all_reduce(y_partial)


def reduce_from_tp_region_backward(comm, dy):
    """g in backward: identity (the output gradient is replicated)."""
    return dy


def _block(n, size, rank, what):
    if n % size:
        raise ConfigError(f"{what} ({n}) must be divisible by the tensor-parallel size ({size})")
    b = n // size
    return slice(rank * b, (rank + 1) * b)


class ColumnParallelLinear(Linear):
    """This rank's columns of a Linear(d_in, d_out): forward gives Y[:, block]."""

    def __init__(self, comm, d_in, d_out, bias=True, dtype=np.float32):
        super().__init__(d_in, d_out, bias=bias, dtype=dtype)
        self.comm, self.cols = comm, _block(d_out, comm.size, comm.rank, "d_out of a column-parallel layer")

    def shard(self, full):
        """This rank's parameters, cut from the full layer's."""
        out = {"w": full["w"][:, self.cols].copy()}
        if "b" in full:
            out["b"] = full["b"][self.cols].copy()
        return out


class RowParallelLinear(Linear):
    """This rank's rows of a Linear(d_in, d_out): forward takes X[:, block] and returns
    the full Y, reduced over the group, bias added once."""

    def __init__(self, comm, d_in, d_out, bias=True, dtype=np.float32):
        super().__init__(d_in, d_out, bias=bias, dtype=dtype)
        self.comm, self.rows = comm, _block(d_in, comm.size, comm.rank, "d_in of a row-parallel layer")

    def shard(self, full):
        out = {"w": full["w"][self.rows].copy()}
        if "b" in full:
            out["b"] = full["b"].copy()  # replicated
        return out

    def forward(self, params, x):
        partial, cache = super().forward({"w": params["w"]}, x)  # no bias yet
        y = reduce_from_tp_region(self.comm, partial)
        if "b" in params:
            y = y + params["b"]
        return y, cache
