"""One rank's view of the machine: collectives, groups, compute and memory (point to point
is in :mod:`emulator.engine.p2p`).

A collective call joins its group's next rendezvous; the last member to arrive runs the
collective once in the global view (:mod:`emulator.algorithms.step_plans`), charges it on the simulated
clock (:mod:`emulator.engine.clock`), records its messages and wakes the others. See
:mod:`emulator.engine.world` for the scheduler.
"""

import numpy as np

from ..algorithms import all_to_all as A
from ..algorithms import step_plans as P
from ..records.calls import Call
from .charging import Declared, WorkMismatch
from .clock import collective_stream
from ..errors import CollectiveMismatchError, ConfigError, GroupError, PeerError, ShapeError
from .p2p import PointToPoint
from .rendezvous import Handle, Rendezvous
from ..arrays.shape_only import is_shape_only
from ..machine.precision import native
from ..machine.stack import Context
from ..machine.work import dtype_name
from ..machine.comm_overlap import ring_exchange


def _array(x):
    """``x`` as an array: itself if it is one (a shape-only array included)."""
    return x if isinstance(x, np.ndarray) or is_shape_only(x) else np.asarray(x)


def _signature(name, x, **extra):
    a = _array(x)
    return (name, a.shape, a.dtype, tuple(extra.items()))


def _nbytes(x):
    return _array(x).nbytes


def _ring_run(kind, op, alg, c, rings, plan):
    """What runs when the last member arrives: the plan on the data, or, for shape-only
    buffers, its shapes and messages."""
    def run(bufs):
        if is_shape_only(bufs[0]):
            return P.shape_only_run(kind, (bufs[0].shape, bufs[0].dtype), len(bufs), op, alg, c, rings)
        return P.run_plan(plan(bufs))
    return run


def _format_signature(sig):
    if isinstance(sig, str):
        return sig
    name, shape, dtype, extra = sig
    parts = [f"shape={shape}", f"dtype={dtype}"] + [f"{k}={v!r}" for k, v in extra]
    return f"{name}({', '.join(parts)})"


class Comm(PointToPoint):
    """One rank's handle on a group of ranks (the whole world, or mesh axes).

    ``rank`` and ``size`` are within the group; ``global_rank`` is the rank in the world;
    ``label`` names the group (``"world"``, a mesh axis such as ``"tp"``, or the ranks of
    an ad-hoc group). Collectives return new arrays and never modify their input.
    """

    def __init__(self, world, global_rank, ranks, label):
        self._world = world
        self.global_rank = global_rank
        self.ranks = ranks
        self.label = label
        self.member = global_rank in ranks
        self.rank = ranks.index(global_rank) if self.member else -1
        self.size = len(ranks)

    def __repr__(self):
        return f"Comm(group={self.label!r}, rank={self.rank}, size={self.size}, global_rank={self.global_rank})"

    # ----------------------------------------------------------------- mesh and groups
    @property
    def memory(self):
        """This rank's :class:`~emulator.records.memory.MemoryLedger`."""
        return self._world.memory[self.global_rank]

    @property
    def now(self):
        """This rank's simulated clock (seconds)."""
        return self._world.clock.compute[self.global_rank]

    @property
    def mesh(self):
        """The world's :class:`~emulator.mesh.Mesh` (None for a plain ``World(n)``)."""
        return self._world.mesh

    def _mesh(self):
        if self._world.mesh is None:
            raise GroupError(f"rank {self.global_rank}: this World has no mesh axes; "
                             f"create it as World(mesh={{'dp': 2, 'tp': 4}}) to use groups")
        return self._world.mesh

    def coord(self, axis):
        """This rank's index along mesh axis ``axis``."""
        return self._mesh().coord(self.global_rank, axis)

    def coords(self):
        return self._mesh().coords(self.global_rank)

    def group(self, *axes):
        """A comm over the ranks that differ from this one only along ``axes``."""
        if not axes:
            raise GroupError(f"rank {self.global_rank}: group() needs at least one axis name")
        try:
            ranks = self._mesh().group_ranks(axes, self.global_rank)
        except GroupError as exc:
            raise GroupError(f"rank {self.global_rank}: {exc}") from None
        return Comm(self._world, self.global_rank, ranks, ",".join(axes))

    def new_group(self, ranks, label=None):
        """A comm over the given global ranks (like ``torch.distributed.new_group``);
        ``label`` names it in the trace (default: its ranks)."""
        ranks = tuple(int(r) for r in ranks)
        bad = [r for r in ranks if not 0 <= r < self._world.size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise GroupError(f"rank {self.global_rank}: new_group({list(ranks)}) needs distinct ranks "
                             f"in 0..{self._world.size - 1}")
        return Comm(self._world, self.global_rank, ranks, label or str(sorted(ranks)))

    # ----------------------------------------------------------------- compute
    def compute(self, flops=None, seconds=None, name="compute", kernel=None, kernels=None):
        """Advance this rank's compute clock: by ``flops`` at the device's peak, by
        ``seconds``, or by the time the topology's device takes for a ``kernel`` (or a list
        of ``kernels``; see :mod:`emulator.machine.kernels`)."""
        if kernel is not None:
            kernels = [kernel]
        if sum(v is not None for v in (flops, seconds, kernels)) != 1:
            raise ConfigError(f"rank {self.global_rank}: compute() takes flops=, seconds= or kernel(s)=, exactly one")
        if kernels is not None:
            device = self._world.topology.device
            dur = sum(device.time(k) for k in kernels)
        else:
            dur = seconds if seconds is not None else flops / self._world.topology.flops
        if not dur >= 0:
            raise ConfigError(f"rank {self.global_rank}: compute() got a negative duration ({dur})")
        dur *= self._world.faults.slowdown[self.global_rank]  # a straggler (emulator.engine.faults)
        self._world.clock.advance(self.global_rank, dur, name)

    # ----------------------------------------------------------------- declared work
    @property
    def stack(self):
        """The software stack this run's declared work is charged as (:mod:`emulator.machine.stack`)."""
        return self._world.stack

    @property
    def precision(self):
        """The run's precision policy (None: every number as the arrays hold it)."""
        return self._world.precision

    def work_context(self, array_dtype):
        """The :class:`~emulator.machine.stack.Context` of a module whose arrays are ``array_dtype``."""
        policy = self._world.precision or native(array_dtype)
        return Context(self._world.stack, policy, dtype_name(array_dtype))

    def declared(self, build, what):
        """``with comm.declared(lambda: work.forward, "block forward"):`` opens a declared pass
        (:mod:`emulator.engine.charging`) unless one is open on this rank already."""
        return Declared(self, build, what)

    def charge(self, name, optional=False):
        """Advance this rank's clock by the declared kernels called ``name`` of the open pass
        (``optional``: nothing if the declaration has none of that name)."""
        open_ = self._world._charges[self.global_rank]
        if not open_:
            raise WorkMismatch(f"rank {self.global_rank}: charge({name!r}) outside a declared pass")
        charges = open_[-1]
        kernels = charges.take(name, optional)
        if not kernels:
            return
        w = self._world
        w.kinds.setdefault(name, kernels[0].kind)
        device, stack = w.topology.device, w.stack
        slow = w.faults.slowdown[self.global_rank] * charges.slowdown_of(kernels, device.sms)
        times = [(device.time(k) + (stack.launch if k.kind == "memory" else 0.0)) * slow for k in kernels]
        ring = charges.ring
        if ring is not None and kernels[0].kind == "gemm":  # its rows arrive from a ring exchange meanwhile
            charges.ring = None
            self._ring_exchange(ring, sum(times), name, stack.dispatch)
            return
        me = self.global_rank
        start = max(w.clock.compute[me], w.clock.host[me] + stack.dispatch)
        w.clock.kernels(me, times, name, stack.dispatch)
        charges.last_kernel = (start, w.clock.compute[me], sum(times))

    def _ring_exchange(self, ring, gemm, name, dispatch):
        """A GEMM cut into tp chunks, each started once its rows have arrived (TE's ring
        exchange; :func:`emulator.machine.comm_overlap.ring_exchange`)."""
        handle, n = ring
        start, end, _ = handle.span()
        clock, me = self._world.clock, self.global_rank
        clock.host[me] += dispatch
        t0 = max(clock.compute[me], clock.host[me])
        arrivals = [max(0.0, start + (end - start) * k / (n - 1) - t0) for k in range(n)]
        done = t0 + ring_exchange(gemm, end - start, n, arrivals)
        if t0 > clock.compute[me]:
            clock.join(me, t0, "the host")
        clock.advance(me, done - t0, name)

    def replace_declared(self, name, kernels):
        """Swap the open pass's declared ``name`` kernels for ``kernels`` (known only as it runs)."""
        open_ = self._world._charges[self.global_rank]
        if open_:
            open_[-1].replace(name, kernels)

    def sync_host(self):
        """The host waits for this rank's GPU (it reads a value back)."""
        self._world.clock.sync_host(self.global_rank)

    def storage(self, seconds, name="storage", background=False):
        """Time on storage (a checkpoint's write or read): on the compute stream, which
        waits; or, ``background=True``, on this rank's ``storage`` stream while compute
        goes on (an asynchronous save's writer), after what that stream holds. Returns
        when it ends."""
        if not seconds >= 0:
            raise ConfigError(f"rank {self.global_rank}: storage() got a negative duration ({seconds})")
        if background:
            return self._world.clock.background(self.global_rank, "storage", seconds, name)
        clock = self._world.clock  # a synchronous write holds the host too: it waits for the GPU, then writes
        clock.sync_host(self.global_rank)
        clock.advance(self.global_rank, seconds, name)
        clock.sync_host(self.global_rank)
        return self.now

    def wait_storage(self, what="storage"):
        """Wait until this rank's ``storage`` stream is done (before reusing what it writes)."""
        clock = self._world.clock
        clock.join(self.global_rank, clock.free(self.global_rank, "storage"), what)

    # ----------------------------------------------------------------- collectives
    def _check_member(self, op):
        if not self.member:
            raise GroupError(f"rank {self.global_rank} called {op} on group {self.label} "
                             f"(ranks {list(self.ranks)}), which it is not in")

    def _collective(self, op, sig, payload, nbytes, run, async_op):
        """Join the group's next collective; the last member to arrive runs it."""
        if not self.member:
            self._check_member(op)
        w, me, key = self._world, self.global_rank, self.ranks
        w.clock.check_alive(me)
        w.calls[me].append(Call(op, self.label, nbytes))
        seq = w._seq.get((key, me), 0)
        w._seq[(key, me)] = seq + 1
        rv = w._pending.get((key, seq))
        if rv is None:
            rv = w._pending[(key, seq)] = Rendezvous(op, sig, me, key, self.label, seq)
        elif rv.sig != sig:
            raise CollectiveMismatchError(
                f"ranks {rv.first} and {me} of group {self.label} (ranks {list(key)}) disagree at "
                f"their collective #{seq} on that group:\n  rank {rv.first} called {_format_signature(rv.sig)}\n"
                f"  rank {me} called {_format_signature(sig)}\n"
                f"every rank of a group must make the same calls in the same order")
        rv.inputs[self.rank] = payload
        rv.ready[me] = w.clock.compute[me]
        if w._charges[me]:  # inside a declared pass the host issues it: not before the host gets there
            rv.ready[me] = max(rv.ready[me], w.clock.issue(me, w.stack.dispatch))
            early = w._charges[me][-1].ready_at
            if early is not None:  # pipelined behind a GEMM still running (comm_overlap): from its first chunk
                rv.ready[me], w._charges[me][-1].ready_at = early, None
        if len(rv.inputs) == self._live_count():
            del w._pending[(key, seq)]
            if len(rv.inputs) < self.size:  # the others are folded into this rank: as they would arrive
                w._deferred[me].append((self, rv, run))
            else:
                self._complete(rv, run)
        handle = Handle(w, me, rv)
        return handle if async_op else handle.wait()

    def _live_count(self):
        w = self._world
        if w.representative is None:
            return self.size
        n = w._live_counts.get(self.ranks)
        if n is None:
            n = w._live_counts[self.ranks] = len(w.live_members(self.ranks))
        return n

    def _complete(self, rv, run):
        w = self._world
        inputs = rv.inputs
        if len(inputs) < self.size:  # folded members: each as the live rank that stands for it
            inputs = {i: inputs[i] if i in inputs else inputs[w.stand_in(self.ranks, i)] for i in range(self.size)}
        results, steps = run([inputs[i] for i in range(self.size)])
        stream = collective_stream(self.label)
        t0 = max(max(rv.ready[r], w.clock.free(r, stream)) for r in rv.ready)
        if w.faults.interrupted(w.clock, self.ranks, steps, t0):  # a member dies before it ends: never completes
            rv.inputs = None
            w._broken.append(rv)
            return
        rv.start, rv.end = w.clock.charge(rv.op, self.label, steps, self.ranks, t0, [stream] * self.size,
                                          [rv.op] * self.size)
        rv.results, rv.done, rv.inputs = results, True, None
        for r in rv.ready:
            if r != self.global_rank:
                w._wake(r)

    def _algorithm(self, algorithm):
        if algorithm is None:
            return self._world.algorithm  # checked when the World was made
        P.check_algorithm(algorithm, who=f"rank {self.global_rank}: ")
        return algorithm

    def _channels(self, channels):
        if channels is None:
            return self._world.topology.channels
        if not (isinstance(channels, (int, np.integer)) and channels >= 1):
            raise ConfigError(f"rank {self.global_rank}: channels must be a positive int, got {channels!r}")
        return int(channels)

    def _check_op(self, op, x):
        if op != "sum":  # sum works on every dtype
            P.check_op(op, _array(x).dtype,
                       who=f"rank {self.global_rank}: ")

    def _rings_for(self):
        topo, ranks = self._world.topology, self.ranks
        return lambda c: topo.rings(ranks, c)

    def all_reduce(self, x, op="sum", async_op=False, algorithm=None, channels=None):
        """Every rank gets op(x of every rank), elementwise; same shape as x. ``op`` as
        torch's ReduceOp: sum, avg, max, min, product."""
        self._check_op(op, x)
        alg, c = self._algorithm(algorithm), self._channels(channels)
        sig = _signature("all_reduce", x, op=op, algorithm=alg, channels=c)
        rings = self._rings_for()
        return self._collective("all_reduce", sig, x, _nbytes(x), _ring_run(
            "all_reduce", op, alg, c, rings, lambda b: P.plan_all_reduce(b, op, alg, c, rings)), async_op)

    def reduce_scatter(self, x, op="sum", async_op=False, algorithm=None, channels=None):
        """x is split along dim 0 into ``size`` equal chunks; rank r gets op over ranks of chunk r."""
        self._check_op(op, x)
        alg, c = self._algorithm(algorithm), self._channels(channels)
        a = _array(x)
        if a.ndim == 0 or a.shape[0] % self.size:
            raise ShapeError(f"rank {self.global_rank}: reduce_scatter on group {self.label} needs dim 0 divisible "
                             f"by the group size {self.size}, got shape {a.shape}; pad dim 0 to a multiple of "
                             f"{self.size}")
        sig = _signature("reduce_scatter", x, op=op, algorithm=alg, channels=c)
        rings = self._rings_for()
        return self._collective("reduce_scatter", sig, x, a.nbytes, _ring_run(
            "reduce_scatter", op, alg, c, rings, lambda b: P.plan_reduce_scatter(b, op, alg, c, rings)), async_op)

    def all_gather(self, x, async_op=False, algorithm=None, channels=None):
        """Every rank gets the concatenation along dim 0 of x from every rank, in rank order."""
        alg, c = self._algorithm(algorithm), self._channels(channels)
        if _array(x).ndim == 0:
            raise ShapeError(f"rank {self.global_rank}: all_gather needs at least one dim, got a 0-d array")
        sig = _signature("all_gather", x, algorithm=alg, channels=c)
        rings = self._rings_for()
        return self._collective("all_gather", sig, x, _nbytes(x), _ring_run(
            "all_gather", "sum", alg, c, rings, lambda b: P.plan_all_gather(b, alg, c, rings)), async_op)

    def broadcast(self, x, src=0, async_op=False, algorithm="tree"):
        """Every rank gets a copy of group rank ``src``'s x (every rank passes an x of that shape)."""
        if not (isinstance(src, (int, np.integer)) and 0 <= src < self.size):
            raise PeerError(f"rank {self.global_rank}: broadcast src={src!r} is not a rank of group "
                            f"{self.label} (0..{self.size - 1})")
        if algorithm not in ("tree", "naive"):
            raise ConfigError(f"rank {self.global_rank}: broadcast algorithm must be 'tree' or 'naive'")
        sig = _signature("broadcast", x, src=int(src), algorithm=algorithm)
        return self._collective("broadcast", sig, x, np.asarray(x).nbytes,
                                lambda b: P.run_plan(P.plan_broadcast(b, int(src), algorithm)), async_op)

    def all_to_all(self, chunks, async_op=False):
        """``chunks[i]`` goes to rank i; returns the list received, entry i from rank i."""
        if len(chunks) != self.size:
            raise ShapeError(f"rank {self.global_rank}: all_to_all got {len(chunks)} chunks; "
                             f"pass exactly one per rank of group {self.label} ({self.size})")
        dtypes = {_array(c).dtype for c in chunks}
        if len(dtypes) > 1:
            raise ShapeError(f"rank {self.global_rank}: all_to_all chunks mix dtypes {sorted(map(str, dtypes))}")
        sig = f"all_to_all(n_chunks={len(chunks)}, dtype={dtypes.pop()})"
        nbytes = sum(_nbytes(c) for c in chunks)
        return self._collective("all_to_all", sig, list(chunks), nbytes, A.all_to_all_grouped, async_op)

    def all_to_all_single(self, x, output_split_sizes=None, input_split_sizes=None, async_op=False):
        """Split ``x`` along dim 0 by ``input_split_sizes`` (None: equal parts), send part i
        to rank i, and return what every rank sent here, concatenated in rank order along
        dim 0 (``output_split_sizes[i]`` rows from rank i; None: whatever they send)."""
        x = _array(x)
        in_sizes = A.split_sizes(x, self.size, input_split_sizes, "input_split_sizes", self.global_rank)
        out_sizes = None if output_split_sizes is None else \
            A.split_sizes(x, self.size, output_split_sizes, "output_split_sizes", self.global_rank)
        sig = ("all_to_all_single", ("*",) + x.shape[1:], x.dtype, ())
        ranks, label = self.ranks, self.label
        return self._collective("all_to_all_single", sig, (x, out_sizes, in_sizes), x.nbytes,
                                lambda inputs: A.all_to_all_single(inputs, ranks, label), async_op)

    def barrier(self, async_op=False):
        """Wait until every rank of the group arrives (a zero-byte tree all-reduce)."""
        empty = np.zeros(0, dtype=np.int8)
        out = self._collective("barrier", "barrier()", empty, 0,
                               lambda b: P.run_plan(P.plan_all_reduce(b, "sum", "tree")), async_op)
        return out if async_op else None
