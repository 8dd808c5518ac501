"""Checks for lesson 01 (data parallelism and ZeRO).

The student writes strategies for :func:`emulator.training.train` (a subclass of
:class:`emulator.parallel.data_parallel.strategy.DataParallelStrategy`). Each check trains a small GPT with
the student's strategy on 1 to 4 emulated GPUs and compares with one device training on the
whole batch, then reads the trace (which collectives, on which group, how many bytes, in
what order, overlapped or not) and the ledger (what is held, and that a layer computes
only with parameters that are held). While it runs, the library's own strategies refuse.
"""

import numpy as np

from .. import nn
from ..machine.topology import Topology
from ..engine.world import World
from ..accounting import memory as accounting_memory
from ..parallel import DDP, ZeRO1, ZeRO2, ZeRO3, assemble
from ..parallel.data_parallel.ladder import data_parallel as library_data_parallel
from ..parallel.data_parallel.strategy import DataParallelStrategy
from ..parallel.data_parallel.flat_layout import layouts
from ..training import synthetic_batches, train, train_single
from ..widgets import zero_explorer
from .common import CheckFailed, check_close, expect, passed, run_on_emulator
from .refuse import refusing

LIBRARY = (DDP, ZeRO1, ZeRO2, ZeRO3, library_data_parallel, DataParallelStrategy.reduce_scatter_grads)
BATCHES = synthetic_batches(2, 12, 8, 12, seed=5)


def _model():
    return nn.GPT(vocab=12, d_model=16, n_heads=2, d_ff=24, n_layers=2, max_seq=8, dtype=np.float64)


class _RecordingAdamW(nn.AdamW):
    """AdamW that remembers the gradients it was given (to check a slice's mean gradient)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen = []

    def step(self, params, grads, state):
        self.seen.append({k: np.array(v, copy=True) for k, v in grads.items()})
        return super().step(params, grads, state)


class _HeldCheck:
    """A layer that, before computing, checks that every parameter array it is given is
    held in the rank's ledger: holding is tied to use."""

    def __init__(self, layer, memory, name):
        self.layer, self.memory, self.name = layer, memory, name

    def _check(self, params):
        for k, v in params.items():
            if self.memory.holding(v) is None:
                raise CheckFailed(f"layer {self.name} computed with parameter {k!r}, which is not in this rank's "
                                  f"ledger: hold the gathered copy (comm.memory.hold) while the layer uses it, and "
                                  f"release it only after")

    def forward(self, params, x):
        self._check(params)
        return self.layer.forward(params, x)

    def backward_input(self, params, cache, dy):
        self._check(params)
        return self.layer.backward_input(params, cache, dy)

    def backward_weight(self, params, cache, dy):
        return self.layer.backward_weight(params, cache, dy)

    def flops(self, shape):
        return self.layer.flops(shape)


class _Checked:
    def __init__(self, model, memory):
        self.layers = [(name, _HeldCheck(layer, memory, name)) for name, layer in model.layers]


def _train(cls, n, what, *, mesh=False, opt=None, topology=None, held_check=False, batches=BATCHES, before=None,
           **kw):
    """Train ``cls`` (the student's strategy) on n ranks and compare with one device
    (``before(world, model, params)`` runs first, for a more specific check): (world,
    per-rank results, model, initial params)."""
    model, params = _model(), _model().init(np.random.default_rng(3))
    opt = opt or nn.AdamW(lr=1e-2, weight_decay=0.1)
    world = World(mesh={"dp": n, "tp": 2}, topology=topology) if mesh else World(n, topology=topology)

    def prog(comm):
        dp = comm.group("dp") if mesh else comm
        m = _Checked(model, comm.memory) if held_check else model
        return train(comm, m, cls(dp, m, params, opt, **kw), batches)

    with refusing(what, *LIBRARY):
        out = run_on_emulator(world, prog, what)
    if before:
        before(world, model, params)
    ranks = world.mesh.group_ranks("dp", 0) if mesh else range(n)
    first = out[ranks[0]]
    full = first.params if first.params is not None else assemble(model, params, [out[r].shards for r in ranks])
    expect(full is not None, f"{what}: your strategy returns neither params() nor shards()")
    ref, _ = train_single(model, params, batches, nn.AdamW(lr=1e-2, weight_decay=0.1))
    err = max(np.abs(full[k] - ref[k]).max() for k in ref)
    expect(err < 1e-10, f"{what}, n={n}: parameters differ from one device training on the whole batch by "
                        f"{err:.3g} after {len(batches)} steps; check the averaging (divide the sum by the group "
                        f"size once) and which slice is whose")
    return world, out, model, params


def _ops(world, rank=0):
    return [c.op for c in world.calls[rank]]


def _overlapped(world, op, rank=0, compute_prefix=""):
    """Whether some ``op`` ran at the same time as some compute of the rank (whose name
    starts with ``compute_prefix``): communication hidden under compute."""
    tl = world.timeline()
    computes = [e for e in tl.of(rank, kind="compute") if e.name.startswith(compute_prefix)]
    return any(c.start < e.end and e.start < c.end for e in tl.of(rank, kind="comm") if e.name == op
               for c in computes)


def check_ddp(cls):
    """Exercise 1.1: DDP with one bucket per layer, reduced while backward runs."""
    n_layers = len(_model().layers)
    for n in (1, 2, 3, 4):
        world, out, model, params = _train(cls, n, "Exercise 1.1")
        if n == 1:
            continue
        ops = _ops(world)
        expect(set(ops) == {"all_reduce"}, f"n={n}: your DDP called {sorted(set(ops))}; it needs all_reduce only")
        expect(len(ops) == n_layers * len(BATCHES), f"n={n}: {len(ops)} all-reduces in {len(BATCHES)} steps; "
               f"expected one per layer per step ({n_layers * len(BATCHES)})")
        sizes = sorted(sum(v.nbytes for k, v in params.items() if k.startswith(name + ".")) for name, _ in model.layers)
        padded = sorted(lay.padded * 8 for lay in layouts(model, params, n).values())
        got = sorted(c.nbytes for c in world.calls[0][:n_layers])
        expect(got in (sizes, padded), f"n={n}: all-reduce sizes {got} bytes; expected each layer's gradients, {sizes}")
        led = world.memory[0]
        full = (sum(v.nbytes for v in params.values()), sum(padded))
        expect(led.peak_by_kind["grads"] in full,
               f"n={n}: peak gradient bytes in the ledger {led.peak_by_kind['grads']}, expected the full gradients "
               f"({full[0]}, or {full[1]} padded): hold each layer's flat gradient as 'grads'")
        expect(led.current["grads"] == 0, f"n={n}: {led.current['grads']} bytes of gradients still held after the "
               f"step; release them once the update is done")
    world, *_ = _train(cls, 2, "Exercise 1.1", topology=Topology(flops=3e10))
    expect(_overlapped(world, "all_reduce"), "your all-reduces start only after backward has finished: start each "
           "one in grads_ready with async_op=True and wait for them in step")
    world, *_ = _train(cls, 2, "Exercise 1.1", mesh=True)
    expect({c.group for c in world.calls[0]} == {"dp"}, "on a mesh, reduce over the strategy's group (self.comm), "
           f"not over every rank: your calls went to {sorted({c.group for c in world.calls[0]})}")
    passed("Exercise 1.1", "DDP trains as one device does (n = 1..4, and over a mesh's dp axis); one all-reduce "
           "per layer, started while backward runs; gradients held in the ledger and freed after the step")


def check_zero2(cls):
    """Exercise 1.2: ZeRO-2: reduce-scatter each layer's gradient as backward produces it."""
    model = _model()
    names = [name for name, _ in model.layers]
    for n in (1, 2, 3, 4):
        opt = _RecordingAdamW(lr=1e-2, weight_decay=0.1)

        def mean_gradients(world, model, params):  # each slice's gradient: the mean over ranks, divided once
            lays = layouts(model, params, n)
            _, grads_ref = model.backward(params, *_ref_cache(model, params, BATCHES[0]))
            slices = [lays[k].flatten(nn.sub(grads_ref, k)).reshape(n, -1)[r] for k in names for r in range(n)]
            for step in opt.seen:
                (g,) = step.values()
                expect(any(s.shape == g.shape and np.allclose(g, s, rtol=1e-9, atol=1e-12) for s in slices),
                       f"n={n}: a gradient slice given to the optimizer is not the mean gradient of that slice "
                       f"over the ranks (did you divide the reduce-scattered sum by the group size, and only once?)")

        world, out, model, params = _train(cls, n, "Exercise 1.2", opt=opt, batches=BATCHES[:1],
                                           before=mean_gradients)
        lays = layouts(model, params, n)
        if n == 1:
            continue
        ops = _ops(world)
        expect(ops == ["reduce_scatter"] * len(names) + ["all_gather"] * len(names),
               f"n={n}: calls {ops}; ZeRO-2 reduce-scatters each layer during backward, then all-gathers each "
               f"layer's updated slice")
        expect([c.nbytes for c in world.calls[0][:len(names)]] == [lays[k].padded * 8 for k in reversed(names)],
               f"n={n}: reduce-scatter sizes do not match each layer's padded flat gradient (backward order)")
        led = world.memory[0]
        shards = sum(lay.padded // n for lay in lays.values()) * 8
        expect(led.peak_by_kind["grads"] == shards, f"n={n}: peak gradient bytes {led.peak_by_kind['grads']}; "
               f"ZeRO-2 keeps only this rank's slices ({shards}): hold the slice as 'grads', not the full gradient")
        largest = max(lay.padded for lay in lays.values()) * 8
        expect(led.peak_by_kind["buffers"] <= largest, f"n={n}: up to {led.peak_by_kind['buffers']} bytes of "
               f"temporaries; free each full gradient right after its reduce-scatter (at most one layer's)")
    passed("Exercise 1.2", "ZeRO-2 trains as one device does (n = 1..4, padded layouts included); each layer "
           "reduce-scattered as backward produces it, the optimizer given the mean gradient of its slice, only "
           "slices held")


def _ref_cache(model, params, batch):
    x, y = batch
    logits, cache = model.forward(params, x)
    _, lc = nn.cross_entropy(logits, y)
    return cache, nn.cross_entropy_backward(lc)


def check_zero3(cls):
    """Exercise 1.3: ZeRO-3 with prefetch, on layers whose sizes need padding."""
    model = _model()
    names = [name for name, _ in model.layers]
    for n in (1, 2, 3):
        world, out, model, params = _train(cls, n, "Exercise 1.3", held_check=True)
        lays = layouts(model, params, n)
        if n == 1:
            continue
        ops = _ops(world)
        per_step = 3 * len(names)
        expect(len(ops) == per_step * len(BATCHES) and ops.count("reduce_scatter") == len(names) * len(BATCHES),
               f"n={n}: {ops.count('all_gather')} all-gathers and {ops.count('reduce_scatter')} reduce-scatters in "
               f"{len(BATCHES)} steps; ZeRO-3 gathers every layer for forward and again for backward, and "
               f"reduce-scatters its gradient")
        gathers = sorted({c.nbytes for c in world.calls[0] if c.op == "all_gather"})
        expect(gathers == sorted({lay.padded // n * 8 for lay in lays.values()}),
               f"n={n}: all-gather inputs of {gathers} bytes; each rank passes its slice of the padded layer")
        led = world.memory[0]
        mine = sum(lay.padded // n for lay in lays.values()) * 8
        expect(led.peak_by_kind["params"] == mine, f"n={n}: peak parameter bytes {led.peak_by_kind['params']}; ZeRO-3 "
               f"keeps only its slices ({mine}) as 'params', the gathered copies as 'buffers'")
        expect(led.current["buffers"] == 0, f"n={n}: {led.current['buffers']} bytes of gathered parameters or "
               f"gradients still held after the step: free each as soon as the layer is done")
    world, *_ = _train(cls, 2, "Exercise 1.3", topology=Topology(flops=3e10), held_check=True)
    expect(_overlapped(world, "all_gather", compute_prefix="F "),
           "no all-gather runs while a layer computes: prefetch the next layer (start its gather with "
           "async_op=True before this layer computes, wait for it when its turn comes)")
    passed("Exercise 1.3", "ZeRO-3 trains as one device does (n = 1..3, padded layers); two gathers and one "
           "reduce-scatter per layer, the next gather prefetched under compute, layers computing only with held "
           "parameters, nothing left held")


PROBLEM_8_1 = [dict(n_params=30e9, dp_size=16, gpu_gb=80), dict(n_params=7e9, dp_size=8, gpu_gb=80),
               dict(n_params=70e9, dp_size=64, gpu_gb=40), dict(n_params=175e9, dp_size=128, gpu_gb=80)]


def problem_8_1(fn):
    """fn(n_params, dp_size, gpu_gb) -> ({zero_stage: (params GB, grads GB, optimizer GB)}, stages that fit)."""
    for case in PROBLEM_8_1:
        want = {z: accounting_memory.zero_bytes_per_gpu(case["n_params"], case["dp_size"], z) for z in range(4)}
        with refusing("Problem 8.1", accounting_memory.zero_bytes_per_gpu, zero_explorer.zero_explorer_model):
            got = fn(**case)
        expect(isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], dict),
               "Problem 8.1: return ({zero_stage: (params GB, grads GB, optimizer GB)}, [stages that fit])")
        per_stage, fits = got
        args = ", ".join(f"{k}={v:g}" for k, v in case.items())
        for z in range(4):
            parts = per_stage.get(z)
            expect(parts is not None and len(parts) == 3, f"Problem 8.1 ({args}): give three numbers for stage {z}")
            for what, g, w in zip(("params", "grads", "optimizer"), parts, (want[z].params, want[z].grads,
                                                                            want[z].optimizer)):
                try:
                    check_close(f"Problem 8.1 ({args}), stage {z} {what}", g, w / 1e9, unit=" GB", rel=0.01, quiet=True)
                except CheckFailed as exc:
                    raise CheckFailed(f"{exc}; recheck which parts stage {z} shards") from None
        right = [z for z in range(4) if want[z] / 1e9 <= case["gpu_gb"]]
        expect(sorted(fits) == right, f"Problem 8.1 ({args}): the stages that fit in {case['gpu_gb']:g} GB are not "
               f"{sorted(fits)}")
    passed("Problem 8.1", f"parameters, gradients and optimizer state per GPU right for every stage, in "
           f"{len(PROBLEM_8_1)} configurations")
