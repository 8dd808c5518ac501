"""The SPMD view: ``World(n).run(fn)`` calls ``fn(comm)`` once per rank, in one process.

Each rank is a greenlet (a cooperative task). The scheduler runs ready ranks in rank order;
a rank that calls a collective records its input and switches away, and the last member
of the group to arrive runs the collective once, in the global view of
:mod:`emulator.collectives`, and hands every member its result. So:

* results never depend on scheduling, and runs are deterministic;
* a deadlock is exact: nothing is ready and some rank has not returned;
* time is simulated: each rank has a compute clock and a communication stream, and a
  collective starts when its last member is ready.

Errors (all subclasses of ``EmulatorError``) are raised from ``run`` at once.
"""

import traceback
from collections import deque

import greenlet
import numpy as np

from . import collectives as C
from .comm import Comm
from .errors import ArgumentError, DeadlockError, EmulatorError, MeshError, RankError
from .memory import MemoryLedger
from .table import Table
from .topology import Topology
from .trace import Event, Timeline, stats_from


class World:
    """An emulated machine of ``n`` GPUs, optionally arranged as a named mesh.

    ``World(8)`` or ``World(mesh={"dp": 2, "pp": 2, "tp": 2})`` (last axis innermost, so
    consecutive ranks, which share a node, differ in the last axis). ``algorithm`` is the
    default for all_reduce, reduce_scatter and all_gather: ``"ring"``, ``"tree"`` or
    ``"naive"``.
    """

    def __init__(self, n=None, mesh=None, topology=None, algorithm="ring"):
        if mesh is not None:
            if not isinstance(mesh, dict) or not mesh:
                raise MeshError(f"mesh must be a non-empty dict of axis name -> size, got {mesh!r}")
            for axis, size in mesh.items():
                if not (isinstance(size, (int, np.integer)) and size >= 1):
                    raise MeshError(f"mesh axis {axis!r} has size {size!r}; sizes must be positive ints")
            product = int(np.prod(list(mesh.values())))
            if n is not None and n != product:
                raise MeshError(
                    f"mesh {mesh} has {' x '.join(map(str, mesh.values()))} = {product} ranks, "
                    f"but World was asked for {n}; make the axis sizes multiply to {n}"
                )
            n = product
        if not (isinstance(n, (int, np.integer)) and n >= 1):
            raise ArgumentError(f"World needs a positive number of ranks, got {n!r}")
        C.check_algorithm(algorithm, who="World: ")
        self.size = int(n)
        self.mesh = dict(mesh) if mesh else {}
        self.topology = topology or Topology()
        self.algorithm = algorithm
        self._reset()

    def __repr__(self):
        shape = f"mesh={self.mesh}" if self.mesh else f"n={self.size}"
        return f"World({shape}, gpus_per_node={self.topology.gpus_per_node}, algorithm={self.algorithm!r})"

    # ----------------------------------------------------------------- state of one run
    def _reset(self):
        n = self.size
        self._batches = []
        self._events = []
        self._clock = [0.0] * n  # compute stream
        self._comm_free = [0.0] * n  # communication stream
        self.memory = [MemoryLedger(r, self._clock_of(r)) for r in range(n)]
        self._pending = {}  # (group ranks, seq) -> _Rendezvous
        self._seq = {}  # (group ranks, global rank) -> next sequence number
        self._mail = {}  # (src, dst) -> list of (array, arrival time)
        self._taken = {}  # (src, dst) -> messages received so far
        self._waiting = {}  # global rank -> callable describing what it waits for
        self._ready = deque()
        self._finished = [False] * n
        self._failure = None
        self._trace_cache = None
        self._timing_cache = getattr(self, "_timing_cache", {})

    def _clock_of(self, r):
        return lambda: self._clock[r]

    # ----------------------------------------------------------------- running programs
    def run(self, fn, *args, **kwargs):
        """Call ``fn(comm, *args, **kwargs)`` once per rank; return the results by rank."""
        self._reset()
        main = greenlet.getcurrent()
        results = [None] * self.size

        def body(rank):
            try:
                results[rank] = fn(Comm(self, rank, tuple(range(self.size)), "world"), *args, **kwargs)
            except greenlet.GreenletExit:
                raise
            except EmulatorError as exc:
                self._failure = exc
            except BaseException as exc:  # noqa: BLE001 -- re-raised below with the rank
                self._failure = RankError(rank, exc, traceback.format_exc())
                self._failure.__cause__ = exc
            self._finished[rank] = True
            self._waiting.pop(rank, None)

        tasks = [greenlet.greenlet(lambda r=r: body(r), parent=main) for r in range(self.size)]
        self._main = main
        self._ready.extend(range(self.size))
        while self._ready and self._failure is None:
            tasks[self._ready.popleft()].switch()
        for t in tasks:  # stop whatever still waits, running its finally blocks
            if t and not t.dead:
                t.throw(greenlet.GreenletExit)
        if self._failure is not None:
            raise self._failure
        if not all(self._finished):
            raise DeadlockError(self._describe_deadlock())
        return results

    def _block(self, rank, why):
        """Switch away from ``rank`` until something calls ``_wake(rank)``. Callers loop
        on their condition, so a wake-up that finds it still false just blocks again.
        ``why`` is a callable describing the wait (only called to report a deadlock)."""
        self._waiting[rank] = why
        self._main.switch()

    def _wake(self, rank):
        if self._waiting.pop(rank, None) is not None:
            self._ready.append(rank)

    def _describe_deadlock(self):
        lines = ["deadlock: every rank that has not returned is blocked, and nothing can complete."]
        for r in range(self.size):
            if not self._finished[r]:
                why = self._waiting.get(r)
                lines.append(f"  rank {r} {why() if why else 'is blocked'}")
        done = [r for r in range(self.size) if self._finished[r]]
        lines.append(f"  returned already: {done if done else 'none'}")
        return "\n".join(lines)

    # ----------------------------------------------------------------- records
    @property
    def trace(self):
        """Every message of the last run (a list of :class:`TraceRecord`)."""
        if self._trace_cache is None or self._trace_cache[0] != len(self._batches):
            recs = [rec for b in self._batches for rec in b.records()]
            self._trace_cache = (len(self._batches), recs)
        return self._trace_cache[1]

    def stats(self):
        """Bytes sent and received per rank, totals by op, simulated time per rank."""
        return stats_from(self._batches, self.size, self._final_clocks())

    def _final_clocks(self):
        return [max(c, f) for c, f in zip(self._clock, self._comm_free)]

    def timeline(self):
        """Per-rank events (compute, comm, idle) on the simulated clocks."""
        end = max(self._final_clocks(), default=0.0)
        events = [Event(*e) for e in self._events]
        for r, c in enumerate(self._clock):
            if c < end:
                events.append(Event(r, "compute", "idle", "finished", c, end))
        return Timeline(events, self.size)

    def save_chrome_trace(self, path):
        return self.timeline().save_chrome_trace(path)

    def memory_report(self):
        """Per-rank current and peak bytes, in total and by kind."""
        rows = [led.summary() for led in self.memory]
        return Table(rows, byte_columns=[k for k in rows[0] if k != "rank"])

    # ----------------------------------------------------------------- time
    def _charge(self, steps, ranks, t0):
        """Simulated end of a collective that starts at ``t0``, and its trace arrays."""
        if not steps:
            return t0, None
        # a fixed pattern (a cached tuple of Messages) is timed once per group; the cache
        # keeps the tuple itself, so its id cannot be reused by another pattern
        key = (ranks, id(steps)) if isinstance(steps, tuple) else None
        hit = self._timing_cache.get(key) if key else None
        if hit is not None and hit[0] is steps:
            rel = hit[1]
        else:
            rel = self._step_times(steps, ranks)
            if key:
                self._timing_cache[key] = (steps, rel)
        step_idx, src, dst, nbytes, rel_start, rel_end, total = rel
        return t0 + total, (step_idx, src, dst, nbytes, t0 + rel_start, t0 + rel_end)

    def _step_times(self, steps, ranks):
        """Per-message (step, src, dst, bytes, start, end) relative to the collective's start.

        A step lasts as long as its slowest message; a rank that sends (or receives)
        several messages in one step sends them one after the other through its port."""
        g = np.asarray(ranks)
        n_steps, w = len(steps), len(ranks)
        lens = [len(m.src) for m in steps]
        step_idx = np.repeat(np.arange(n_steps), lens)
        local_src = np.concatenate([m.src for m in steps])
        local_dst = np.concatenate([m.dst for m in steps])
        src, dst = g[local_src], g[local_dst]
        nbytes = np.concatenate([m.nbytes for m in steps]).astype(np.int64)
        topo = self.topology
        inter = ((src // topo.gpus_per_node) != (dst // topo.gpus_per_node)).astype(np.int64)
        alpha = np.array([topo.intra.alpha, topo.inter.alpha])
        beta = np.array([topo.intra.beta, topo.inter.beta])
        size = n_steps * w * 2
        t_port = np.zeros(size)
        for local in (local_src, local_dst):
            port = (step_idx * w + local) * 2 + inter
            load = np.bincount(port, weights=nbytes, minlength=size)
            used = np.bincount(port, minlength=size) > 0
            t_port = np.maximum(t_port, np.where(used, np.tile(alpha, n_steps * w) + load / np.tile(beta, n_steps * w), 0.0))
        step_time = t_port.reshape(n_steps, w * 2).max(axis=1)
        ends = np.cumsum(step_time)
        starts = ends - step_time
        return step_idx, src, dst, nbytes, starts[step_idx], ends[step_idx], float(ends[-1])

    def _event(self, rank, stream, kind, name, start, end):
        if end > start:
            self._events.append((rank, stream, kind, name, start, end))
