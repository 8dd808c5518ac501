"""Softmax attention one block of keys at a time, never holding the whole score matrix.

For a row of scores seen in blocks, keep the running max ``m``, the running sum ``l`` of
``exp(score - m)`` and the running output ``acc = sum exp(score - m) v``. A new block with
scores ``s`` updates them as (FlashAttention's recurrence)::

    m' = max(m, max(s));  l' = l e^(m - m') + sum e^(s - m');  acc' = acc e^(m - m') + e^(s - m') v

and at the end ``out = acc / l``. Masked scores are ``-inf``; a row that has seen no key
yet has ``m = -inf`` and contributes nothing. ``lse = m + log l`` (the log of the softmax's
denominator) is all the backward needs to rebuild any block's probabilities.

``accumulate`` is the dtype the running ``m``, ``l`` and ``acc`` are stored in: float64 by
default (exact checks), float32 as FlashAttention keeps them, or bfloat16 to see the
error that rounding them at every block adds.
"""

import numpy as np

from ...errors import ConfigError


class OnlineSoftmax:
    """Running softmax-weighted sums for ``rows`` (a shape ``(..., n)``) of width ``d``."""

    def __init__(self, rows, d, accumulate=np.float64, like=None):
        self.dtype = np.dtype(accumulate)
        like = np.empty(0) if like is None else like  # a shape-only ``like`` keeps the state shape-only
        self.m = np.full_like(like, -np.inf, self.dtype, shape=rows)
        self.l = np.zeros_like(like, self.dtype, shape=rows)
        self.acc = np.zeros_like(like, self.dtype, shape=tuple(rows) + (d,))

    def update(self, scores, v, rows=slice(None)):
        """Fold in a block: ``scores`` (..., n_rows, n_keys) already scaled and masked,
        ``v`` (..., n_keys, d), for the query rows ``rows``."""
        f32 = np.float32 if self.dtype.itemsize < 4 else self.dtype
        m_old = self.m[..., rows].astype(f32)
        m_new = np.maximum(m_old, scores.max(-1).astype(f32))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        p = np.exp(scores.astype(f32) - safe[..., None])
        alpha = np.exp(m_old - safe)
        self.l[..., rows] = (alpha * self.l[..., rows].astype(f32) + p.sum(-1)).astype(self.dtype)
        self.acc[..., rows, :] = (alpha[..., None] * self.acc[..., rows, :].astype(f32)
                                  + p @ v.astype(f32)).astype(self.dtype)
        self.m[..., rows] = m_new.astype(self.dtype)

    def finish(self, dtype):
        """(out, lse) once every key has been seen."""
        if isinstance(self.l, np.ndarray) and not (self.l > 0).all():
            raise ConfigError("online softmax: some query rows saw no key at all")
        l = self.l.astype(np.float64)
        out = (self.acc.astype(np.float64) / l[..., None]).astype(dtype)
        return out, (self.m.astype(np.float64) + np.log(l)).astype(dtype)


def blockwise_attention(q, k, v, block, causal=False):
    """Attention on one device, ``block`` keys at a time: equal to full softmax attention."""
    n, d = q.shape[-2], q.shape[-1]
    if k.shape[-2] % block:
        raise ConfigError(f"blockwise_attention: {k.shape[-2]} keys do not split into blocks of {block}")
    state = OnlineSoftmax(q.shape[:-1], d, np.promote_types(q.dtype, np.float32))
    for start in range(0, k.shape[-2], block):
        s = q @ k[..., start:start + block, :].swapaxes(-1, -2) / np.sqrt(d)
        if causal:
            s = np.where(np.arange(start, start + block)[None, :] <= np.arange(n)[:, None], s, -np.inf)
        state.update(s, v[..., start:start + block, :])
    return state.finish(q.dtype)[0]
