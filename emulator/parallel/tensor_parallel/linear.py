"""Megatron-LM's tensor-parallel linear layers, built on the f/g operators of
:mod:`.regions` (Shoeybi et al., "Megatron-LM", 2019).

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
The operators are :mod:`.regions`' (the blocks' layers use the same, through
:class:`~.regions.TPRegions`); :class:`ColumnThenRow` is the backward those layers share:
a column-parallel part feeding a row-parallel one, in B, W and B+W.
"""

import numpy as np

from ...errors import ConfigError
from ...nn.linear import Linear
from ...nn.precision import computed
from .overlap import te_pending
from .regions import reduce_from_tp_region


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


class ColumnThenRow:
    """The backward of a column-parallel part feeding a row-parallel one (attention's
    projections, the MLP), in B, W and B+W, given four pieces of the subclass:
    ``_inner(P, c, d_out)`` (the gradient into the column-parallel outputs),
    ``_input_grad(P, inner)`` (the partial input gradient), ``_gathered_input(c, dtype,
    async_op)`` and ``_weight_grads(c, d_out, dy_local, inner, xg)``."""

    def _declared(self, x, passes, what):
        """The declared pass(es) of this part for an input shaped like ``x`` (its ``work``)."""
        shape, dtype = np.shape(x), self.dtype if self.dtype is not None else x.dtype
        return self.r.comm.declared(lambda: sum((getattr(self.work(shape, dtype), p) for p in passes), ()), what)

    def backward_input(self, P, c, dy):
        with self._declared(dy, ("backward_input",), f"{type(self).__name__} backward (B)"):
            d_out = self.r.reduce_back(dy)
            inner = self._inner(P, c, d_out)
            c["backward"] = self._kept_for_w(d_out, dy, inner)
            return self.r.gather_back(self._input_grad(P, inner))

    def _kept_for_w(self, d_out, dy, inner):
        """What a split backward's W needs of its B, kept as the activations are (a bf16
        model's autograd holds them in bf16): the output's gradient (gathered, under sequence
        parallelism), its local rows (the bias's gradient) and the gradients of the
        column-parallel outputs."""
        kept = self.keep(d_out)
        return kept, (kept if dy is d_out else self.keep(dy)), [self.keep(g) for g in inner]

    @staticmethod
    def _as_read(kept):
        """The kept gradients as the weight GEMMs read them (16-bit ones in fp32)."""
        d_out, dy_local, inner = kept
        return computed(d_out), computed(dy_local), [computed(g) for g in inner]

    def backward_weight(self, P, c, dy):
        if "backward" not in c:
            self.backward_input(P, c, dy)
        with self._declared(dy, ("backward_weight",), f"{type(self).__name__} backward (W)"):
            d_out, dy_local, inner = self._as_read(c.pop("backward"))
            return self._weight_grads(c, d_out, dy_local, inner, self._gathered_input(c, d_out.dtype))

    def backward(self, P, c, dy):
        """B and W together, in Megatron's order: the input's all-gather overlaps the
        input-gradient GEMMs, the input gradient's reduce-scatter the weight GEMMs."""
        with self._declared(dy, ("backward_input", "backward_weight"), f"{type(self).__name__} backward"):
            return self._backward(P, c, dy)

    def _backward(self, P, c, dy):
        d_out = self.r.reduce_back(dy)
        inner = self._inner(P, c, d_out)
        w_out, w_dy, w_inner = self._as_read(self._kept_for_w(d_out, dy, inner))  # as a split W reads them
        bulk = getattr(self.r, "bulk", None)
        pending_x = te_pending(self._gathered_input(c, w_out.dtype, async_op=True), bulk)
        if bulk and not self.keep_gathered:
            bulk(True)
        dx_partial = self._input_grad(P, inner)
        xg = pending_x.wait()
        if bulk:
            bulk(False)
        pending_dx = te_pending(self.r.gather_back(dx_partial, async_op=True), bulk)
        if bulk:
            bulk(True)
        grads = self._weight_grads(c, w_out, w_dy, w_inner, xg)
        if bulk:
            bulk(False)
        return pending_dx.wait(), grads
