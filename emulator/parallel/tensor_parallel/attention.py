"""Attention split by Megatron's tensor parallelism: q, k and v column-parallel (rank r
holds heads ``r h/t ...`` and, with grouped-query attention, the K/V heads they use), the
output projection row-parallel (its bias added once, after the reduction); the core
between them is swappable (:mod:`~emulator.parallel.attention_cores`).

x: (b, s, d), or this rank's (b, s/t, d) under sequence parallelism.

forward:  xg = gather(x); q, k, v = xg Wq + bq, xg Wk + bk, xg Wv + bv  (b, s, .../t)
          o = core(q, k, v);  y = reduce(o Wo) + bo
backward: do = reduce_back(dy)               dWo = o^T do, dbo = sum dy
          dq, dk, dv = core'(do Wo^T)
          dx = gather_back(dq Wq^T + dk Wk^T + dv Wv^T)
          dWq = xg^T dq, ... (xg gathered again under sequence parallelism, as Megatron
          does, unless ``keep_gathered_input``: memory for bytes)
"""


import numpy as np

from ...machine import elementwise
from ...machine.work import Gemm, Work
from ..attention_cores import UlyssesCore, core_work
from ..layer_shape import LayerShape
from ..placement import Placement
from .linear import ColumnThenRow
from .op_checkpoint import passthrough
from .regions import ready
from .regions_work import (region_gather, region_gather_again, region_gather_back, region_reduce, region_reduce_back,
                           wgrad)


class ParallelAttention(ColumnThenRow):
    def __init__(self, regions, d_model, n_heads, n_kv_heads, core, keep=None, keep_gathered_input=False,
                 dtype=None):
        t = regions.comm.size
        self.dtype = dtype
        self.r, self.d, self.core = regions, d_model, core
        self.dh = d_model // n_heads
        self.heads, self.kv_heads = n_heads // t, n_kv_heads // t
        self.keep = keep or (lambda a: a)
        self.keep_gathered = keep_gathered_input and regions.sp
        self.saved = passthrough  # a per-op checkpoint's record or replay (.op_checkpoint), when the block opens one

    def placements(self, sp):
        col_w, col_b, row_w = Placement((("tp", 1),)), Placement((("tp", 0),)), Placement((("tp", 0),))
        out = {f"{n}.{k}": (col_w if k == "w" else col_b) for n in "qkv" for k in "wb"}
        out["o.w"] = row_w
        out["o.b"] = Placement(partial=("tp",) if sp else ())  # added after the reduce-scatter: partial under SP
        return out

    def _heads(self, t, n):
        b, s, _ = t.shape
        return t.reshape(b, s, n, self.dh).transpose(0, 2, 1, 3)  # (b, n, s, dh)

    @staticmethod
    def _merge(t):
        b, h, s, dh = t.shape
        return t.transpose(0, 2, 1, 3).reshape(b, s, h * dh)

    def _gemm(self, what):
        self.r.comm.charge(what)

    def work(self, x_shape, dtype=None):
        """This attention's :class:`~emulator.machine.work.Work` for an input of ``x_shape``."""
        t, b, s_loc = self.r.comm.size, x_shape[0], x_shape[1]
        cp = getattr(self.core, "cp", None)
        shape = LayerShape(b, s_loc * t if self.r.sp else s_loc, self.d, self.heads * t, self.kv_heads * t, 1,
                           head_dim=self.dh, dropout=getattr(self.core, "p", 0.0),
                           causal=getattr(self.core, "causal", True), tp=t, sp=self.r.sp,
                           cp=cp.size if cp is not None else 1,
                           cp_attention="ulysses" if isinstance(self.core, UlyssesCore) else "ring",
                           cp_layout=getattr(self.core, "layout", "zigzag"),
                           recompute=getattr(self.core, "recompute", "none"), keep_gathered=self.keep_gathered)
        ctx = self.r.comm.work_context(dtype if dtype is not None else self.dtype or np.float32)
        return attention_work(shape, ctx, core_work(shape, ctx, cp.rank if cp is not None else 0))

    def forward(self, P, x):
        with self._declared(x, ("forward",), "attention forward"):
            return self._forward(P, x)

    def _forward(self, P, x):
        xg = self.r.gather(x)  # (b, s, d)
        c = {"q, k, v projections' input": self.keep(xg if self.keep_gathered else x)}
        saved = self.saved  # each op's charge after it: a replayed one (op_checkpoint) is charged nothing
        q = self._heads(saved("attention: qkv: q", lambda: xg @ P["q.w"] + P["q.b"]), self.heads)
        k, v = (self._heads(saved(f"attention: qkv: {n}", lambda n=n: xg @ P[f"{n}.w"] + P[f"{n}.b"]), self.kv_heads)
                for n in "kv")
        self._gemm("attention: qkv")
        heads, c["core"] = saved("attention: core", lambda: self.core.forward(q, k, v),
                                 save=lambda out: {"output": self.keep(out[0]),
                                                   "softmax statistics": out[1]["softmax statistics"]},
                                 restore=lambda kept: (kept["output"].astype(q.dtype, copy=False),
                                                       self.core.kept(q, k, v, kept["softmax statistics"])))
        ctx = self._merge(heads)  # (b, s, d/t)
        c["output projection input"] = self.keep(ctx)
        z = saved("attention: output projection", lambda: ctx @ P["o.w"])
        self._gemm("attention: output projection")
        return saved("attention: reduce output", lambda: self.r.reduce(z)) + P["o.b"], c

    # ----------------------------------------------------------------- backward, in pieces
    def _inner(self, P, c, do):
        """The input gradient through o and the core: (dq, dk, dv) merged, (b, s, .../t)."""
        rows = do.shape[0] * do.shape[1]
        dctx = do @ P["o.w"].T
        self._gemm("attention: output projection dgrad")
        dq, dk, dv = self.core.backward(c["core"], self._heads(dctx, self.heads))
        return [self._merge(g) for g in (dq, dk, dv)]

    def _input_grad(self, P, dqkv):
        rows = dqkv[0].shape[0] * dqkv[0].shape[1]
        self._gemm("attention: qkv dgrad")
        return sum(g @ P[f"{n}.w"].T for n, g in zip("qkv", dqkv))

    def _gathered_input(self, c, dtype, async_op=False):
        """The projections' whole input for their weight gradients: kept, or gathered again."""
        x = c["q, k, v projections' input"].astype(dtype, copy=False)
        return ready(x, async_op) if self.keep_gathered else self.r.gather_again(x, async_op=async_op)

    def _weight_grads(self, c, do, dy_local, dqkv, xg):
        ctx = c["output projection input"].astype(do.dtype, copy=False)
        rows = do.shape[0] * do.shape[1]
        self._gemm("attention: output projection wgrad")
        self._gemm("attention: qkv wgrad")
        grads = {"o.w": ctx.reshape(rows, -1).T @ do.reshape(rows, -1), "o.b": dy_local.sum((0, 1))}
        x2 = xg.reshape(rows, -1)
        for n, g in zip("qkv", dqkv):
            grads[f"{n}.w"] = x2.T @ g.reshape(rows, -1)
            grads[f"{n}.b"] = g.sum((0, 1))
        return grads


# ----------------------------------------------------------------- the declaration of its work
def attention_work(s, ctx, core):
    """This rank's attention for a micro-batch of shape ``s``: q, k, v (one GEMM under
    Megatron's ``linear_qkv``, three in eager torch, their input gradients summed), RoPE
    where the model has it, the ``core``'s work
    (:func:`~emulator.parallel.attention_cores.core_work`), the output projection, and the
    tensor-parallel regions around them."""
    st, c = ctx.stack, ctx.dtype("compute")
    hd, kvd = s.h * s.head_dim, s.kv * s.head_dim
    proj = [("", s.qkv)] if st.fuses_projections else [(": q", hd), (": k", kvd), (": v", kvd)]
    F = region_gather(s, ctx, "attention") + tuple(Gemm(f"attention: qkv{n}", s.rows, cols, s.d, c) for n, cols in proj)
    rope = ()
    if s.rope:
        rope = elementwise.rope(st, "attention: rope q", s.rows, s.h, s.head_dim, c) + \
            elementwise.rope(st, "attention: rope k", s.rows, s.kv, s.head_dim, c)
    F += rope + core.forward + (Gemm("attention: output projection", s.rows, s.d, hd, c),) + \
        region_reduce(s, ctx, "attention")
    B = region_reduce_back(s, ctx, "attention") + (Gemm("attention: output projection dgrad", s.rows, hd, s.d, c),)
    B += core.backward_input
    if s.rope:
        B += elementwise.rope(st, "attention: rope q", s.rows, s.h, s.head_dim, c, backward=True) + \
            elementwise.rope(st, "attention: rope k", s.rows, s.kv, s.head_dim, c, backward=True)
    B += tuple(Gemm(f"attention: qkv dgrad{n}", s.rows, s.d, cols, c) for n, cols in proj)
    for _ in proj[1:]:
        B += elementwise.residual_grad("attention: qkv dgrad: add", s.rows, s.d, c)
    B += region_gather_back(s, ctx, "attention")
    W = region_gather_again(s, ctx, "attention") + wgrad(ctx, "attention: output projection wgrad", hd, s.d, s.rows)
    for n, cols in proj:
        W += wgrad(ctx, f"attention: qkv wgrad{n}", s.d, cols, s.rows)
    return Work("attention", F, B, W, F)
