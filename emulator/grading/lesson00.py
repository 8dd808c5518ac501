"""Checks for lesson 00 (collectives)."""

import numpy as np

from .. import World
from .. import collectives as C
from ..cost import collective_time, busbw, crossover_bytes
from ..network import Network
from ..topology import NVLINK_H100, Topology
from .common import CheckFailed, check_close, compare_arrays, expect, passed, run_on_emulator

SIZES = (1, 2, 3, 4, 8)


def _bufs(n, per_rank, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(per_rank) for _ in range(n)]


def _check_global(name, fn, inputs, want, steps, sent, exact=False):
    """Run ``fn(bufs, net)`` for every world size; compare each rank's result with
    ``want(bufs)[r]``, the steps with ``steps(n)`` and every rank's bytes with ``sent(n, bufs)``."""
    for n in SIZES:
        bufs = inputs(n)
        net = Network(n)
        out = fn([b.copy() for b in bufs], net)
        expect(isinstance(out, (list, tuple)) and len(out) == n, f"{name}, n={n}: return one array per rank")
        for r, (got, ref) in enumerate(zip(out, want(bufs))):
            compare_arrays(f"{name}, n={n}, rank {r}", got, ref, *((0, 0) if exact else ()))
        expect(net.steps == steps(n), f"{name}, n={n}: used {net.steps} communication steps, expected {steps(n)}")
        for r in range(n):
            expect(net.bytes_sent[r] == sent(n, bufs),
                   f"{name}, n={n}: rank {r} sent {net.bytes_sent[r]} bytes, expected {sent(n, bufs):.0f}")


def check_ring_reduce_scatter(fn):
    """fn(bufs, net) -> list of chunks: rank r gets chunk r summed over ranks, in n-1 steps."""
    _check_global("ring_reduce_scatter", fn, lambda n: _bufs(n, 3 * n, seed=n), C.reference_reduce_scatter,
                  lambda n: n - 1, lambda n, bufs: (n - 1) / n * bufs[0].nbytes)
    passed("Exercise 0.1", "ring reduce-scatter matches the reference for n = 1, 2, 3, 4, 8, "
           "in n-1 steps, each rank sending (n-1)/n of its buffer")


def check_ring_all_gather(fn):
    """fn(shards, net) -> list of arrays: every rank gets all shards in rank order, in n-1 steps."""
    _check_global("ring_all_gather", fn, lambda n: _bufs(n, 5, seed=10 + n), C.reference_all_gather,
                  lambda n: n - 1, lambda n, shards: (n - 1) * shards[0].nbytes, exact=True)
    passed("Exercise 0.2", "ring all-gather matches the reference for n = 1, 2, 3, 4, 8, "
           "in n-1 steps, each rank sending (n-1)/n of the result")


def check_ring_all_reduce(fn):
    """fn(bufs, net) -> list of arrays: every rank gets the sum, in 2(n-1) steps."""
    _check_global("ring_all_reduce", fn, lambda n: _bufs(n, 4 * n, seed=20 + n), C.reference_all_reduce,
                  lambda n: 2 * (n - 1), lambda n, bufs: 2 * (n - 1) / n * bufs[0].nbytes)
    passed("Exercise 0.3", "all-reduce = reduce-scatter + all-gather: 2(n-1) steps, "
           "2(n-1)/n of the buffer sent per rank")


def check_spmd_ring_all_reduce(fn):
    """fn(comm, x) -> the sum of x over ranks, from point-to-point calls only."""
    for n in SIZES:
        xs = _bufs(n, 6 * n, seed=30 + n)
        world = World(n)
        out = run_on_emulator(world, lambda comm: fn(comm, xs[comm.rank].copy()), f"n={n}")
        for r, got in enumerate(out):
            compare_arrays(f"spmd ring all-reduce, n={n}, rank {r}", got, np.sum(xs, axis=0))
        ops = set(world.stats().bytes_by_op)
        expect(ops <= {"send"}, f"n={n}: used {sorted(ops)}; build it from point-to-point calls only "
                                f"(batch_isend_irecv, or send and recv)")
        sends = [sum(1 for rec in world.trace if rec.src == r) for r in range(n)]
        expect(sends == [2 * (n - 1)] * n, f"n={n}: sends per rank {sends}, expected 2(n-1) = {2 * (n - 1)} each")
        want = 2 * (n - 1) / n * xs[0].nbytes
        expect(world.stats().bytes_sent == [want] * n,
               f"n={n}: bytes sent per rank {world.stats().bytes_sent}, expected {want:.0f} each")
    passed("Exercise 0.4", "SPMD ring all-reduce from point-to-point calls matches the sum for n = 1, 2, 3, 4, 8, "
           "with 2(n-1) sends of S/n bytes per rank")


def napkin_gradient_all_reduce(seconds, slow_link):
    """7.5B bf16 gradients, 64 GPUs in 8 nodes, one ring all-reduce."""
    topo = Topology(gpus_per_node=8)
    want = collective_time("all_reduce", 7.5e9 * 2, 64, topo, channels=1)
    if str(slow_link).lower() not in ("infiniband", "ib", "inter", "inter-node"):
        raise CheckFailed(f"Napkin 0.1: the link that sets the pace is not {slow_link!r}: "
                          f"which link does a ring of 64 GPUs in 8 nodes have to cross?")
    check_close("Napkin 0.1", seconds, want, unit=" s")


def napkin_bus_bandwidth(busbw_gbs):
    """nccl-tests: all_reduce of 1 GB (per rank) on 8 GPUs took 4.73 ms."""
    check_close("Napkin 0.2", busbw_gbs, busbw("all_reduce", 1e9, 8, 4.73e-3) / 1e9, unit=" GB/s")


def napkin_crossover(nbytes):
    """Below what size is a ring all-reduce on 8 NVLink GPUs mostly latency?"""
    check_close("Napkin 0.3", nbytes, crossover_bytes(8, NVLINK_H100), unit=" bytes")
