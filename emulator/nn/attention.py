"""Multi-head softmax attention: four projections around :class:`AttentionCore`.

Shapes: x (b, s, d); h heads of width dh = d/h. Head j owns columns j*dh:(j+1)*dh of the
q, k, v weights and the same rows of the output weight, so giving a rank a contiguous block
of columns (q, k, v) and rows (o) gives it whole heads: tensor parallelism splits here.
"""

import numpy as np

from .attention_core import AttentionCore, causal_mask, softmax  # noqa: F401 -- re-exported
from .linear import Linear
from .module import Composite, add_flops, check_ndim, check_heads


class Attention(Composite):
    """y = merge_heads(core(split(x wq + bq), split(x wk + bk), split(x wv + bv))) wo + bo."""

    def __init__(self, d_model, n_heads, causal=False, dtype=np.float32):
        check_heads("Attention", d_model, n_heads)
        self.d_model, self.n_heads, self.causal, self.dtype = d_model, n_heads, causal, dtype
        self.d_head = d_model // n_heads
        self.q, self.k, self.v, self.o = (Linear(d_model, d_model, dtype=dtype) for _ in range(4))
        self.core = AttentionCore(causal)

    def children(self):
        return [("q", self.q), ("k", self.k), ("v", self.v), ("core", self.core), ("o", self.o)]

    def split_heads(self, t):
        b, s, _ = t.shape
        return t.reshape(b, s, -1, self.d_head).transpose(0, 2, 1, 3)  # (b, h, s, dh)

    @staticmethod
    def merge_heads(t):
        b, h, s, dh = t.shape
        return t.transpose(0, 2, 1, 3).reshape(b, s, h * dh)  # (b, s, d)

    def forward(self, params, x):
        check_ndim("Attention", x, 3, "(batch, seq, d_model)")
        cache = {}
        qkv = []
        for name in ("q", "k", "v"):
            t, cache[name] = getattr(self, name).forward({k: params[f"{name}.{k}"] for k in ("w", "b")}, x)
            qkv.append(self.split_heads(t))
        heads, cache["core"] = self.core.forward({}, tuple(qkv))
        y, cache["o"] = self.o.forward({"w": params["o.w"], "b": params["o.b"]}, self.merge_heads(heads))
        return y, cache

    def backward_input(self, params, cache, dy):
        self._remember(cache, "o", dy)
        dheads = self.split_heads(self.o.backward_input({"w": params["o.w"]}, cache["o"], dy))
        dqkv = self.core.backward_input({}, cache["core"], dheads)
        dx = 0
        for name, g in zip(("q", "k", "v"), dqkv):
            g = self.merge_heads(g)
            self._remember(cache, name, g)
            dx = dx + getattr(self, name).backward_input({"w": params[f"{name}.w"]}, cache[name], g)
        return dx

    def flops(self, x_shape):
        b, s, d = x_shape
        heads = (b, self.n_heads, s, self.d_head)
        return add_flops(*(lin.flops(x_shape) for lin in (self.q, self.k, self.v, self.o)), self.core.flops(heads))
