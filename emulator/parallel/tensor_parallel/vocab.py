"""Vocabulary parallelism (Megatron-LM): the embedding table and the output layer split by
vocabulary over the tp ranks, so the (b, s, V) logits are never gathered on one GPU.

* :func:`vocab_parallel_embedding`: rank r holds rows ``r V/t ... (r+1) V/t`` of the
  table; it looks up the tokens that fall in its range (zeros for the others) and an
  all-reduce sums the ranks' partial embeddings. Backward needs no communication: each
  rank's rows get the gradient of its own tokens.
* :func:`vocab_parallel_cross_entropy`: the logits of rank r are the columns of its
  vocabulary range. The softmax's normaliser needs every column, but only three numbers
  per token cross the ranks: the max (all-reduce max), the sum of exponentials (all-reduce
  sum) and the target's logit (all-reduce sum; only the rank whose range holds the target
  contributes). loss = mean(log sum exp - target logit); the gradient of the local
  columns is (softmax - one-hot) / tokens, computed locally.
"""

import numpy as np

from ...errors import ConfigError


def vocab_range(comm, vocab):
    if vocab % comm.size:
        raise ConfigError(f"the vocabulary ({vocab}) must divide by the tensor-parallel size ({comm.size})")
    n = vocab // comm.size
    return comm.rank * n, (comm.rank + 1) * n


def vocab_parallel_lookup(comm, table_shard, ids, vocab):
    """This rank's part of the embeddings of ``ids``: its rows for the ids in its range,
    zeros for the others (the sum over the ranks is the lookup). Returns (part, cache)."""
    lo, hi = vocab_range(comm, vocab)
    mine = (ids >= lo) & (ids < hi)
    part = np.where(mine[..., None], table_shard[np.where(mine, ids - lo, 0)], 0).astype(table_shard.dtype)
    return part, {"ids": ids, "mine": mine, "lo": lo}


def vocab_parallel_embedding(comm, table_shard, ids, vocab):
    """Embeddings of ``ids`` (any shape) from this rank's rows of the table, summed over
    the ranks. Returns (embeddings, cache)."""
    part, cache = vocab_parallel_lookup(comm, table_shard, ids, vocab)
    return comm.all_reduce(part), cache


def vocab_parallel_embedding_backward(table_shard, cache, dy):
    """Gradient of this rank's rows (no communication): ``dy`` is the whole embeddings'."""
    grad = np.zeros_like(table_shard, dtype=dy.dtype)
    np.add.at(grad, cache["ids"][cache["mine"]] - cache["lo"], dy[cache["mine"]])
    return grad


def vocab_parallel_cross_entropy(comm, logits_shard, targets, vocab, dtype=None):
    """Mean cross-entropy over tokens from this rank's vocabulary columns of the logits.
    Returns (loss, gradient of ``logits_shard``). ``dtype``: the dtype its three reductions
    travel in (the precision policy's ``loss``; None: the logits')."""
    lo, hi = vocab_range(comm, vocab)
    cast = (lambda a: a) if dtype is None else (lambda a: a.astype(dtype))

    def reduce(a, op="sum"):  # over the tp ranks (a group of one has nothing to reduce)
        return a if comm.size == 1 else comm.all_reduce(cast(a), op=op).astype(logits_shard.dtype)

    m = reduce(logits_shard.max(-1), "max")  # (b, s)
    e = np.exp(logits_shard - m[..., None])
    sum_exp = reduce(e.sum(-1))
    mine = (targets >= lo) & (targets < hi)
    picked = np.take_along_axis(logits_shard, np.where(mine, targets - lo, 0)[..., None], -1)[..., 0]
    target_logit = reduce(np.where(mine, picked, 0.0))
    loss = float(np.mean(np.log(sum_exp) + m - target_logit))
    grad = e / sum_exp[..., None]
    rows = np.nonzero(mine)
    grad[rows + (targets[rows] - lo,)] -= 1.0
    return loss, grad / targets.size
