"""Ring attention's declared work (:mod:`emulator.machine.work`): per step, the score
blocks the busiest rank computes and the K/V bytes it passes on meanwhile.

A ring over ``cp`` ranks has ``cp`` steps; at 1,024 ranks the steps' kernels are thousands
of objects, while the blocks come in a handful of shapes. :class:`RingAttention` keeps
each step's blocks as their shapes (``blocks``, plain integers) and builds the step's
kernels, one :class:`~emulator.machine.declared_kernels.Attention` per block named
``attention: ring step t`` as the engine charges them, when ``steps`` is first read.
What a clock sums over steps it can sum over :attr:`RingAttention.distinct`: each shape
of step once, with how many steps have it (sums over steps do not depend on their order).
"""

from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache

from .declared_kernels import Attention, _mb
from .frozen import hash_once


@dataclass(frozen=True)
class RingAttention:
    """Ring attention over ``group`` (``size`` ranks): ``blocks[t]`` holds the (query rows,
    key rows) of each score block the busiest rank computes at step t, each a fused kernel
    over ``heads`` (batch x heads) heads of ``head_dim`` with ``passes`` products, in
    ``compute``; ``kv_bytes`` of K/V travel on per step in ``dtype`` (backward also sends
    the block's dK/dV on)."""

    name: str
    group: str
    size: int
    forward: bool
    blocks: tuple  # ((s_q, s_k), ...) per step
    kv_bytes: float
    dtype: str
    heads: int = 1
    head_dim: int = 128
    passes: int = 2
    compute: str = "bf16"
    impl: str = "flash"  # the fused kernel (:attr:`~emulator.machine.stack.Stack.flash_kernel`)

    __hash__ = hash_once  # the blocks of a long ring are long: hashed once

    def kernels(self, t):
        """Step t's kernels."""
        return tuple(Attention(f"attention: ring step {t}", self.heads, 1, sq, sk, self.head_dim, self.passes, 1.0,
                               self.compute, self.impl) for sq, sk in self.blocks[t])

    @cached_property
    def steps(self):
        """``((kernels, kv_bytes), ...)``, one per step."""
        return tuple((self.kernels(t), self.kv_bytes) for t in range(len(self.blocks)))

    @cached_property
    def distinct(self):
        """``((kernels, count), ...)``: each shape of step once (its first step's kernels),
        with the number of steps of that shape."""
        return self.grouped(0, len(self.blocks))

    def grouped(self, start, stop):
        """:attr:`distinct` over steps ``start`` to ``stop - 1``."""
        return tuple((self.kernels(t), n) for t, n in _first_and_count(self.blocks, start, stop))

    @property
    def kernel_count(self):
        return sum(len(kernels) * n for kernels, n in self.distinct)

    @property
    def flops(self):
        return sum(n * k.flops for kernels, n in self.distinct for k in kernels)

    def __str__(self):
        return f"ring attention {'forward' if self.forward else 'backward'} over {self.group}: {len(self.blocks)} " \
               f"steps, {_mb(self.kv_bytes if self.blocks else 0)} of K/V per step"


@lru_cache(maxsize=4096)
def _first_and_count(blocks, start, stop):
    """``((t, count), ...)``: each shape of step among ``blocks[start:stop]``, at its first
    step t, with the number of steps of that shape (rings of one layout share it)."""
    counts, first = Counter(blocks[start:stop]), {}
    for t in range(start, stop):
        first.setdefault(blocks[t], t)
    return tuple((t, counts[b]) for b, t in first.items())
