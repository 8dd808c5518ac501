"""The work of a training step, as plain data: what one rank's kernels compute and what its
collectives send, one declaration per module that the emulator charges and the planner sums.

Kernels (each knows its FLOPs and the bytes it reads and writes in HBM):

* :class:`Gemm` ``(m, n, k)``: C (m x n) = A (m x k) B (k x n), ``count`` such products
  (a batched GEMM), inputs in ``dtype``, output in ``out_dtype``; ``accumulate=True``
  adds into C (reads it too), as a weight-gradient GEMM that accumulates into fp32 main
  gradients does (Megatron's gradient-accumulation fusion);
* :class:`Attention`: a fused attention kernel (FlashAttention, cuDNN) over ``passes``
  products of (s_q x s_k) x d per head, on ``fraction`` of the score blocks;
* :class:`Memory`: a memory-bound kernel (a norm, an activation, a residual add, a cast,
  the optimizer's update...), timed by the bytes it reads and writes; ``op`` names its kind.

Communication (each names its group by mesh axes, its payload's dtype and its bytes as
nccl-tests counts them: an all-reduce's or a reduce-scatter's input, an all-gather's
output):

* :class:`Collective` (``all_reduce``, ``reduce_scatter``, ``all_gather``);
* :class:`AllToAll`: ``bytes_per_peer`` to every member of the group;
* :class:`RingAttention`: ring attention's steps over ``cp``, each a block of attention
  kernels computed while the next K/V block travels.

A module's :class:`Work` lists, in issue order, the items of its ``forward``,
``backward_input`` (B), ``backward_weight`` (W) and ``recompute`` (what backward runs
again first under full recomputation). ``print(work)`` shows it, and :func:`table` with a
device's times (``python -m emulator.planner --dims ... --work``).
"""

from dataclasses import dataclass, field
from typing import ClassVar

from ..errors import ConfigError
from .dtypes import DTYPE_BYTES, dtype_bytes, dtype_name, np_dtype  # noqa: F401 -- importable from here too


# ----------------------------------------------------------------- kernels
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

    def __str__(self):
        mask = f", {self.fraction:.2f} of the blocks" if self.fraction < 1 else ""
        what = "forward" if self.passes <= 2 else "backward"
        return f"{self.impl} attention {what}: b {self.b}, heads {self.h}, {self.s_q} x {self.s_k}, d {self.d}{mask}"


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

    def __str__(self):
        return f"{self.op}: reads {_mb(self.read)}, writes {_mb(self.written)}"


KERNELS = (Gemm, Attention, Memory)


# ----------------------------------------------------------------- communication
@dataclass(frozen=True)
class Collective:
    name: str
    op: str
    group: str
    size: int
    nbytes: float
    dtype: str
    overlap: tuple = None  # how it runs beside the GEMM next to it (emulator.machine.comm_overlap), or None

    def __post_init__(self):
        if self.op not in ("all_reduce", "reduce_scatter", "all_gather", "broadcast"):
            raise ConfigError(f"Collective {self.name!r}: unknown op {self.op!r}")

    @property
    def input_bytes(self):
        """Bytes each rank passes in (the call's own size): an all-gather's is 1/size of its output."""
        return self.nbytes / self.size if self.op == "all_gather" else self.nbytes

    def __str__(self):
        return f"{self.op} over {self.group} ({self.size}), {_mb(self.nbytes)} of {self.dtype}"


@dataclass(frozen=True)
class AllToAll:
    name: str
    group: str
    size: int
    bytes_per_peer: float
    dtype: str

    def __str__(self):
        return f"all_to_all over {self.group} ({self.size}), {_mb(self.bytes_per_peer)} of {self.dtype} to each peer"


@dataclass(frozen=True)
class RingAttention:
    """Ring attention over ``group``: per step, the attention kernels of the blocks the
    busiest rank computes and the K/V bytes it passes on meanwhile (backward also sends
    the block's dK/dV on)."""

    name: str
    group: str
    size: int
    forward: bool
    steps: tuple  # ((kernels, kv_bytes), ...)
    dtype: str

    @property
    def flops(self):
        return sum(k.flops for kernels, _ in self.steps for k in kernels)

    def __str__(self):
        kv = self.steps[0][1] if self.steps else 0
        return f"ring attention {'forward' if self.forward else 'backward'} over {self.group}: {len(self.steps)} " \
               f"steps, {_mb(kv)} of K/V per step"


COMMS = (Collective, AllToAll, RingAttention)


def is_kernel(item):
    return isinstance(item, KERNELS)


def is_comm(item):
    return isinstance(item, COMMS)


def flops_of(items):
    """FLOPs the kernels of ``items`` compute (ring attention's steps included)."""
    return sum(x.flops for x in items if is_kernel(x) or isinstance(x, RingAttention))


# ----------------------------------------------------------------- a module's work
PASSES = ("forward", "backward_input", "backward_weight", "recompute")


@dataclass(frozen=True)
class Work:
    """One module's declared work for one micro-batch on one rank, pass by pass."""

    module: str
    forward: tuple = ()
    backward_input: tuple = ()
    backward_weight: tuple = ()
    recompute: tuple = ()
    notes: tuple = field(default=(), compare=False)

    def passes(self):
        return {p: getattr(self, p) for p in PASSES}

    def items(self):
        return [x for p in PASSES for x in getattr(self, p)]

    def kernels(self, pass_=None):
        src = getattr(self, pass_) if pass_ else self.items()
        return [x for x in src if is_kernel(x)]

    def comms(self, pass_=None):
        src = getattr(self, pass_) if pass_ else self.items()
        return [x for x in src if is_comm(x)]

    def __add__(self, other):
        return Work(f"{self.module} + {other.module}", *(getattr(self, p) + getattr(other, p) for p in PASSES),
                    notes=self.notes + other.notes)

    def __str__(self):
        return table(self)


def concat(module, *works):
    """One Work of several in order: forward in the given order, backward in reverse."""
    works = [w for w in works if w is not None]
    return Work(module, sum((w.forward for w in works), ()),
                sum((w.backward_input for w in reversed(works)), ()),
                sum((w.backward_weight for w in reversed(works)), ()),
                sum((w.recompute for w in works), ()), sum((w.notes for w in works), ()))


def _mb(nbytes):
    return f"{nbytes / 1e6:,.2f} MB"


def table(work, times=None):
    """Every item of ``work`` a line, pass by pass; ``times(item)`` (seconds) adds a column."""
    lines = [f"{work.module}:"]
    for p in PASSES:
        items = getattr(work, p)
        if not items:
            continue
        total = 0.0
        lines.append(f"  {p}:")
        for x in items:
            t = times(x) if times is not None else None
            total += t or 0.0
            when = f"{t * 1e6:10.1f} us  " if t is not None else ""
            lines.append(f"    {when}{x.name:<28} {x}")
        if times is not None:
            lines.append(f"    {total * 1e6:10.1f} us  in all")
    lines += [f"  note: {n}" for n in work.notes]
    return "\n".join(lines)
