"""The work of a training step, as plain data: what one rank's kernels compute and what its
collectives send, one declaration per module that the emulator charges and the planner sums.

Kernels (:mod:`.declared_kernels`; each knows its FLOPs and the bytes it reads and writes in HBM):

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
* :class:`RingAttention` (:mod:`.ring_work`): ring attention's steps over ``cp``, each a
  block of attention kernels computed while the next K/V block travels.

A module's :class:`Work` lists, in issue order, the items of its ``forward``,
``backward_input`` (B), ``backward_weight`` (W) and ``recompute`` (what backward runs
again first under full recomputation). ``print(work)`` shows it, and :func:`table` with a
device's times (``python -m emulator.planner --dims ... --work``).
"""

from dataclasses import dataclass, field

from ..errors import ConfigError
from .declared_kernels import KERNELS, Attention, Gemm, Memory, _mb  # noqa: F401 -- importable from here
from .dtypes import DTYPE_BYTES, dtype_bytes, dtype_name, np_dtype  # noqa: F401 -- importable from here too
from .ring_work import RingAttention  # noqa: F401 -- importable from here


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
