"""Multi-head softmax attention: four projections around :class:`AttentionCore`.

Shapes: x (b, s, d); h heads of width dh = d/h. Head j owns columns j*dh:(j+1)*dh of the
q, k, v weights and the same rows of the output weight, so giving a rank a contiguous block
of columns (q, k, v) and rows (o) gives it whole heads: tensor parallelism splits here.

Grouped-query attention (``n_kv_heads`` < ``n_heads``, as Llama 2 70B and Llama 3 use;
Ainslie et al. 2023): k and v have ``n_kv_heads`` heads, each shared by the
``n_heads / n_kv_heads`` query heads next to it (query head j uses K/V head
``j // group``). The k and v weights are (d, n_kv_heads * dh); the core sees each K/V head
repeated ``group`` times, and backward adds the repeated heads' gradients back together.
"""

import numpy as np

from .attention_core import AttentionCore, causal_mask, softmax  # noqa: F401 -- re-exported
from .linear import Linear
from .module import Composite, add_flops, check_heads, check_kv_heads, check_ndim


def repeat_kv(t, group):
    """(b, kv_heads, s, dh) -> (b, kv_heads * group, s, dh): each K/V head for its group."""
    return t if group == 1 else np.repeat(t, group, axis=1)


def sum_kv(dt, group):
    """The backward of :func:`repeat_kv`: each K/V head's gradient summed over its group."""
    if group == 1:
        return dt
    b, h, s, dh = dt.shape
    return dt.reshape(b, h // group, group, s, dh).sum(axis=2)


class Attention(Composite):
    """y = merge_heads(core(split(x wq + bq), split(x wk + bk), split(x wv + bv))) wo + bo."""

    def __init__(self, d_model, n_heads, causal=False, dtype=np.float32, n_kv_heads=None):
        check_heads("Attention", d_model, n_heads)
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        check_kv_heads("Attention", n_heads, n_kv_heads)
        self.d_model, self.n_heads, self.n_kv_heads, self.causal, self.dtype = d_model, n_heads, n_kv_heads, causal, dtype
        self.d_head = d_model // n_heads
        self.group = n_heads // n_kv_heads
        d_kv = n_kv_heads * self.d_head
        self.q, self.o = Linear(d_model, d_model, dtype=dtype), Linear(d_model, d_model, dtype=dtype)
        self.k, self.v = Linear(d_model, d_kv, dtype=dtype), Linear(d_model, d_kv, dtype=dtype)
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
        q, k, v = qkv
        heads, cache["core"] = self.core.forward({}, (q, repeat_kv(k, self.group), repeat_kv(v, self.group)))
        y, cache["o"] = self.o.forward({"w": params["o.w"], "b": params["o.b"]}, self.merge_heads(heads))
        return y, cache

    def backward_input(self, params, cache, dy):
        self._remember(cache, "o", dy)
        dheads = self.split_heads(self.o.backward_input({"w": params["o.w"]}, cache["o"], dy))
        dq, dk, dv = self.core.backward_input({}, cache["core"], dheads)
        dx = 0
        for name, g in zip(("q", "k", "v"), (dq, sum_kv(dk, self.group), sum_kv(dv, self.group))):
            g = self.merge_heads(g)
            self._remember(cache, name, g)
            dx = dx + getattr(self, name).backward_input({"w": params[f"{name}.w"]}, cache[name], g)
        return dx

    def flops(self, x_shape):
        b, s, d = x_shape[-3:]
        heads = (b, self.n_heads, s, self.d_head)
        return add_flops(*(lin.flops(x_shape) for lin in (self.q, self.k, self.v, self.o)), self.core.flops(heads))
