"""The MLP split by Megatron's tensor parallelism: the matrices that widen are
column-parallel, the one that narrows row-parallel, so the activation between them stays
local and the MLP needs one reduction each way (Shoeybi et al., 2019).

* ``kind="gelu"``: y = reduce(GELU(xg A + a) B) + b, A = fc1.w split by columns, B = fc2.w
  by rows; the bias b is added once, after the reduction;
* ``kind="swiglu"``: y = reduce((SiLU(xg G) * (xg U)) D), G = gate.w and U = up.w by
  columns, D = down.w by rows (no biases, as Llama).

xg = gather(x) (all-gather along the sequence under sequence parallelism); backward as
:mod:`.attention`: the input gathered again for the weight gradients unless kept.
"""


import numpy as np

from ...machine import elementwise
from ...machine.work import Gemm, Work
from ...nn.activations import gelu, gelu_backward, silu, silu_backward
from ..layer_shape import LayerShape
from ..placement import Placement
from .linear import ColumnThenRow
from .op_checkpoint import passthrough
from .regions import ready
from .regions_work import (region_gather, region_gather_again, region_gather_back, region_reduce, region_reduce_back,
                           wgrad)

COLUMN_W, COLUMN_B, ROW_W = Placement((("tp", 1),)), Placement((("tp", 0),)), Placement((("tp", 0),))


class ParallelMLP(ColumnThenRow):
    def __init__(self, regions, d_model, d_ff, kind="gelu", keep=None, keep_gathered_input=False, dtype=None):
        self.r, self.d, self.ff, self.kind = regions, d_model, d_ff // regions.comm.size, kind
        self.dtype = dtype
        self.keep = keep or (lambda a: a)
        self.keep_gathered = keep_gathered_input and regions.sp
        self.saved = passthrough  # a per-op checkpoint's record or replay (.op_checkpoint), when the block opens one
        self.widen = ("fc1",) if kind == "gelu" else ("gate", "up")
        self.narrow = "fc2" if kind == "gelu" else "down"

    def placements(self, sp):
        out = {f"{n}.w": COLUMN_W for n in self.widen}
        out[f"{self.narrow}.w"] = ROW_W
        if self.kind == "gelu":
            out["fc1.b"] = COLUMN_B
            out["fc2.b"] = Placement(partial=("tp",) if sp else ())
        return out

    def _gemm(self, what):
        self.r.comm.charge(what)

    def work(self, x_shape, dtype=None):
        """This MLP's :class:`~emulator.machine.work.Work` for an input of ``x_shape``."""
        t, b, s_loc = self.r.comm.size, x_shape[0], x_shape[1]
        shape = LayerShape(b, s_loc * t if self.r.sp else s_loc, self.d, 1, 1, self.ff * t, mlp=self.kind,
                           bias=self.kind == "gelu", tp=t, sp=self.r.sp, keep_gathered=self.keep_gathered)
        return mlp_work(shape, self.r.comm.work_context(dtype if dtype is not None else self.dtype or np.float32))

    def forward(self, P, x):
        with self._declared(x, ("forward",), "MLP forward"):
            return self._forward(P, x)

    def _forward(self, P, x):
        xg = self.r.gather(x)
        c = {"fc1 input": self.keep(xg if self.keep_gathered else x)}
        saved = self.saved  # each op's charge after it: a replayed one (op_checkpoint) is charged nothing
        if self.kind == "gelu":
            u = saved("mlp: fc1", lambda: xg @ P["fc1.w"] + P["fc1.b"])
            self._gemm("mlp: fc1")
            c["GELU input"] = self.keep(u)
            h = gelu(u)
        else:
            g, u = saved("mlp: fc1: gate", lambda: xg @ P["gate.w"]), saved("mlp: fc1: up", lambda: xg @ P["up.w"])
            self._gemm("mlp: fc1")
            c["gate output"], c["up output"] = self.keep(g), self.keep(u)
            h = silu(g) * u
        self.r.comm.charge("mlp: activation")
        c["fc2 input"] = self.keep(h)
        z = saved("mlp: fc2", lambda: h @ P[f"{self.narrow}.w"])
        self._gemm("mlp: fc2")
        y = saved("mlp: reduce output", lambda: self.r.reduce(z))
        return (y + P["fc2.b"] if self.kind == "gelu" else y), c

    # ----------------------------------------------------------------- backward, in pieces
    def _inner(self, P, c, dz):
        """The gradient at the widening matrices' outputs: [du] or [dgate, dup]."""
        rows = dz.shape[0] * dz.shape[1]
        self._gemm("mlp: fc2 dgrad")
        dh = dz @ P[f"{self.narrow}.w"].T
        w = dz.dtype
        self.r.comm.charge("mlp: activation backward")
        if self.kind == "gelu":
            return [gelu_backward(c["GELU input"].astype(w, copy=False), dh)]
        g, u = c["gate output"].astype(w, copy=False), c["up output"].astype(w, copy=False)
        return [silu_backward(g, dh * u), silu(g) * dh]

    def _input_grad(self, P, dw):
        rows = dw[0].shape[0] * dw[0].shape[1]
        self._gemm("mlp: fc1 dgrad")
        return sum(g @ P[f"{n}.w"].T for n, g in zip(self.widen, dw))

    def _gathered_input(self, c, dtype, async_op=False):
        x = c["fc1 input"].astype(dtype, copy=False)
        return ready(x, async_op) if self.keep_gathered else self.r.gather_again(x, async_op=async_op)

    def _weight_grads(self, c, dz, dy_local, dw, xg):
        rows = dz.shape[0] * dz.shape[1]
        h = c["fc2 input"].astype(dz.dtype, copy=False)
        self._gemm("mlp: fc2 wgrad")
        self._gemm("mlp: fc1 wgrad")
        grads = {f"{self.narrow}.w": h.reshape(rows, -1).T @ dz.reshape(rows, -1)}
        x2 = xg.reshape(rows, -1)
        for n, g in zip(self.widen, dw):
            grads[f"{n}.w"] = x2.T @ g.reshape(rows, -1)
        if self.kind == "gelu":
            grads["fc2.b"] = dy_local.sum((0, 1))
            grads["fc1.b"] = dw[0].sum((0, 1))
        return grads


# ----------------------------------------------------------------- the declaration of its work
def mlp_work(s, ctx):
    """The :class:`~emulator.machine.work.Work` of this rank's MLP for a micro-batch of shape
    ``s`` (:class:`~emulator.parallel.layer_shape.LayerShape`): the GEMMs of its column-
    and row-parallel matrices, the activation as the stack runs it, the tensor-parallel
    collectives (all-gather and reduce-scatter under sequence parallelism, all-reduce
    without) in the policy's payload dtype. The gate and up matrices of a SwiGLU are one
    GEMM under Megatron (``linear_fc1``), two in eager torch (their input gradients summed)."""
    st = ctx.stack
    c, w = ctx.dtype("compute"), s.widen
    wide = [("", w * s.ff)] if (s.mlp == "gelu" or st.fuses_projections) else \
        [(": gate", s.ff), (": up", s.ff)]
    F = region_gather(s, ctx, "mlp") + tuple(Gemm(f"mlp: fc1{n}", s.rows, cols, s.d, c) for n, cols in wide)
    F += elementwise.activation(st, "mlp: activation", s.rows, s.ff, c, s.mlp, s.bias)
    F += (Gemm("mlp: fc2", s.rows, s.d, s.ff, c),) + region_reduce(s, ctx, "mlp")
    B = region_reduce_back(s, ctx, "mlp") + (Gemm("mlp: fc2 dgrad", s.rows, s.ff, s.d, c),)
    B += elementwise.activation_backward(st, "mlp: activation", s.rows, s.ff, c, s.mlp)
    B += tuple(Gemm(f"mlp: fc1 dgrad{n}", s.rows, s.d, cols, c) for n, cols in wide)
    if len(wide) > 1:
        B += elementwise.residual_grad("mlp: fc1 dgrad: add", s.rows, s.d, c)
    B += region_gather_back(s, ctx, "mlp")
    W = region_gather_again(s, ctx, "mlp") + wgrad(ctx, "mlp: fc2 wgrad", s.ff, s.d, s.rows)
    for n, cols in wide:
        W += wgrad(ctx, f"mlp: fc1 wgrad{n}", s.d, cols, s.rows)
    return Work("mlp", F, B, W, F)
