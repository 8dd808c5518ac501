"""A task a small GPT learns in a few steps, as global batches."""

import numpy as np


def synthetic_batches(steps, batch, seq, vocab, seed=0):
    """Token sequences with a learnable rule (each next token = previous + 1 mod vocab,
    from a random start, with a little noise), as a list of global (x, y) batches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        start = rng.integers(0, vocab, (batch, 1))
        seqs = (start + np.arange(seq + 1)) % vocab
        noise = rng.random(seqs.shape) < 0.05
        seqs = np.where(noise, rng.integers(0, vocab, seqs.shape), seqs)
        out.append((seqs[:, :-1], seqs[:, 1:]))
    return out
