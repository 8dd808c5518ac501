"""The core of attention, apart from its projections: o = softmax(q k^T / sqrt(dh) + mask) v.

It has no parameters, so every way of splitting attention reuses it as it is: tensor
parallelism gives each rank whole heads; ring attention (context parallelism) calls it on
one block of queries against one block of keys at a time, with the blocks' positions in
the sequence (``q_start``, ``k_start``) for the causal mask.

Shapes: q (b, h, s_q, dh), k and v (b, h, s_k, dh), o (b, h, s_q, dh).

backward (B only; no weights): with p the softmax and do the output gradient,
dv = p^T do; dp = do v^T; ds = p * (dp - sum(dp * p)) / sqrt(dh); dq = ds k; dk = ds^T q.
"""

import math

import numpy as np

from ..errors import ConfigError
from .module import Module


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def causal_mask(s_q, s_k, offset=0):
    """True where query i may attend to key j: j <= i + offset."""
    return np.arange(s_k)[None, :] <= np.arange(s_q)[:, None] + offset


class AttentionCore(Module):
    """``forward(params, (q, k, v))`` -> o; ``backward_input`` -> (dq, dk, dv).

    ``causal``: query at position ``q_start + i`` sees keys at positions ``<= q_start + i``
    (keys start at ``k_start``). A query row that sees no key at all is an error (its
    softmax would be empty): give such blocks to the caller to skip."""

    def __init__(self, causal=False):
        self.causal = causal

    def forward(self, params, qkv, q_start=0, k_start=0):
        q, k, v = qkv
        if q.ndim != 4 or k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
            raise ConfigError(f"AttentionCore: q, k, v must be (b, h, s, dh) with matching b, h, dh; got "
                             f"{q.shape}, {k.shape}, {v.shape}")
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(q.shape[-1])  # (b, h, s_q, s_k)
        if self.causal:
            mask = causal_mask(q.shape[2], k.shape[2], q_start - k_start)
            if not mask.any(axis=1).all():
                raise ConfigError(f"AttentionCore: with causal masking, queries from position {q_start} see "
                                 f"no key from position {k_start}; skip this block")
            scores = np.where(mask, scores, -np.inf)
        p = softmax(scores)
        return p @ v, {"q": q, "k": k, "v": v, "p": p}

    def backward_input(self, params, cache, do):
        q, k, v, p = cache["q"], cache["k"], cache["v"], cache["p"]
        dv = p.transpose(0, 1, 3, 2) @ do
        dp = do @ v.transpose(0, 1, 3, 2)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / math.sqrt(q.shape[-1])
        return ds @ k, ds.transpose(0, 1, 3, 2) @ q, dv

    def flops(self, q_shape, k_shape=None):
        """q k^T and p v: 2 b h s_q s_k dh each forward (the s^2 term); backward twice that."""
        b, h, s_q, dh = q_shape
        s_k = (k_shape or q_shape)[2]
        mm = 2 * b * h * s_q * s_k * dh
        return {"forward": 2 * mm, "backward_input": 4 * mm, "backward_weight": 0}
