"""Multi-head softmax attention, heads laid out so tensor parallelism can deal whole heads.

Shapes: x (b, s, d); h heads of width dh = d/h. Head j owns columns j*dh:(j+1)*dh of the
q, k, v weights and the same rows of the output weight, so giving a rank a contiguous block
of columns (q, k, v) and rows (o) gives it whole heads.
"""

import math

import numpy as np

from .linear import Linear
from .module import Composite, check_ndim


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def causal_mask(s_q, s_k, offset=0):
    """True where query i may attend to key j: j <= i + offset."""
    return np.arange(s_k)[None, :] <= np.arange(s_q)[:, None] + offset


class Attention(Composite):
    """y = concat_j(softmax(q_j k_j^T / sqrt(dh) [+ causal mask]) v_j) @ wo + bo.

    backward (per head): do = dy wo^T; dv = p^T do; dp = do v^T;
    ds = p * (dp - sum(dp * p)) / sqrt(dh); dq = ds k; dk = ds^T q.
    """

    def __init__(self, d_model, n_heads, causal=False, dtype=np.float32):
        if n_heads < 1 or d_model % n_heads:
            raise ValueError(f"Attention: d_model ({d_model}) must be divisible by n_heads ({n_heads})")
        self.d_model, self.n_heads, self.causal, self.dtype = d_model, n_heads, causal, dtype
        self.d_head = d_model // n_heads
        self.q, self.k, self.v, self.o = (Linear(d_model, d_model, dtype=dtype) for _ in range(4))

    def children(self):
        return [("q", self.q), ("k", self.k), ("v", self.v), ("o", self.o)]

    def _heads(self, t, b, s):
        return t.reshape(b, s, -1, self.d_head).transpose(0, 2, 1, 3)  # (b, h, s, dh)

    def forward(self, params, x):
        check_ndim("Attention", x, 3, "(batch, seq, d_model)")
        b, s, _ = x.shape
        cache = {}
        qkv = []
        for name in ("q", "k", "v"):
            t, cache[name] = getattr(self, name).forward({k: params[f"{name}.{k}"] for k in ("w", "b")}, x)
            qkv.append(self._heads(t, b, s))
        q, k, v = qkv
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(self.d_head)  # (b, h, s, s)
        if self.causal:
            scores = np.where(causal_mask(s, s), scores, -np.inf)
        p = softmax(scores)
        heads = (p @ v).transpose(0, 2, 1, 3).reshape(b, s, -1)  # (b, s, d)
        y, cache["o"] = self.o.forward({"w": params["o.w"], "b": params["o.b"]}, heads)
        cache.update(qh=q, kh=k, vh=v, p=p, shape=(b, s))
        return y, cache

    def backward_input(self, params, cache, dy):
        b, s = cache["shape"]
        q, k, v, p = cache["qh"], cache["kh"], cache["vh"], cache["p"]
        self._remember(cache, "o", dy)
        dheads = self._heads(self.o.backward_input({"w": params["o.w"]}, cache["o"], dy), b, s)
        dv = p.transpose(0, 1, 3, 2) @ dheads
        dp = dheads @ v.transpose(0, 1, 3, 2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / math.sqrt(self.d_head)
        dq, dk = ds @ k, ds.transpose(0, 1, 3, 2) @ q
        dx = 0
        for name, g in (("q", dq), ("k", dk), ("v", dv)):
            g = g.transpose(0, 2, 1, 3).reshape(b, s, -1)
            self._remember(cache, name, g)
            dx = dx + getattr(self, name).backward_input({"w": params[f"{name}.w"]}, cache[name], g)
        return dx
