"""The collectives of a rank's :class:`~emulator.engine.comm.Comm`, named and checked as
torch spells them: ``all_reduce``, ``reduce_scatter``, ``all_gather``, ``broadcast``,
``all_to_all``, ``all_to_all_single``, ``barrier``. Each checks its arguments, builds the
signature every member must agree on and the run its last member starts (the plan of
:mod:`emulator.algorithms.step_plans` on the data, or its shapes for shape-only buffers),
then joins the group's next rendezvous (``Comm._collective``).
"""

import numpy as np

from ..algorithms import all_to_all as A
from ..algorithms import step_plans as P
from ..arrays.shape_only import is_shape_only
from ..errors import ConfigError, PeerError, ShapeError


def as_array(x):
    """``x`` as an array: itself if it is one (a shape-only array included)."""
    return x if isinstance(x, np.ndarray) or is_shape_only(x) else np.asarray(x)


def signature(name, x, **extra):
    a = as_array(x)
    return (name, a.shape, a.dtype, tuple(extra.items()))


def nbytes_of(x):
    return as_array(x).nbytes


def ring_run(kind, op, alg, c, rings, plan):
    """What runs when the last member arrives: the plan on the data, or, for shape-only
    buffers, its shapes and messages."""
    def run(bufs):
        if is_shape_only(bufs[0]):
            return P.shape_only_run(kind, (bufs[0].shape, bufs[0].dtype), len(bufs), op, alg, c, rings)
        return P.run_plan(plan(bufs))
    return run


def format_signature(sig):
    if isinstance(sig, str):
        return sig
    name, shape, dtype, extra = sig
    parts = [f"shape={shape}", f"dtype={dtype}"] + [f"{k}={v!r}" for k, v in extra]
    return f"{name}({', '.join(parts)})"


class Collectives:
    """The collective half of :class:`~emulator.engine.comm.Comm`."""

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
            P.check_op(op, as_array(x).dtype,
                       who=f"rank {self.global_rank}: ")

    def _rings_for(self):
        topo, ranks = self._world.topology, self.ranks
        return lambda c: topo.rings(ranks, c)

    def all_reduce(self, x, op="sum", async_op=False, algorithm=None, channels=None):
        """Every rank gets op(x of every rank), elementwise; same shape as x. ``op`` as
        torch's ReduceOp: sum, avg, max, min, product."""
        self._check_op(op, x)
        alg, c = self._algorithm(algorithm), self._channels(channels)
        sig = signature("all_reduce", x, op=op, algorithm=alg, channels=c)
        rings = self._rings_for()
        return self._collective("all_reduce", sig, x, nbytes_of(x), ring_run(
            "all_reduce", op, alg, c, rings, lambda b: P.plan_all_reduce(b, op, alg, c, rings)), async_op)

    def reduce_scatter(self, x, op="sum", async_op=False, algorithm=None, channels=None):
        """x is split along dim 0 into ``size`` equal chunks; rank r gets op over ranks of chunk r."""
        self._check_op(op, x)
        alg, c = self._algorithm(algorithm), self._channels(channels)
        a = as_array(x)
        if a.ndim == 0 or a.shape[0] % self.size:
            raise ShapeError(f"rank {self.global_rank}: reduce_scatter on group {self.label} needs dim 0 divisible "
                             f"by the group size {self.size}, got shape {a.shape}; pad dim 0 to a multiple of "
                             f"{self.size}")
        sig = signature("reduce_scatter", x, op=op, algorithm=alg, channels=c)
        rings = self._rings_for()
        return self._collective("reduce_scatter", sig, x, a.nbytes, ring_run(
            "reduce_scatter", op, alg, c, rings, lambda b: P.plan_reduce_scatter(b, op, alg, c, rings)), async_op)

    def all_gather(self, x, async_op=False, algorithm=None, channels=None):
        """Every rank gets the concatenation along dim 0 of x from every rank, in rank order."""
        alg, c = self._algorithm(algorithm), self._channels(channels)
        if as_array(x).ndim == 0:
            raise ShapeError(f"rank {self.global_rank}: all_gather needs at least one dim, got a 0-d array")
        sig = signature("all_gather", x, algorithm=alg, channels=c)
        rings = self._rings_for()
        return self._collective("all_gather", sig, x, nbytes_of(x), ring_run(
            "all_gather", "sum", alg, c, rings, lambda b: P.plan_all_gather(b, alg, c, rings)), async_op)

    def broadcast(self, x, src=0, async_op=False, algorithm="tree"):
        """Every rank gets a copy of group rank ``src``'s x (every rank passes an x of that shape)."""
        if not (isinstance(src, (int, np.integer)) and 0 <= src < self.size):
            raise PeerError(f"rank {self.global_rank}: broadcast src={src!r} is not a rank of group "
                            f"{self.label} (0..{self.size - 1})")
        if algorithm not in ("tree", "naive"):
            raise ConfigError(f"rank {self.global_rank}: broadcast algorithm must be 'tree' or 'naive'")
        sig = signature("broadcast", x, src=int(src), algorithm=algorithm)
        return self._collective("broadcast", sig, x, np.asarray(x).nbytes,
                                lambda b: P.run_plan(P.plan_broadcast(b, int(src), algorithm)), async_op)

    def all_to_all(self, chunks, async_op=False):
        """``chunks[i]`` goes to rank i; returns the list received, entry i from rank i."""
        if len(chunks) != self.size:
            raise ShapeError(f"rank {self.global_rank}: all_to_all got {len(chunks)} chunks; "
                             f"pass exactly one per rank of group {self.label} ({self.size})")
        dtypes = {as_array(c).dtype for c in chunks}
        if len(dtypes) > 1:
            raise ShapeError(f"rank {self.global_rank}: all_to_all chunks mix dtypes {sorted(map(str, dtypes))}")
        sig = f"all_to_all(n_chunks={len(chunks)}, dtype={dtypes.pop()})"
        nbytes = sum(nbytes_of(c) for c in chunks)
        return self._collective("all_to_all", sig, list(chunks), nbytes, A.all_to_all_grouped, async_op)

    def all_to_all_single(self, x, output_split_sizes=None, input_split_sizes=None, async_op=False):
        """Split ``x`` along dim 0 by ``input_split_sizes`` (None: equal parts), send part i
        to rank i, and return what every rank sent here, concatenated in rank order along
        dim 0 (``output_split_sizes[i]`` rows from rank i; None: whatever they send)."""
        x = as_array(x)
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
