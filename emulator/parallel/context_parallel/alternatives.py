"""Two other ways to split attention over the sequence, beside the ring.

* **All-gather K/V** (``all_gather_attention``): every rank all-gathers the whole
  sequence's keys and values, then computes its own queries against all of them. The
  bytes are the ring's, but they move before any compute (nothing to overlap them with)
  and every rank holds the whole sequence's K/V. Llama 3 trained its long-context stage
  this way (CP 16), with the zigzag layout.
* **Ulysses** (``ulysses_attention``, DeepSpeed): an all-to-all turns "my positions, every
  head" into "every position, my heads"; each rank runs ordinary attention on h/c heads;
  a second all-to-all turns the output back (the swap of :mod:`.ulysses`, which the
  block's :class:`~emulator.parallel.attention_cores.UlyssesCore` runs too). Its messages
  shrink as c grows, but c can be at most the number of heads (h must divide by c).

Forward only: they are here to be measured beside the ring (traffic, memory, limits).
"""

import math

import numpy as np

from ...nn.attention_core import softmax
from .layout import gather_sequence, positions
from .ulysses import causal_allowed, heads_per_rank, to_head_shards, to_sequence_shards


def _attention(q, k, v, allowed):
    # a Python float scale keeps float32 inputs float32 (np.sqrt would return a float64
    # scalar, which promotes the scores, and then the output and its all-to-all, to float64)
    s = q @ k.swapaxes(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    return softmax(s) @ v


def all_gather_attention(comm, q, k, v, causal=False, layout="contiguous"):
    """This rank's rows of attention, with every rank's K/V all-gathered first."""
    kv = comm.all_gather(np.stack([k, v])[None])  # (c, 2, ..., n, d)
    full_k = gather_sequence([kv[r, 0] for r in range(comm.size)], layout)
    full_v = gather_sequence([kv[r, 1] for r in range(comm.size)], layout)
    n, s = q.shape[-2], full_k.shape[-2]
    comm.memory.hold("gathered K/V", (full_k, full_v), "buffers")
    allowed = None
    if causal:
        allowed = np.arange(s)[None, :] <= positions(comm.rank, comm.size, n, layout)[:, None]
    comm.compute(flops=4 * int(np.prod(q.shape[:-2])) * n * s * q.shape[-1], name="attention on all K/V")
    out = _attention(q, full_k, full_v, allowed)
    comm.memory.release("gathered K/V")
    return out


def ulysses_attention(comm, q, k, v, causal=False, layout="contiguous"):
    """Attention with an all-to-all from sequence shards to head shards and back.
    ``q``, ``k``, ``v``: (b, h, n, d), this rank's positions (in ``layout``), every head."""
    c = comm.size
    b, h, n, d = q.shape
    g = heads_per_rank(comm, h)
    full = to_head_shards(comm, np.stack([q, k, v]), heads=2, seq=3)  # (3, b, g, s, d): every position, my heads
    comm.memory.hold("all positions, my heads", full, "buffers")
    s = full.shape[3]
    comm.compute(flops=4 * b * g * s * s * d, name="attention on my heads")
    o = _attention(full[0], full[1], full[2], causal_allowed(c, n, layout)[0] if causal else None)
    comm.memory.release("all positions, my heads")
    return to_sequence_shards(comm, o, n)  # (b, h, n, d): my positions, every head
