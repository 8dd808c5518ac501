"""Where a tensor-parallel layer talks: Megatron-LM's region operators
(megatron/core/tensor_parallel/mappings.py), one implementation for the lesson's layers
(:mod:`.linear`) and for the blocks the mesh runtime runs (:class:`TPRegions`).

Tensor parallelism (Shoeybi et al., "Megatron-LM", 2019), the f and g operators:

* :func:`copy_to_tp_region` (f), before a column-parallel layer: identity in forward; in
  backward (:func:`copy_to_tp_region_backward`) the ranks' partial input gradients are
  all-reduced;
* :func:`reduce_from_tp_region` (g), after a row-parallel layer: all-reduce of the partial
  outputs in forward; identity in backward (:func:`reduce_from_tp_region_backward`).

Sequence parallelism (Korthikanti et al., 2022): the parts of a block that tensor
parallelism leaves replicated (norms, dropout, residuals) are split along the sequence
instead, over the same tp ranks. Where TP has an all-reduce, SP has a reduce-scatter on one
side of the region and an all-gather on the other; all-reduce = reduce-scatter + all-gather,
so the forward moves the same bytes, and the activations of the replicated regions shrink
by t. The sequence is dim 1 of (batch, sequence, hidden) (Megatron's is dim 0 of
(sequence, batch, hidden)):

* :func:`all_gather_dim` / :func:`reduce_scatter_dim`: along any dim (the sequence by default);
* :func:`gather_from_sequence_parallel_region`: all-gather in forward (before a
  column-parallel layer), reduce-scatter in backward;
* :func:`reduce_scatter_to_sequence_parallel_region`: reduce-scatter in forward (after a
  row-parallel layer, instead of g's all-reduce), all-gather in backward.

:class:`TPRegions` holds the four operators of one tp group, with or without SP:

============================  ========================  =================================
                              tensor parallelism        with sequence parallelism
============================  ========================  =================================
``gather``: before column     identity (f)              all-gather along the sequence
``gather_back``: its backward all-reduce (f's backward) reduce-scatter along the sequence
``reduce``: after row         all-reduce (g)            reduce-scatter along the sequence
``reduce_back``: its backward identity (g's backward)   all-gather along the sequence
============================  ========================  =================================

Each takes ``async_op=True`` and then returns a handle whose ``wait()`` gives the result,
so a layer can compute while its all-gather or reduce-scatter is on the wire (Megatron
overlaps the backward's all-gather of the input with the input-gradient GEMM, and the
reduce-scatter of the input gradient with the weight-gradient GEMM).
"""

import numpy as np

from ...arrays.shape_only import contiguous
from ...errors import ConfigError
from ..data_parallel.flat_layout import reduce_flat

SEQ = 1  # the sequence is dim 1 of (batch, sequence, hidden)


class _Done:
    def __init__(self, value):
        self.value = value

    def wait(self):
        return self.value


class _Then:
    """A handle whose result is ``finish(handle.wait())``."""

    def __init__(self, handle, finish):
        self.handle, self.finish = handle, finish

    def wait(self):
        return self.finish(self.handle.wait())


def then(handle, finish):
    """A handle whose result is ``finish(handle.wait())``; its ``.handle`` stays the
    collective's own (the overlap code marks that one)."""
    if isinstance(handle, _Then):
        first = handle.finish
        return _Then(handle.handle, lambda y: finish(first(y)))
    return _Then(handle, finish)


def ready(value, async_op):
    """``value``, or a handle that gives it (for code that waits on either)."""
    return _Done(value) if async_op else value


def _call(collective, x, async_op):
    return collective(x, async_op=True) if async_op else collective(x)


def to_front(x, dim=SEQ):
    return contiguous(np.moveaxis(x, dim, 0))


def from_front(y, dim=SEQ):
    return np.moveaxis(y, 0, dim)


# ----------------------------------------------------------------- f and g
def copy_to_tp_region(comm, x):
    """f in forward: identity (every rank already holds x)."""
    return x


def copy_to_tp_region_backward(comm, dx, async_op=False):
    """f in backward: the ranks' partial input gradients are summed."""
    return _call(comm.all_reduce, dx, async_op)


def reduce_from_tp_region(comm, y_partial, async_op=False):
    """g in forward: sum the partial outputs."""
    return _call(comm.all_reduce, y_partial, async_op)


def reduce_from_tp_region_backward(comm, dy):
    """g in backward: identity (the output gradient is replicated)."""
    return dy


# ----------------------------------------------------------------- along a dim (sequence parallelism)
def all_gather_dim(comm, x, dim=SEQ, async_op=False):
    """Every rank's x, concatenated along ``dim``."""
    if async_op:
        return _Then(comm.all_gather(to_front(x, dim), async_op=True), lambda y: from_front(y, dim))
    return from_front(comm.all_gather(to_front(x, dim)), dim)


def reduce_scatter_dim(comm, x, dim=SEQ, async_op=False):
    """Sum over ranks, this rank keeping its slice of ``dim``."""
    if async_op:
        return _Then(comm.reduce_scatter(to_front(x, dim), async_op=True), lambda y: from_front(y, dim))
    return from_front(comm.reduce_scatter(to_front(x, dim)), dim)


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


# ----------------------------------------------------------------- gradients summed over the group
def all_reduce_together(comm, tensors, keys):
    """``tensors`` with those of ``keys`` summed over ``comm``, in one all-reduce of all
    of them laid end to end (small tensors: one call's latency, not one each). A group of
    one sums nothing."""
    if comm.size == 1 or not keys:
        return dict(tensors)
    return reduce_flat(comm, tensors, keys)


# ----------------------------------------------------------------- the four operators of a tp group
class TPRegions:
    """The four operators of one tp group (``comm``), sequence-parallel or not. ``payload``:
    the dtype their messages travel in (the precision policy's ``tp``; None: as computed):
    a tensor is cast to it before it is sent and back after it arrives, so the bytes on the
    wire are the policy's. A group of one sends nothing (Megatron's mappings return the
    input when the tensor-parallel world size is 1)."""

    def __init__(self, comm, sequence_parallel, payload=None):
        self.comm, self.sp = comm, sequence_parallel
        self.payload = None if payload is None else np.dtype(payload)

    def _result(self, handle, async_op):
        return handle if async_op else handle.wait()

    def _send(self, x):
        """(x as it travels, a function back to x's dtype)."""
        if self.payload is None or x.dtype == self.payload:
            return x, (lambda y: y)
        dtype = x.dtype
        return x.astype(self.payload), (lambda y: y.astype(dtype))

    def _collective(self, operator, x, async_op):
        """``operator(comm, x)`` in the payload dtype (nothing sent in a group of one)."""
        if self.comm.size == 1:
            return ready(x, async_op)
        x, back = self._send(x)
        return self._result(then(operator(self.comm, x, async_op=True), back), async_op)

    def gather(self, x, async_op=False):
        if self.sp:
            return self._collective(all_gather_dim, x, async_op)
        return ready(copy_to_tp_region(self.comm, x), async_op)

    def gather_back(self, dx, async_op=False):
        return self._collective(reduce_scatter_dim if self.sp else copy_to_tp_region_backward, dx, async_op)

    def reduce(self, y, async_op=False):
        return self._collective(reduce_scatter_dim if self.sp else reduce_from_tp_region, y, async_op)

    def reduce_back(self, dy, async_op=False):
        if self.sp:
            return self._collective(all_gather_dim, dy, async_op)
        return ready(reduce_from_tp_region_backward(self.comm, dy), async_op)

    def gather_again(self, x, async_op=False):
        """The input gathered again for the weight gradients (a plain all-gather)."""
        return TPRegions.gather(self, x, async_op)

    def sequence_slice(self, s):
        """This rank's slice of a sequence of length ``s`` (sequence parallelism)."""
        return sequence_slice(self.comm, s)
