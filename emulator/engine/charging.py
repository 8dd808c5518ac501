"""A module's declared work, charged as it runs.

Each module of a transformer step declares, for its shape, the kernels and collectives of
each pass (:mod:`emulator.machine.work`). While the module computes, a :class:`Charges`
for the pass is open on the rank: ``comm.charge(name)`` advances the rank's clock by the
declared kernels of that name (a name covers a chain: ``"ln1"`` is one fused kernel, or
``"ln1: pow"``, ``"ln1: mean"``... in eager torch), so the clock moves per declared
kernel and by nothing else. When the pass ends the charges check that every declared
kernel was charged and that the collectives the rank issued meanwhile are the declared
ones (op and bytes, as :mod:`emulator.records.calls` records them): a module whose
code and declaration drift apart fails at once, naming both.

The host: a kernel cannot start before the host has issued it. Each declared kernel costs
the stack's ``dispatch`` seconds of host time and starts no earlier than that; the GPU
waits for a host that falls behind (a step of many small kernels is bound by its host).
The host runs ahead of the GPU otherwise, and catches up only where the program waits for
a result on the host (``comm.sync_host()``: the loss read at the end of a step).

Passes nest: a block's pass covers its attention's and its MLP's, which charge into it.

A per-op checkpoint (:mod:`emulator.parallel.tensor_parallel.op_checkpoint`) runs a block's
forward again in backward with some ops' outputs replayed: once ``comm.replayed(name)``
says an op was, charging that name (with nothing else of it declared) charges nothing, as
the replayed op computed nothing. An op computed again instead is not excused: its charge
is not in the declaration, and the pass fails.
"""

from ..errors import EmulatorError
from ..machine.comm_overlap import sm_slowdown
from ..machine.work import AllToAll, Collective, RingAttention, is_kernel


class WorkMismatch(EmulatorError):
    """A module's code and its declaration of work disagree (a bug in the library)."""


class Charges:
    def __init__(self, comm, items, what):
        self.comm, self.what = comm, what
        self.kernels = [k for x in items for k in ([x] if is_kernel(x) else _ring_kernels(x))]
        self.comms = [x for x in items if isinstance(x, (Collective, AllToAll))]
        self.calls0 = len(comm._world.calls[comm.global_rank])
        self.charged = []  # (name, kernels) in the order charged, for tests
        # Transformer Engine's overlaps (emulator.machine.comm_overlap): the ring exchange whose rows
        # the next GEMM computes on, when a pipelined collective may start, the last kernels charged
        self.ring, self.ready_at, self.last_kernel = None, None, None
        self.bulk_sms = 0  # SMs a bulk overlap takes from the GEMMs charged meanwhile
        self.pipelined = {}  # id of a declared GEMM -> the pipelined collective after it
        self.replayed = set()  # names of ops a per-op checkpoint replayed (charged nothing)
        for a, b in zip(items, items[1:]):
            if is_kernel(a) and isinstance(b, Collective) and b.overlap and b.overlap[0] == "pipeline":
                self.pipelined[id(a)] = b.overlap

    def take(self, name, optional=False):
        """The declared kernels called ``name`` (or ``name: ...``), removed from what is left."""
        prefix = name + ": "
        hit = [x for x in self.kernels if x.name == name or x.name.startswith(prefix)]
        if not hit and (optional or any(r == name or r.startswith(prefix) for r in self.replayed)):
            return []
        if not hit:
            raise WorkMismatch(f"rank {self.comm.global_rank}: {self.what} charged {name!r}, which its declaration "
                               f"does not list (left: {sorted({x.name for x in self.kernels})})")
        ids = {id(x) for x in hit}
        self.kernels = [x for x in self.kernels if id(x) not in ids]
        self.charged.append((name, hit))
        return hit

    def slowdown_of(self, kernels, sms):
        """How much slower ``kernels`` run for the SMs a TE overlap takes from them: a GEMM
        before a pipelined reduce-scatter, or any GEMM while a bulk overlap runs."""
        overlap = self.pipelined.get(id(kernels[0]))
        if overlap is not None:
            return sm_slowdown(sms, overlap[2])
        if self.bulk_sms and kernels[0].kind == "gemm":
            return sm_slowdown(sms, self.bulk_sms)
        return 1.0

    def replace(self, name, kernels, comms=None):
        """Swap the declared kernels called ``name`` for ``kernels`` (what the module learns
        only as it runs: the rows routing sent each expert)."""
        prefix = name + ": "
        self.kernels = [x for x in self.kernels if not (x.name == name or x.name.startswith(prefix))] + list(kernels)

    def finish(self):
        rank = self.comm.global_rank
        if self.kernels:
            raise WorkMismatch(f"rank {rank}: {self.what} declared kernels it never charged: "
                               f"{[x.name for x in self.kernels]}")
        calls = [c for c in self.comm._world.calls[rank][self.calls0:] if c.op not in ("send", "recv")]
        want = sorted(_signature(x) for x in self.comms)
        got = sorted(_call_signature(c) for c in calls)
        if want != got:
            raise WorkMismatch(f"rank {rank}: {self.what} declared collectives {want} but issued {got}")


def _ring_kernels(x):
    return [k for kernels, _ in x.steps for k in kernels] if isinstance(x, RingAttention) else []


def _signature(x):
    """What a declared collective must match: its op and bytes (an all-to-all's bytes
    follow the routing, so only its op). Groups are named by the module's role (``tp``),
    a comm by whatever its creator called it: they are checked by the tests, not here."""
    if isinstance(x, AllToAll):
        return ("all_to_all", 0)
    return (x.op, round(x.input_bytes))


def _call_signature(c):
    if c.op in ("all_to_all", "all_to_all_single"):
        return ("all_to_all", 0)
    return (c.op, round(c.nbytes))


class Declared:
    """``with comm.declared(build, what):`` opens the pass ``build()`` declares, unless a pass
    is already open on this rank (then the module charges into it)."""

    def __init__(self, comm, build, what):
        self.comm, self.build, self.what, self.opened = comm, build, what, None

    def __enter__(self):
        stack = self.comm._world._charges[self.comm.global_rank]
        if not stack:
            self.opened = Charges(self.comm, self.build(), self.what)
            stack.append(self.opened)
        return self

    def __exit__(self, kind, exc, tb):
        if self.opened is not None:
            stack = self.comm._world._charges[self.comm.global_rank]
            stack.pop()
            if kind is None:
                self.opened.finish()
                self.comm._world.charged[self.comm.global_rank].append((self.what, self.opened.charged))
        return False
