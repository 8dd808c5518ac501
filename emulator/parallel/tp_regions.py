"""Where a tensor-parallel layer talks, with or without sequence parallelism.

A column-parallel layer needs its input whole; a row-parallel layer leaves a partial sum.
Megatron's operators (:mod:`.tensor_parallel`, :mod:`.sequence_parallel`) in one place:

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

from ..arrays.shape_only import contiguous
from ..machine import elementwise
from ..machine.comm_overlap import pipelined
from ..machine.work import Collective, Gemm, dtype_bytes
from .data_parallel.flat_layout import reduce_flat

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


def ready(value, async_op):
    """``value``, or a handle that gives it (for code that waits on either)."""
    return _Done(value) if async_op else value


def _front(x):
    return contiguous(np.moveaxis(x, SEQ, 0))


def _back(y):
    return np.moveaxis(y, 0, SEQ)


def all_reduce_together(comm, tensors, keys):
    """``tensors`` with those of ``keys`` summed over ``comm``, in one all-reduce of all
    of them laid end to end (small tensors: one call's latency, not one each). A group of
    one sums nothing."""
    if comm.size == 1 or not keys:
        return dict(tensors)
    return reduce_flat(comm, tensors, keys)


class TPRegions:
    """The four operators of one tp group (``comm``), sequence-parallel or not. ``payload``:
    the dtype their messages travel in (the precision policy's ``tp``; None: as computed):
    a tensor is cast to it before it is sent and back after it arrives, so the bytes on the
    wire are the policy's."""

    def __init__(self, comm, sequence_parallel, payload=None):
        self.comm, self.sp = comm, sequence_parallel
        self.payload = None if payload is None else np.dtype(payload)

    def _result(self, handle, async_op):
        return handle if async_op else handle.wait()

    def _alone(self, x, async_op):
        """A group of one sends nothing (Megatron's mappings return the input when the
        tensor-parallel world size is 1)."""
        return self._result(_Done(x), async_op)

    def _send(self, x):
        """(x as it travels, a function back to x's dtype)."""
        if self.payload is None or x.dtype == self.payload:
            return x, (lambda y: y)
        dtype = x.dtype
        return x.astype(self.payload), (lambda y: y.astype(dtype))

    def _all_gather(self, x, async_op):
        if self.comm.size == 1:
            return self._alone(x, async_op)
        x, back = self._send(x)
        return self._result(_Then(self.comm.all_gather(_front(x), async_op=True), lambda y: back(_back(y))),
                            async_op)

    def _reduce_scatter(self, x, async_op):
        if self.comm.size == 1:
            return self._alone(x, async_op)
        x, back = self._send(x)
        return self._result(_Then(self.comm.reduce_scatter(_front(x), async_op=True), lambda y: back(_back(y))),
                            async_op)

    def _all_reduce(self, x, async_op):
        if self.comm.size == 1:
            return self._alone(x, async_op)
        x, back = self._send(x)
        return self._result(_Then(self.comm.all_reduce(x, async_op=True), back), async_op)

    def gather(self, x, async_op=False):
        return self._all_gather(x, async_op) if self.sp else self._result(_Done(x), async_op)

    def gather_back(self, dx, async_op=False):
        return self._reduce_scatter(dx, async_op) if self.sp else self._all_reduce(dx, async_op)

    def reduce(self, y, async_op=False):
        return self._reduce_scatter(y, async_op) if self.sp else self._all_reduce(y, async_op)

    def reduce_back(self, dy, async_op=False):
        return self._all_gather(dy, async_op) if self.sp else self._result(_Done(dy), async_op)

    def gather_again(self, x, async_op=False):
        """The input gathered again for the weight gradients (a plain all-gather)."""
        return TPRegions.gather(self, x, async_op)

    def sequence_slice(self, s):
        """This rank's slice of a sequence of length ``s`` (sequence parallelism)."""
        n = s // self.comm.size
        return slice(self.comm.rank * n, (self.comm.rank + 1) * n)


class TERegions(TPRegions):
    """The same operators as Transformer Engine's userbuffers overlap them with the GEMM
    beside them (``--tp-comm-overlap``, sequence parallelism): the all-gathers before a
    column-parallel GEMM and before a row-parallel one's input gradient as ring exchanges
    (the GEMM's chunks computed as their rows arrive), the reduce-scatter after a
    row-parallel GEMM pipelined behind its chunks; in backward the bulk overlaps take SMs
    from the GEMMs beside them (:mod:`emulator.machine.comm_overlap`, the times; the open
    declared pass, :mod:`emulator.engine.charging`, pairs each collective with its GEMM)."""

    def __init__(self, comm, payload=None, splits=4, sms=16):
        super().__init__(comm, True, payload)
        self.splits, self.sms = splits, sms

    def _charges(self):
        return self.comm._world._charges[self.comm.global_rank][-1]

    def _ring(self, x, async_op):
        x, back = self._send(x)
        handle = self.comm.all_gather(_front(x), async_op=True)
        self._charges().ring = (handle, self.comm.size)  # the next GEMM computes as its rows arrive
        return self._result(_Done(back(_back(handle.span()[2]))), async_op)

    def gather(self, x, async_op=False):
        return self._ring(x, async_op)

    def reduce_back(self, dy, async_op=False):
        return self._ring(dy, async_op)

    def reduce(self, y, async_op=False):
        """Pipelined behind the GEMM just charged: its chunks' reduce-scatters start after its
        first chunk, and the last one ends a chunk's share after the GEMM."""
        charges = self._charges()
        start, end, gemm = charges.last_kernel
        charges.ready_at = start + gemm / self.splits
        y, back = self._send(y)
        handle = self.comm.reduce_scatter(_front(y), async_op=True)
        c0, c1, out = handle.span()
        clock, me = self.comm._world.clock, self.comm.global_rank
        finish = start + pipelined(gemm, c1 - c0, self.splits) if c1 > c0 else end
        clock.join(me, max(finish, c1), "the pipelined reduce-scatter")
        return self._result(_Done(back(_back(out))), async_op)

    def bulk(self, on):
        """Take (or give back) the bulk overlap's SMs from the GEMMs charged meanwhile."""
        self._charges().bulk_sms = self.sms if on else 0


def _te(pending, bulk):
    """A pending collective of TE's bulk overlap: it takes its SMs from the GEMMs explicitly
    (``bulk``), so the compute beside it is not slowed again as beside an NCCL kernel."""
    handle = getattr(pending, "handle", None)
    if bulk and handle is not None:
        handle.contended = False
    return pending


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
            c["backward"] = (d_out, dy, inner)
            return self.r.gather_back(self._input_grad(P, inner))

    def backward_weight(self, P, c, dy):
        if "backward" not in c:
            self.backward_input(P, c, dy)
        with self._declared(dy, ("backward_weight",), f"{type(self).__name__} backward (W)"):
            d_out, dy_local, inner = c.pop("backward")
            return self._weight_grads(c, d_out, dy_local, inner, self._gathered_input(c, d_out.dtype))

    def backward(self, P, c, dy):
        """B and W together, in Megatron's order: the input's all-gather overlaps the
        input-gradient GEMMs, the input gradient's reduce-scatter the weight GEMMs."""
        with self._declared(dy, ("backward_input", "backward_weight"), f"{type(self).__name__} backward"):
            return self._backward(P, c, dy)

    def _backward(self, P, c, dy):
        d_out = self.r.reduce_back(dy)
        inner = self._inner(P, c, d_out)
        bulk = getattr(self.r, "bulk", None)
        pending_x = _te(self._gathered_input(c, d_out.dtype, async_op=True), bulk)
        if bulk and not self.keep_gathered:
            bulk(True)
        dx_partial = self._input_grad(P, inner)
        xg = pending_x.wait()
        if bulk:
            bulk(False)
        pending_dx = _te(self.r.gather_back(dx_partial, async_op=True), bulk)
        if bulk:
            bulk(True)
        grads = self._weight_grads(c, d_out, dy, inner, xg)
        if bulk:
            bulk(False)
        return pending_dx.wait(), grads


# ----------------------------------------------------------------- what the regions declare
PIPELINE_SPLITS = 4  # Transformer Engine's chunks of a pipelined reduce-scatter (stack_sources: tp_overlap_splits)


OVERLAPPED = ("attention", "mlp")  # TE's layers (linear_qkv, linear_proj, linear_fc1, linear_fc2)


def te_overlap(s, ctx, part):
    """Whether Transformer Engine pipelines this part's tensor-parallel collectives with
    its GEMMs (the stack's ``tp_comm_overlap``; Megatron requires sequence parallelism; the
    embedding and the output layer are Megatron's own layers, not TE's)."""
    return ctx.stack.tp_comm_overlap and s.sequence_parallel and part in OVERLAPPED


def _tp(s, ctx, name, op, overlap=None):
    dt = ctx.dtype("tp")
    return (Collective(name, op, "tp", s.tp, s.rows * s.d * dtype_bytes(dt), dt, overlap),)


def _bulk(s, ctx, part):
    """The backward's all-gather of the input (beside the input-gradient GEMM) and
    reduce-scatter of the input gradient (beside the weight-gradient GEMMs), as Megatron's
    linear layers issue them; TE's bulk overlap takes its SMs from those GEMMs."""
    if part not in OVERLAPPED:
        return None
    return ("bulk", ctx.stack.tp_overlap_sms if te_overlap(s, ctx, part) else 0)


def region_gather(s, ctx, part):
    """``gather`` before a column-parallel layer: an all-gather along the sequence under SP."""
    if not s.sequence_parallel:
        return ()
    return _tp(s, ctx, f"{part}: all-gather input", "all_gather",
               ("ring_exchange", s.tp) if te_overlap(s, ctx, part) else None)


def region_reduce(s, ctx, part):
    """``reduce`` after a row-parallel layer: reduce-scatter (SP) or all-reduce."""
    if s.tp == 1:
        return ()
    overlap = ("pipeline", PIPELINE_SPLITS, ctx.stack.tp_overlap_sms) if te_overlap(s, ctx, part) else None
    return _tp(s, ctx, f"{part}: reduce output", "reduce_scatter" if s.sequence_parallel else "all_reduce", overlap)


def region_reduce_back(s, ctx, part):
    """``reduce``'s backward: the output gradient all-gathered along the sequence under SP."""
    if not s.sequence_parallel:
        return ()
    return _tp(s, ctx, f"{part}: all-gather output grad", "all_gather",
               ("ring_exchange", s.tp) if te_overlap(s, ctx, part) else None)


def region_gather_back(s, ctx, part):
    """``gather``'s backward: the input gradient reduce-scattered (SP) or all-reduced."""
    if s.tp == 1:
        return ()
    return _tp(s, ctx, f"{part}: reduce input grad", "reduce_scatter" if s.sequence_parallel else "all_reduce",
               _bulk(s, ctx, part))


def region_gather_again(s, ctx, part):
    """Under SP the weight gradients need the whole input: gathered again, as Megatron does,
    unless the layer kept the gathered copy."""
    return _tp(s, ctx, f"{part}: all-gather input again", "all_gather", _bulk(s, ctx, part)) \
        if (s.sequence_parallel and not s.keep_gathered) else ()


def wgrad(ctx, name, m, n, k):
    """A weight-gradient GEMM (m x k) @ (k x n): accumulating into the fp32 main gradients
    where the stack fuses that (Megatron's gradient-accumulation fusion), else written in
    the compute dtype and added into the gradient buffer by a kernel of its own."""
    c, g = ctx.dtype("compute"), ctx.dtype("grads")
    if ctx.stack.has("grad_accumulation"):
        return (Gemm(name, m, n, k, c, out_dtype=g, accumulate=True),)
    return (Gemm(name, m, n, k, c),) + elementwise.grad_accumulate(ctx.stack, f"{name}: accumulate", m * n, c, g)
