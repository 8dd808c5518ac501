"""The references lesson 04's checks compare with: full softmax attention
(``nn.AttentionCore``) on random q, k, v, and the fold of blocks of scores an online
softmax must reach, some rows masked as a causal mask leaves them."""

import numpy as np

from .. import nn


def qkv(shape, seed, scale=1.0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) * s for s in (scale, scale, 1.0, 1.0)]


def full_attention(q, k, v, causal, do=None):
    core = nn.AttentionCore(causal)
    o, cache = core.forward({}, (q, k, v))
    return o if do is None else (o,) + core.backward_input({}, cache, do)


def fold_reference(blocks):
    scores = np.concatenate([s for s, _ in blocks], axis=-1)
    values = np.concatenate([v for _, v in blocks], axis=-2)
    top = scores.max(-1, keepdims=True)
    e = np.exp(scores - top)
    return e @ values / e.sum(-1, keepdims=True), (top + np.log(e.sum(-1, keepdims=True)))[..., 0]


def blocks_of_scores(rows, n_blocks, width, d, scale, seed, masked):
    """Blocks of (scores, values); with ``masked``, row i sees nothing before block i // 2
    (rows that start with only -inf), as a causal mask makes."""
    rng = np.random.default_rng(seed)
    out = []
    for j in range(n_blocks):
        s = rng.standard_normal((2, rows, width)) * scale
        if masked:
            hidden = (np.arange(rows) // 2 > j)[:, None] | (rng.random((rows, width)) < 0.3)
            hidden[np.arange(rows) // 2 <= j, 0] = False  # every row sees something once it starts
            s = np.where(hidden, -np.inf, s)
        out.append((s, rng.standard_normal((2, width, d))))
    return out
