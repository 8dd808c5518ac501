"""Checks for lesson 00 (collectives).

Each check runs the student's code on several world sizes against the NumPy reference,
and looks at how the answer was reached: the number of steps and bytes, that a ring only
talks to its right neighbour, and that the result comes from what the messages delivered
(a message changed in flight must change the result). Napkin answers are functions of the
problem's numbers, called with other numbers too. While the student's code runs, the
library's own solution refuses to run.
"""

import numpy as np

from ..engine.world import World
from ..algorithms import global_view as C
from .. import cost
from ..algorithms import p2p_ring
from ..algorithms import step_plans as plans
from ..accounting.all_reduce_time import all_reduce_busbw_gb, gradient_all_reduce_seconds, latency_crossover_bytes
from ..algorithms.hand_traced import Network
from .common import CheckFailed, check_close, compare_arrays, expect, passed, run_on_emulator
from .refuse import refusing

SIZES = (1, 2, 3, 4, 8)
COST = (cost.collective_time, cost.ring_time, cost.tree_time, cost.busbw, cost.algbw, cost.crossover_bytes,
        cost.crossover_ring_tree, cost.calibration_table)


def _bufs(n, per_rank, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(per_rank) for _ in range(n)]


def _run(name, fn, bufs, net, library):
    with refusing(name, *library):
        out = fn([b.copy() for b in bufs], net)
    n = len(bufs)
    expect(isinstance(out, (list, tuple)) and len(out) == n, f"{name}, n={n}: return one array per rank")
    return [np.asarray(o) for o in out]


def _check_global(name, fn, inputs, want, steps, sent, library, exact=False):
    """Run ``fn(bufs, net)`` for every world size; compare each rank's result with
    ``want(bufs)[r]``, the steps with ``steps(n)``, every rank's bytes with ``sent(n, bufs)``;
    every message goes to the right neighbour; tampering with any step's message changes
    the result."""
    for n in SIZES:
        bufs = inputs(n)
        net = Network(n)
        out = _run(name, fn, bufs, net, library)
        for r, (got, ref) in enumerate(zip(out, want(bufs))):
            compare_arrays(f"{name}, n={n}, rank {r}", got, ref, *((0, 0) if exact else ()))
        expect(net.steps == steps(n), f"{name}, n={n}: used {net.steps} communication steps, expected {steps(n)}")
        for _, src, dst, _ in net.messages:
            expect(dst == (src + 1) % n, f"{name}, n={n}: rank {src} sent to rank {dst}; a ring only talks to its "
                                         f"right neighbour (rank r sends to r+1, and n-1 to 0)")
        for r in range(n):
            expect(net.bytes_sent[r] == sent(n, bufs),
                   f"{name}, n={n}: rank {r} sent {net.bytes_sent[r]} bytes, expected {sent(n, bufs):.0f}")
        for step in range(steps(n)):
            tampered = Network(n, tamper=(step, step % n))
            again = _run(name, fn, bufs, tampered, library)
            expect(tampered.tampered and any(not np.array_equal(a, b) for a, b in zip(again, out)),
                   f"{name}, n={n}: a message of step {step + 1} was changed in flight and your result did not "
                   f"change; compute the result from what net.exchange delivers, not from the inputs")


def check_ring_reduce_scatter(fn):
    """fn(bufs, net) -> list of chunks: rank r gets chunk r summed over ranks, in n-1 steps."""
    _check_global("Exercise 0.1", fn, lambda n: _bufs(n, 3 * n, seed=n), C.reference_reduce_scatter,
                  lambda n: n - 1, lambda n, bufs: (n - 1) / n * bufs[0].nbytes,
                  (C.ring_reduce_scatter, C.reference_reduce_scatter, plans.plan_reduce_scatter))
    passed("Exercise 0.1", "ring reduce-scatter matches the reference for n = 1, 2, 3, 4, 8, in n-1 steps to "
           "the right neighbour, each rank sending (n-1)/n of its buffer, from the data delivered")


def check_ring_all_gather(fn):
    """fn(shards, net) -> list of arrays: every rank gets all shards in rank order, in n-1 steps."""
    _check_global("Exercise 0.2", fn, lambda n: _bufs(n, 5, seed=10 + n), C.reference_all_gather,
                  lambda n: n - 1, lambda n, shards: (n - 1) * shards[0].nbytes,
                  (C.ring_all_gather, C.reference_all_gather, plans.plan_all_gather), exact=True)
    passed("Exercise 0.2", "ring all-gather matches the reference for n = 1, 2, 3, 4, 8, in n-1 steps to the "
           "right neighbour, each rank sending (n-1)/n of the result, from the data delivered")


def check_ring_all_reduce(fn):
    """fn(bufs, net) -> list of arrays: every rank gets the sum, in 2(n-1) steps."""
    _check_global("Exercise 0.3", fn, lambda n: _bufs(n, 4 * n, seed=20 + n), C.reference_all_reduce,
                  lambda n: 2 * (n - 1), lambda n, bufs: 2 * (n - 1) / n * bufs[0].nbytes,
                  (C.ring_all_reduce, C.reference_all_reduce, plans.plan_all_reduce))
    passed("Exercise 0.3", "all-reduce = reduce-scatter + all-gather: 2(n-1) steps, "
           "2(n-1)/n of the buffer sent per rank")


def check_spmd_ring_all_reduce(fn):
    """fn(comm, x) -> the sum of x over ranks, from point-to-point calls only, right neighbour only."""
    for n in SIZES:
        xs = _bufs(n, 6 * n, seed=30 + n)
        world = World(n)
        with refusing("Exercise 0.4", p2p_ring.ring_all_reduce_p2p, p2p_ring.exchange):
            out = run_on_emulator(world, lambda comm: fn(comm, xs[comm.rank].copy()), f"Exercise 0.4, n={n}")
        for r, got in enumerate(out):
            compare_arrays(f"spmd ring all-reduce, n={n}, rank {r}", got, np.sum(xs, axis=0))
        ops = set(world.stats().bytes_by_op)
        expect(ops <= {"send"}, f"n={n}: used {sorted(ops)}; build it from point-to-point calls only "
                                f"(batch_isend_irecv, or send and recv)")
        for rec in world.trace:
            expect(rec.dst == (rec.src + 1) % n, f"n={n}: rank {rec.src} sent to rank {rec.dst}; a ring only "
                                                 f"talks to its right neighbour (r to r+1)")
        sends = [sum(1 for rec in world.trace if rec.src == r) for r in range(n)]
        expect(sends == [2 * (n - 1)] * n, f"n={n}: sends per rank {sends}, expected 2(n-1) = {2 * (n - 1)} each")
        want = 2 * (n - 1) / n * xs[0].nbytes
        expect(world.stats().bytes_sent == [want] * n,
               f"n={n}: bytes sent per rank {world.stats().bytes_sent}, expected {want:.0f} each")
    passed("Exercise 0.4", "SPMD ring all-reduce from point-to-point calls matches the sum for n = 1, 2, 3, 4, 8, "
           "with 2(n-1) sends of S/n bytes per rank, each to the right neighbour")


def _variants(name, fn, cases, model, unit):
    """Call ``fn(**case)`` for every case (the first: the problem's own numbers, also as
    the defaults ``fn()``) and compare with ``model(**case)``."""
    got = _call(name, fn)
    want = model(**cases[0])
    check_close(name, got, want, unit=unit, quiet=True)
    for case in cases[1:]:
        got = _call(name, fn, **case)
        args = ", ".join(f"{k}={v:g}" for k, v in case.items())
        check_close(f"{name} with {args}", got, model(**case), unit=unit, quiet=True)
    return want


def _call(name, fn, **case):
    with refusing(name, *COST):
        return fn(**case)


def napkin_gradient_all_reduce(fn):
    """fn(n_params, n_gpus, gpus_per_node) -> (seconds with one flat ring, seconds with a
    channel per NIC, the link that sets the pace) for an all-reduce of bf16 gradients."""
    cases = [dict(n_params=7.5e9, n_gpus=64, gpus_per_node=8), dict(n_params=1.3e9, n_gpus=16, gpus_per_node=8),
             dict(n_params=70e9, n_gpus=128, gpus_per_node=8), dict(n_params=7.5e9, n_gpus=32, gpus_per_node=4)]
    outs = [_call("Napkin 0.1", fn, **c) for c in cases]
    for c, out in zip(cases, outs):
        expect(isinstance(out, tuple) and len(out) == 3, "Napkin 0.1: return (flat seconds, channels seconds, link)")
        flat, chans, link = out
        if str(link).lower() not in ("infiniband", "ib", "nic", "inter", "inter-node"):
            raise CheckFailed(f"Napkin 0.1: the link that sets the pace is not {link!r}: which link does a ring "
                              f"over several nodes have to cross at every step?")
        args = ", ".join(f"{k}={v:g}" for k, v in c.items())
        wants = gradient_all_reduce_seconds(**c)
        for what, got, want in zip(("one flat ring", "a channel per NIC"), (flat, chans), wants):
            check_close(f"Napkin 0.1 ({what}, {args})", got, want, unit=" s", quiet=True)
    flat, chans, _ = outs[0]
    passed("Napkin 0.1", f"{flat:.4g} s through one NIC per node, {chans:.4g} s with a channel per NIC "
           f"({flat / chans:.1f}x faster), right for 4 configurations")


def napkin_bus_bandwidth(fn):
    """fn(n, nbytes, seconds) -> busbw in GB/s of an all_reduce nccl-tests timed."""
    cases = [dict(n=8, nbytes=1e9, seconds=4.73e-3), dict(n=16, nbytes=2e9, seconds=9.8e-3),
             dict(n=4, nbytes=256e6, seconds=1.1e-3)]
    want = _variants("Napkin 0.2", fn, cases, all_reduce_busbw_gb, " GB/s")
    passed("Napkin 0.2", f"{want:.4g} GB/s, right for 3 measurements")


def napkin_crossover(fn):
    """fn(n, alpha, beta) -> bytes per rank where a one-node ring all-reduce spends as long
    on latency as on bandwidth."""
    cases = [dict(n=8, alpha=2e-6, beta=370e9), dict(n=4, alpha=3e-6, beta=150e9), dict(n=16, alpha=5e-6, beta=48e9)]
    want = _variants("Napkin 0.3", fn, cases, latency_crossover_bytes, " bytes")
    passed("Napkin 0.3", f"{want:.4g} bytes, right for 3 links")
