"""The kernels of a module's declared work (:mod:`emulator.machine.work`), as plain data:
each knows its FLOPs and the bytes it reads and writes in HBM.

* :class:`Gemm` ``(m, n, k)``: C (m x n) = A (m x k) B (k x n), ``count`` such products
  (a batched GEMM), inputs in ``dtype``, output in ``out_dtype``; ``accumulate=True``
  adds into C (reads it too), as a weight-gradient GEMM that accumulates into fp32 main
  gradients does (Megatron's gradient-accumulation fusion);
* :class:`Attention`: a fused attention kernel (FlashAttention, cuDNN) over ``passes``
  products of (s_q x s_k) x d per head, on ``fraction`` of the score blocks;
* :class:`Memory`: a memory-bound kernel (a norm, an activation, a residual add, a cast,
  the optimizer's update...), timed by the bytes it reads and writes; ``op`` names its kind.
"""

from dataclasses import dataclass
from typing import ClassVar

from .dtypes import dtype_bytes
from .frozen import computed_once


@dataclass(frozen=True)
class Gemm:
    name: str
    m: int
    n: int
    k: int
    dtype: str = "bf16"
    count: int = 1
    out_dtype: str = None
    accumulate: bool = False
    kind: ClassVar[str] = "gemm"

    @property
    def flops(self):
        return 2.0 * self.m * self.n * self.k * self.count

    @property
    def bytes_read(self):
        a = dtype_bytes(self.dtype)
        c = dtype_bytes(self.out_dtype or self.dtype)
        return self.count * (a * (self.m * self.k + self.k * self.n) + (c * self.m * self.n if self.accumulate else 0))

    @property
    def bytes_written(self):
        return self.count * dtype_bytes(self.out_dtype or self.dtype) * self.m * self.n

    @property
    def nbytes(self):
        return self.bytes_read + self.bytes_written

    @property
    def shape(self):
        return (self.m, self.n, self.k)

    @computed_once
    def timing_key(self):
        """Everything its time depends on (all but its name): equal keys, equal seconds."""
        return ("gemm", self.m, self.n, self.k, self.dtype, self.count, self.out_dtype, self.accumulate)

    def __str__(self):
        batch = f"{self.count} x " if self.count > 1 else ""
        acc = ", += into " + (self.out_dtype or self.dtype) if self.accumulate else ""
        return f"GEMM {batch}({self.m} x {self.k}) @ ({self.k} x {self.n}) {self.dtype}{acc}"


@dataclass(frozen=True)
class Attention:
    name: str
    b: int
    h: int
    s_q: int
    s_k: int
    d: int
    passes: int = 2
    fraction: float = 1.0
    dtype: str = "bf16"
    impl: str = "flash"
    kind: ClassVar[str] = "attention"

    @property
    def flops(self):
        return self.passes * 2.0 * self.b * self.h * self.s_q * self.s_k * self.d * self.fraction

    @property
    def nbytes(self):  # Q and O (and their gradients) in and out, K and V streamed: FlashAttention's IO
        return dtype_bytes(self.dtype) * self.b * self.h * self.d * (2 * self.s_q + 2 * self.s_k)

    @property
    def shape(self):
        return (self.b, self.h, self.s_q, self.s_k, self.d, self.passes, float(self.fraction))

    @computed_once
    def timing_key(self):
        """Everything its time depends on (all but its name)."""
        return ("attention",) + self.shape + (self.dtype, self.impl)

    def __str__(self):
        mask = f", {self.fraction:.2f} of the blocks" if self.fraction < 1 else ""
        what = "forward" if self.passes <= 2 else "backward"
        kernel = {"flash": "fused attention", "flash2": "FlashAttention-2"}.get(self.impl, f"{self.impl} attention")
        return f"{kernel} {what}: b {self.b}, heads {self.h}, {self.s_q} x {self.s_k}, d {self.d}{mask}"


@dataclass(frozen=True)
class Memory:
    name: str
    op: str
    read: float
    written: float
    kind: ClassVar[str] = "memory"
    flops: ClassVar[float] = 0.0
    shape: ClassVar[tuple] = ()

    @property
    def nbytes(self):
        return float(self.read + self.written)

    @computed_once
    def timing_key(self):
        """Everything its time depends on (all but its name)."""
        return ("memory", self.op, self.read, self.written)

    def __str__(self):
        return f"{self.op}: reads {_mb(self.read)}, writes {_mb(self.written)}"


KERNELS = (Gemm, Attention, Memory)


def _mb(nbytes):
    return f"{nbytes / 1e6:,.2f} MB"
