"""Vocabulary-parallel embedding and cross-entropy equal the single-device ones."""

import numpy as np
import pytest

from emulator import ConfigError, World, nn
from emulator.parallel.vocab_parallel import (vocab_parallel_cross_entropy, vocab_parallel_embedding,
                                              vocab_parallel_embedding_backward)

V, D = 12, 5


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_cross_entropy_and_embedding_equal_one_device(t):
    rng = np.random.default_rng(t)
    logits = rng.standard_normal((2, 7, V)) * 3
    targets = rng.integers(0, V, (2, 7))
    loss_ref, cache = nn.cross_entropy(logits, targets)
    grad_ref = nn.cross_entropy_backward(cache)
    table = rng.standard_normal((V, D))
    emb = nn.Embedding(V, D, dtype=np.float64)
    y_ref, ecache = emb.forward({"w": table}, targets)
    dy = rng.standard_normal(y_ref.shape)
    gw_ref = emb.backward_weight({"w": table}, ecache, dy)["w"]

    def prog(comm):
        n = V // t
        cols = slice(comm.rank * n, (comm.rank + 1) * n)
        loss, grad = vocab_parallel_cross_entropy(comm, logits[..., cols], targets, V)
        y, c = vocab_parallel_embedding(comm, table[cols], targets, V)
        return loss, grad, y, vocab_parallel_embedding_backward(table[cols], c, dy), cols

    w = World(t)
    for loss, grad, y, gw, cols in w.run(prog):
        assert loss == pytest.approx(loss_ref, rel=1e-12)
        assert np.allclose(grad, grad_ref[..., cols]) and np.allclose(y, y_ref) and np.allclose(gw, gw_ref[cols])
    if t > 1:  # the logits never travel: three all-reduces of one number per token, and the embedding's
        assert [c.op for c in w.calls[0]] == ["all_reduce"] * 4
        assert [c.nbytes for c in w.calls[0]][:3] == [2 * 7 * 8] * 3


def test_vocabulary_must_divide():
    with pytest.raises(ConfigError, match="must divide"):
        World(5).run(lambda c: vocab_parallel_cross_entropy(c, np.zeros((1, 1, 2)), np.zeros((1, 1), int), V))
