"""Checks for lesson 01 (data parallelism and ZeRO)."""

import numpy as np

from .. import World, nn
from ..accounting import zero_bytes_per_gpu
from ..sharding import FlatLayout
from .common import compare_arrays, expect, passed, run_on_emulator


def _calls(world, op):
    """How many times the group called ``op`` (first step of each call, counted once)."""
    starts = {rec.start for rec in world.trace if rec.op == op and rec.step == 0}
    return len(starts)


def check_ddp_average_gradients(fn):
    """fn(comm, grads: dict) -> dict of the mean over ranks, with one all-reduce."""
    shapes = {"w1": (5, 3), "b1": (3,), "w2": (3, 7)}
    for n in (1, 2, 3, 4):
        rng = np.random.default_rng(n)
        grads = [{k: rng.standard_normal(s) for k, s in shapes.items()} for _ in range(n)]
        world = World(n)
        out = run_on_emulator(world, lambda comm: fn(comm, {k: v.copy() for k, v in grads[comm.rank].items()}),
                   "ddp_average_gradients")
        for r in range(n):
            expect(set(out[r]) == set(shapes), f"n={n}: rank {r} returned keys {sorted(out[r])}")
            for k in shapes:
                compare_arrays(f"n={n}, rank {r}, {k}", out[r][k], np.mean([g[k] for g in grads], axis=0))
        if n > 1:
            ops = world.stats().bytes_by_op
            expect(set(ops) == {"all_reduce"}, f"n={n}: used {sorted(ops)}; average with all_reduce")
            calls = _calls(world, "all_reduce")
            expect(calls == 1, f"n={n}: {calls} all-reduces; put every gradient in one bucket and reduce once")
            S = sum(int(np.prod(s)) for s in shapes.values()) * 8
            expect(sum(world.stats().bytes_sent) == 2 * (n - 1) * S,
                   f"n={n}: {sum(world.stats().bytes_sent)} bytes sent in all, expected 2(n-1)S = {2 * (n - 1) * S}")
    passed("Exercise 1.1", "gradients averaged over ranks with one bucketed all-reduce (n = 1..4)")


def check_zero1_step(fn):
    """fn(comm, flat_params, flat_grads, opt, state) -> (full params, state): the ZeRO-1 update."""
    opt = nn.AdamW(lr=0.1, weight_decay=0.01)
    for n in (1, 2, 4):
        rng = np.random.default_rng(10 + n)
        S = 12 * n
        params = rng.standard_normal(S)
        grads = [rng.standard_normal(S) for _ in range(n)]
        world = World(n)

        def prog(comm):
            s = S // n
            state = opt.init({"flat": params[comm.rank * s:(comm.rank + 1) * s].copy()})
            new, state = fn(comm, params.copy(), grads[comm.rank].copy(), opt, state)
            new2, state = fn(comm, new, grads[comm.rank].copy(), opt, state)  # a second step uses the state
            return new, new2, state

        out = run_on_emulator(world, prog, "zero1_step")
        ref_state = opt.init({"flat": params})
        ref1, ref_state = opt.step({"flat": params}, {"flat": np.mean(grads, axis=0)}, ref_state)
        ref2, _ = opt.step(ref1, {"flat": np.mean(grads, axis=0)}, ref_state)
        for r in range(n):
            compare_arrays(f"n={n}, rank {r}, after one step", out[r][0], ref1["flat"])
            compare_arrays(f"n={n}, rank {r}, after two steps", out[r][1], ref2["flat"])
            m = out[r][2]["m"]["flat"]
            expect(m.shape == (S // n,), f"n={n}: rank {r}'s optimizer state has shape {m.shape}; "
                   f"ZeRO-1 keeps only this rank's slice ({S // n},)")
        if n > 1:
            ops = world.stats().bytes_by_op
            expect(set(ops) == {"reduce_scatter", "all_gather"},
                   f"n={n}: used {sorted(ops)}; ZeRO-1 is reduce-scatter then all-gather")
            expect(ops["reduce_scatter"] == ops["all_gather"] == 2 * (n - 1) * S * 8,
                   f"n={n}: bytes by op {ops}; each should be (n-1)/n x S per rank per step")
    passed("Exercise 1.2", "ZeRO-1 step equals the replicated AdamW update over two steps; "
           "optimizer state sharded; traffic = one all-reduce")


def check_zero3_layer_forward(fn):
    """fn(comm, layer, layout, shard, x) -> (y, cache): gather, compute, free."""
    block = nn.TransformerBlock(16, 2, 32, dtype=np.float64)
    params = block.init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, 5, 16))
    want, _ = block.forward(params, x)
    for n in (1, 2, 4):
        layout = FlatLayout.of(params, n)
        flat = layout.flatten(params)
        world = World(n)

        def prog(comm):
            y, cache = fn(comm, block, layout, layout.shard(flat, comm.rank, n), x)
            return y, comm.memory.current["buffers"], comm.memory.peak_by_kind["buffers"]

        out = run_on_emulator(world, prog, "zero3_layer_forward")
        for r, (y, current, peak) in enumerate(out):
            compare_arrays(f"n={n}, rank {r}, layer output", y, want)
            expect(peak >= flat.nbytes, f"n={n}: rank {r} never held the gathered layer in its ledger "
                   f"(comm.memory.hold(name, full, 'buffers'))")
            expect(current == 0, f"n={n}: rank {r} still holds {current} bytes of gathered parameters after "
                   f"the forward; release them (comm.memory.release(name))")
        if n > 1:
            ops = world.stats().bytes_by_op
            expect(set(ops) == {"all_gather"}, f"n={n}: used {sorted(ops)}; gather the shards with all_gather")
            expect(world.stats().bytes_sent == [(n - 1) / n * flat.nbytes] * n,
                   f"n={n}: bytes sent per rank {world.stats().bytes_sent}, expected (n-1)/n of the layer")
    passed("Exercise 1.3", "ZeRO-3 layer forward: gathered, computed the same output, freed; "
           "(n-1)/n of the layer's bytes per rank")


def problem_8_1(per_gpu_gb, fits):
    """30B parameters, 16 bytes each, 16 GPUs: GB per GPU for stages 0-3, and which fit 80 GB."""
    want = {s: zero_bytes_per_gpu(30e9, 16, s) / 1e9 for s in range(4)}
    for s in range(4):
        got = per_gpu_gb.get(s) if isinstance(per_gpu_gb, dict) else None
        expect(got is not None and abs(got - want[s]) <= 0.01 * want[s],
               f"Problem 8.1: stage {s}: {got} GB is not right; recheck which parts stage {s} shards")
    expect(sorted(fits) == [s for s in range(4) if want[s] <= 80],
           f"Problem 8.1: the stages that fit in 80 GB are not {sorted(fits)}")
    passed("Problem 8.1", ", ".join(f"stage {s}: {want[s]:g} GB" for s in range(4)) + "; only ZeRO-3 fits")
