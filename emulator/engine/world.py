"""The SPMD view: ``World(n).run(fn)`` calls ``fn(comm)`` once per rank, in one process.

Each rank is a greenlet (a cooperative task). The scheduler runs ready ranks in rank order;
a rank that calls a collective records its input and switches away, and the last member
of the group to arrive runs the collective once, in the global view of
:mod:`emulator.algorithms.step_plans`, and hands every member its result. Point-to-point sends wait for
the matching receive, as NCCL's do (:mod:`emulator.engine.p2p`). So:

* results never depend on scheduling, and runs are deterministic;
* a deadlock is exact: nothing is ready and some rank has not returned;
* time is simulated (:mod:`emulator.engine.clock`): a compute stream and a stream per group on
  each rank, links shared as :mod:`emulator.machine.links` describes;
* ``faults=`` kills a rank at a simulated time or slows it down (:mod:`emulator.engine.faults`):
  the others wait until their watchdog fires, and ``run`` raises a ``RankFailedError``.

Errors (all subclasses of ``EmulatorError``) are raised from ``run`` at once. A folded
world runs one representative of ranks that are alike (:mod:`emulator.engine.folding`);
what a run leaves to read is in :mod:`emulator.engine.world_records`.
"""

import traceback
from collections import deque

import numpy as np

from ..algorithms import step_plans as P
from .clock import Clock
from .comm import Comm
from .faults import DEFAULT_WATCHDOG_TIMEOUT, Faults, RankDied, Unfinished, resolve
from .folding import Folding
from ..errors import ConfigError, DeadlockError, EmulatorError, MeshError, RankError
from ..records.memory import MemoryLedger
from ..mesh import Mesh
from .p2p import BATCH_HINT, DEADLOCK_HINT
from .wall_clock import WallGuard, WallInterrupt, check_wall_timeout, stopped_error
from .world_records import Records
from ..machine.topology import Topology
from ..machine.precision import precision_preset
from ..machine.stack import stack_preset


def _greenlet():
    """greenlet, imported when a World first runs: the planner, the formulas and the cost
    model import and work where it cannot be installed."""
    try:
        import greenlet
    except ImportError as exc:
        raise ImportError(f"World.run needs greenlet, which cannot be imported here ({exc}): "
                          f"pip install greenlet (a dependency of this package)") from None
    return greenlet


def _mesh_and_topology(n, mesh, topology):
    if mesh is None:
        return n, None, topology or Topology()
    if isinstance(mesh, dict):
        if not mesh:
            raise MeshError("mesh must be a non-empty dict of axis name -> size, e.g. {'dp': 2, 'tp': 4}")
        mesh = Mesh(mesh, gpus_per_node=(topology or Topology()).gpus_per_node)
    elif not isinstance(mesh, Mesh):
        raise MeshError(f"mesh must be a dict of axis name -> size or a Mesh, got {mesh!r}")
    if topology is None:
        topology = Topology(gpus_per_node=mesh.gpus_per_node)
    elif topology.gpus_per_node != mesh.gpus_per_node:
        raise MeshError(f"the mesh says {mesh.gpus_per_node} GPUs per node, the topology "
                        f"{topology.gpus_per_node}; make them agree")
    if n is not None and n != mesh.size:
        raise MeshError(f"mesh {mesh.shape} has {' x '.join(map(str, mesh.sizes))} = {mesh.size} ranks, "
                        f"but World was asked for {n}; make the axis sizes multiply to {n}")
    return mesh.size, mesh, topology


class World(Folding, Records):
    """An emulated machine of ``n`` GPUs, optionally arranged as a named mesh.

    ``World(8)`` or ``World(mesh={"dp": 2, "pp": 2, "tp": 2})`` (or a
    :class:`~emulator.mesh.Mesh`; last axis innermost, so consecutive ranks, which share a
    node, differ in the last axis). ``topology`` defaults to H100 nodes of 8 GPUs.
    ``algorithm`` is the default for all_reduce, reduce_scatter and all_gather:
    ``"ring"``, ``"tree"`` or ``"naive"``. ``faults``: :class:`~emulator.engine.faults.RankFailure`
    and :class:`~emulator.engine.faults.Straggler` entries; ``watchdog_timeout``: seconds a
    rank waits in an operation before its watchdog takes it down (ProcessGroupNCCL's 600).
    ``stack``: the software stack the modules' declared work is charged as (a name or a
    :class:`~emulator.machine.stack.Stack`; None: ``"megatron-core"``); ``precision``: the
    policy the modules cast their payloads to (None: every number as the arrays hold it).
    ``wall_timeout``: seconds of *wall-clock* time a ``run`` may take (None: no bound);
    past it, every rank still running is stopped, a rank stuck in a loop in pure Python
    included, and ``run`` raises a :class:`~emulator.errors.WallTimeoutError` naming each
    and what it last did (:mod:`emulator.engine.wall_clock`; ``run`` may be called from
    the main thread or any other).
    """

    def __init__(self, n=None, mesh=None, topology=None, algorithm="ring", fold=(), faults=(),
                 watchdog_timeout=DEFAULT_WATCHDOG_TIMEOUT, stack=None, precision=None, wall_timeout=None):
        self.wall_timeout = check_wall_timeout(wall_timeout)
        n, self.mesh, self.topology = _mesh_and_topology(n, mesh, topology)
        self.stack = stack_preset(stack)
        self.precision = None if precision is None else precision_preset(precision)
        if not (isinstance(n, (int, np.integer)) and n >= 1):
            raise ConfigError(f"World needs a positive number of ranks, got {n!r}")
        P.check_algorithm(algorithm, who="World: ")
        self.size = int(n)
        self.algorithm = algorithm
        self._fold(tuple(fold))
        self.faults = Faults(faults, self.size, watchdog_timeout, folded=bool(self.fold))
        self._patterns = {}
        self._live_counts = {}  # group ranks -> how many of them run
        self._reset()

    def __repr__(self):
        shape = f"mesh={self.mesh.shape}" if self.mesh else f"n={self.size}"
        return f"World({shape}, gpus_per_node={self.topology.gpus_per_node}, algorithm={self.algorithm!r})"

    # ----------------------------------------------------------------- state of one run
    def _reset(self):
        n = self.size
        self.clock = Clock(n, self.topology, self._patterns, self.representative, self.faults.deadline)
        self.memory = [MemoryLedger(r, self._clock_of(r)) for r in range(n)]
        self.calls = [[] for _ in range(n)]  # per rank, the Calls it issued (emulator.records.calls)
        self._charges = [[] for _ in range(n)]  # per rank, the declared passes open (emulator.engine.charging)
        self.charged = [[] for _ in range(n)]  # per rank, (pass, [(name, kernels)]) as charged
        self.kinds = {}  # a charged name -> the kind of its kernels (gemm, attention, memory), for breakdowns
        self._pending = {}  # (group ranks, seq) -> Rendezvous
        self._seq = {}  # (group ranks, global rank) -> next sequence number
        self._p2p = {}  # (group ranks, src, dst) -> (posted sends, posted recvs)
        self._p2p_separate = {}  # (group ranks, rank, peer) -> that rank's last separately issued op with the peer
        self._p2p_batches = {}  # (group ranks, rank) -> (batches it posted on the group, the last one)
        self._waiting = {}  # global rank -> callable describing what it waits for
        self._ready = deque()
        self._finished = [False] * n
        self._failure = None
        self._trace_cache = None
        self.dead = {}  # rank -> when it died (a RankFailure)
        self._broken = []  # collectives a dying member never finished
        # folded worlds: per rank, the collectives whose other members are all folded into it; they
        # run when the rank next blocks (or returns), as the last member would have arrived then
        self._deferred = [[] for _ in range(n)]
        self.faults.doomed = set()

    def _clock_of(self, r):
        return lambda: self.clock.compute[r]

    # ----------------------------------------------------------------- running programs
    def run(self, fn, *args, **kwargs):
        """Call ``fn(comm, *args, **kwargs)`` once per rank; return the results by rank."""
        if self.wall_timeout is None:
            return self._run(fn, args, kwargs, None)
        guard, results = WallGuard(self.wall_timeout), None
        try:
            with guard:
                results = self._run(fn, args, kwargs, guard)
        except WallInterrupt as exc:  # it came outside any rank, after the ranks stopped
            guard.taken()
            if results is None:
                raise stopped_error(self, self.wall_timeout, None, exc) from None
        return results

    def _run(self, fn, args, kwargs, guard):
        greenlet = _greenlet()
        self._reset()
        main = greenlet.getcurrent()
        results = [None] * self.size

        def body(rank):
            try:
                results[rank] = fn(Comm(self, rank, tuple(range(self.size)), "world"), *args, **kwargs)
            except greenlet.GreenletExit:
                raise
            except RankDied as died:
                self.dead[rank] = died.at
            except WallInterrupt as exc:
                if guard is None:  # another World's bound (this one runs inside it): that World stops
                    raise
                guard.taken()
                self._failure = stopped_error(self, self.wall_timeout, rank, exc)
            except EmulatorError as exc:
                self._failure = exc
            except BaseException as exc:  # noqa: BLE001 -- re-raised below with the rank
                self._failure = RankError(rank, exc, traceback.format_exc())
                self._failure.__cause__ = exc
            if self._failure is None and rank not in self.dead:
                try:
                    self.run_deferred(rank)
                except EmulatorError as exc:
                    self._failure = exc
            self._finished[rank] = True
            self._waiting.pop(rank, None)

        tasks = {r: greenlet.greenlet(lambda r=r: body(r), parent=main) for r in self.live}
        self._main = main
        self._ready.extend(self.live)
        try:
            while self._ready and self._failure is None:
                tasks[self._ready.popleft()].switch()
        except WallInterrupt as exc:  # between two ranks: none had the thread
            if guard is None:
                raise
            guard.taken()
            self._failure = stopped_error(self, self.wall_timeout, None, exc)
        for t in tasks.values():  # stop whatever still waits, running its finally blocks
            if t and not t.dead:
                t.throw(greenlet.GreenletExit)
        if self._failure is not None:
            raise self._failure
        if self.dead or self.faults.doomed or not all(self._finished[r] for r in self.live):
            failed = resolve(self)
            if failed is not None:
                raise failed
            raise DeadlockError(self._describe_deadlock())
        return results

    def finished(self, rank):
        """Has ``rank`` returned (or died) in the last run?"""
        return self._finished[rank]

    def unfinished_ops(self, rank):
        """The operations ``rank`` issued that never completed (for the watchdog)."""
        out = [Unfinished(rv.op, rv.seq, rv.label, rv.ranks, [m for m in rv.ranks if m not in rv.ready],
                          rv.ready[rank]) for rv in self._pending.values() if rank in rv.ready]
        out += [Unfinished(rv.op, rv.seq, rv.label, rv.ranks, sorted(self.faults.doomed & set(rv.ranks)),
                           rv.ready[rank]) for rv in self._broken if rank in rv.ready]
        for (ranks, _, _), sides in self._p2p.items():
            out += [Unfinished(side.kind, side.k, side.label, ranks, [side.peer], side.issued)
                    for box in sides for side in box if side.rank == rank and not side.done]
        return out

    def _block(self, rank, why):
        """Switch away from ``rank`` until something calls ``_wake(rank)``. Callers loop
        on their condition, so a wake-up that finds it still false just blocks again.
        ``why`` is a callable describing the wait (only called to report a deadlock).
        A rank with deferred collectives runs those instead and returns (its caller checks
        its condition again)."""
        if self._deferred[rank]:
            self.run_deferred(rank)
            return
        self._waiting[rank] = why
        self._main.switch()

    def _wake(self, rank):
        if self._waiting.pop(rank, None) is not None:
            self._ready.append(rank)

    def _describe_deadlock(self):
        lines = ["deadlock: every rank that has not returned is blocked, and nothing can complete."]
        waits = {r: (self._waiting[r]() if r in self._waiting else "is blocked")
                 for r in self.live if not self._finished[r]}
        lines += [f"  rank {r} {why}" for r, why in waits.items()]
        done = [r for r in self.live if self._finished[r]]
        lines.append(f"  returned already: {done if done else 'none'}")
        if any(why.startswith("waits in send(") for why in waits.values()):
            lines.append(DEADLOCK_HINT)
        if any(why.startswith("waits in batch_isend_irecv") for why in waits.values()):
            lines.append(BATCH_HINT)
        return "\n".join(lines)
