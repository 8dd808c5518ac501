"""Checks for lesson 02 (tensor and sequence parallelism).

Each check runs the student's per-rank functions on 1, 2 and 4 emulated GPUs and compares
with the single-device layer (outputs and every gradient), then reads the trace: which
collectives, how many, how many bytes. While it runs, the library's own versions refuse.
"""

import numpy as np

from .. import Topology, World, nn
from ..accounting import activations
from ..cost import collective_time
from ..parallel import sequence_parallel as SP
from ..parallel import tensor_parallel as TP
from ..parallel import vocab_parallel as VP
from ..parallel.tp_block import TensorParallelBlock
from .common import CheckFailed, check_close, compare_arrays, expect, passed, run_on_emulator
from .napkins import variants
from .refuse import refusing

LIBRARY = (TP.ColumnParallelLinear, TP.RowParallelLinear, TensorParallelBlock, SP.all_gather_dim,
           SP.reduce_scatter_dim, SP.gather_from_sp_region, SP.reduce_scatter_to_sp_region,
           SP.gather_from_sp_region_backward, SP.reduce_scatter_to_sp_region_backward,
           TensorParallelBlock.sync_sequence_parallel_grads, VP.vocab_parallel_cross_entropy,
           activations.activation_bytes_per_layer, activations.activation_terms, activations.tp_bytes_per_layer,
           activations.pp_bytes_per_boundary, collective_time)
D, A, FF, B, S = 16, 4, 32, 2, 8


def _run(what, t, prog, library=LIBRARY):
    world = World(t)
    with refusing(what, *library):
        out = run_on_emulator(world, prog, what)
    return world, out


def _shard_mlp(p, r, t):
    cols = slice(r * FF // t, (r + 1) * FF // t)
    return {"fc1.w": p["fc1.w"][:, cols], "fc1.b": p["fc1.b"][cols], "fc2.w": p["fc2.w"][cols], "fc2.b": p["fc2.b"]}


def _collectives(world, rank=0):
    return [(c.op, c.nbytes) for c in world.calls[rank]]


def _check_layer(what, t, forward, backward, module, shard, x, name):
    """Run forward alone, then forward and backward; compare with ``module``."""
    rng = np.random.default_rng(t)
    full = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in module.init(rng).items()}  # biases not zero
    y_ref, cache = module.forward(full, x)
    dy = rng.standard_normal(y_ref.shape)
    dx_ref, g_ref = module.backward(full, cache, dy)
    world, out = _run(what, t, lambda comm: forward(comm, shard(full, comm.rank, t), x.copy())[0])
    for r, y in enumerate(out):
        compare_arrays(f"{what}, t={t}, rank {r}, forward output", y, y_ref)
    fwd = _collectives(world)
    if t > 1:
        expect(fwd == [("all_reduce", x.nbytes)], f"{what}, t={t}: the forward made {fwd}; the {name} needs exactly "
               f"one all-reduce of the output's partial sums ({x.nbytes} bytes), after the row-parallel layer")

    def both(comm):
        p = shard(full, comm.rank, t)
        y, c = forward(comm, p, x.copy())
        return backward(comm, p, c, dy.copy())

    world, out = _run(what, t, both)
    for r, (dx, grads) in enumerate(out):
        compare_arrays(f"{what}, t={t}, rank {r}, input gradient", dx, dx_ref)
        want = shard(g_ref, r, t)
        expect(isinstance(grads, dict) and set(grads) == set(want), f"{what}: return the gradients of this rank's "
               f"parameters, keys {sorted(want)}")
        for k in want:
            compare_arrays(f"{what}, t={t}, rank {r}, gradient of {k}", grads[k], want[k])
    bwd = _collectives(world)[len(fwd):]
    if t > 1:
        expect(bwd == [("all_reduce", x.nbytes)], f"{what}, t={t}: the backward made {bwd}; it needs exactly one "
               f"all-reduce: of the input gradient's partial sums (the f operator's backward)")


def check_tp_mlp(forward, backward):
    """Exercise 2.1: the Megatron MLP on t ranks."""
    x = np.random.default_rng(0).standard_normal((B, S, D))
    for t in (1, 2, 4):
        _check_layer("Exercise 2.1", t, forward, backward, nn.MLP(D, FF, dtype=np.float64), _shard_mlp, x, "MLP")
    passed("Exercise 2.1", "the Megatron MLP equals the single-device MLP (output, input gradient, every "
           "gradient) on 1, 2 and 4 ranks, with one all-reduce in forward and one in backward, the bias added once")


def _shard_attention(p, r, t):
    cols = slice(r * D // t, (r + 1) * D // t)
    out = {f"{n}.{k}": p[f"{n}.{k}"][:, cols] if k == "w" else p[f"{n}.{k}"][cols] for n in "qkv" for k in "wb"}
    out.update({"o.w": p["o.w"][cols], "o.b": p["o.b"]})
    return out


def check_tp_attention(forward, backward):
    """Exercise 2.2: attention split by heads on t ranks."""
    x = np.random.default_rng(1).standard_normal((B, S, D))
    for t in (1, 2, 4):
        _check_layer("Exercise 2.2", t, forward, backward, nn.Attention(D, A, causal=True, dtype=np.float64),
                     _shard_attention, x, "attention")
    passed("Exercise 2.2", "attention split by heads equals the single-device attention on 1, 2 and 4 ranks, "
           "with one all-reduce in forward and one in backward")


def check_sequence_regions(all_gather_seq, reduce_scatter_seq):
    """Exercise 2.3: all-gather and reduce-scatter along the sequence; with them the block
    under sequence parallelism equals one device, and a region moves an all-reduce's bytes."""
    rng = np.random.default_rng(2)
    for t in (1, 2, 4):
        parts = [rng.standard_normal((B, S // t, D)) for _ in range(t)]
        full = [rng.standard_normal((B, S, D)) for _ in range(t)]
        world, out = _run("Exercise 2.3", t, lambda c: (all_gather_seq(c, parts[c.rank].copy()),
                                                        reduce_scatter_seq(c, full[c.rank].copy())))
        for r, (g, s) in enumerate(out):
            compare_arrays(f"Exercise 2.3, t={t}, rank {r}, all-gather along the sequence", g,
                           np.concatenate(parts, axis=1))
            compare_arrays(f"Exercise 2.3, t={t}, rank {r}, reduce-scatter along the sequence", s,
                           np.sum(full, axis=0)[:, r * S // t:(r + 1) * S // t])
        if t > 1:
            ops = [c.op for c in world.calls[0]]
            expect(ops == ["all_gather", "reduce_scatter"], f"Exercise 2.3, t={t}: used {ops}; one all-gather and "
                   f"one reduce-scatter, nothing else")
    # plugged into the block: sequence parallelism equals one device, and its forward moves TP's bytes
    blk = nn.TransformerBlock(D, A, FF, dtype=np.float64)
    params = blk.init(np.random.default_rng(3))
    x = np.random.default_rng(4).standard_normal((B, S, D))
    y_ref, _ = blk.forward(params, x)
    saved = SP.all_gather_dim, SP.reduce_scatter_dim
    SP.all_gather_dim, SP.reduce_scatter_dim = all_gather_seq, reduce_scatter_seq
    try:
        sent = {}
        for sp in (False, True):
            def prog(comm):
                tb = TensorParallelBlock(comm, D, A, FF, sequence_parallel=sp, act_dtype=np.float64)
                sl = slice(comm.rank * S // 4, (comm.rank + 1) * S // 4) if sp else slice(None)
                return tb.forward(tb.shard(params), x[:, sl])[0]

            world = World(4)
            out = run_on_emulator(world, prog, "Exercise 2.3")
            y = np.concatenate(out, axis=1) if sp else out[0]
            compare_arrays(f"Exercise 2.3, the block with sequence_parallel={sp}", y, y_ref)
            sent[sp] = world.stats().bytes_sent[0]
    finally:
        SP.all_gather_dim, SP.reduce_scatter_dim = saved
    expect(sent[True] == sent[False], f"Exercise 2.3: the block's forward sent {sent[True]} bytes per rank with "
           f"sequence parallelism and {sent[False]} without; an all-gather plus a reduce-scatter should move what "
           f"the all-reduce moved")
    passed("Exercise 2.3", "all-gather and reduce-scatter along the sequence are right on 1, 2 and 4 ranks; with "
           "them the block under sequence parallelism equals one device and its forward moves the all-reduces' "
           f"bytes ({sent[True]:,d} per rank)")


def check_sequence_parallel_grads(sync):
    """Exercise 2.4: the all-reduce sequence parallelism needs for the norms' (and the
    row-parallel biases') gradients."""
    blk = nn.TransformerBlock(D, A, FF, dtype=np.float64)
    params = blk.init(np.random.default_rng(5))
    x = np.random.default_rng(6).standard_normal((B, S, D))
    y_ref, cache = blk.forward(params, x)
    dy = np.random.default_rng(7).standard_normal(y_ref.shape)
    _, g_ref = blk.backward(params, cache, dy)

    class Student(TensorParallelBlock):
        def sync_sequence_parallel_grads(self, grads):
            return sync(self.comm, grads)

    for t in (1, 2, 4):
        def prog(comm):
            tb = Student(comm, D, A, FF, sequence_parallel=True, act_dtype=np.float64)
            p = tb.shard(params)
            sl = slice(comm.rank * S // t, (comm.rank + 1) * S // t)
            _, c = tb.forward(p, x[:, sl])
            return tb.backward(p, c, dy[:, sl])[1], tb.shard(g_ref)

        world, out = _run("Exercise 2.4", t, prog, [TensorParallelBlock.sync_sequence_parallel_grads])
        for r, (grads, want) in enumerate(out):
            for k in want:
                if not np.allclose(grads[k], want[k]):
                    raise CheckFailed(f"Exercise 2.4, t={t}, rank {r}: the gradient of {k} is not the single-device "
                                      f"one; under sequence parallelism which parameters saw only a slice of the "
                                      f"sequence, and so hold partial sums?")
    passed("Exercise 2.4", "with your all-reduce the norms' and the row-parallel biases' gradients equal one "
           "device's on 1, 2 and 4 ranks: the replicas stay identical")


def check_vocab_parallel_cross_entropy(fn):
    """Exercise 2.5: cross-entropy over vocabulary-split logits."""
    vocab = 12
    for t in (1, 2, 3, 4):
        rng = np.random.default_rng(10 + t)
        logits = rng.standard_normal((B, S, vocab)) * 3
        targets = rng.integers(0, vocab, (B, S))
        loss_ref, cache = nn.cross_entropy(logits, targets)
        grad_ref = nn.cross_entropy_backward(cache)
        n = vocab // t
        world, out = _run("Exercise 2.5", t, lambda c: fn(c, logits[..., c.rank * n:(c.rank + 1) * n].copy(),
                                                           targets.copy(), vocab))
        for r, (loss, grad) in enumerate(out):
            check_close(f"Exercise 2.5, t={t}, rank {r}, loss", loss, loss_ref, rel=1e-9, quiet=True)
            compare_arrays(f"Exercise 2.5, t={t}, rank {r}, gradient of the logits", grad,
                           grad_ref[..., r * n:(r + 1) * n])
        if t > 1:
            big = [c for c in world.calls[0] if c.nbytes > B * S * 8]
            if big:
                raise CheckFailed(f"Exercise 2.5, t={t}: {big[0]!r} moves more than one number per token; the "
                                  f"logits must not travel (max, sum of exponentials and the target's logit do)")
    passed("Exercise 2.5", "vocabulary-parallel cross-entropy equals the single-device loss and gradient on 1 to 4 "
           "ranks; only per-token numbers cross the ranks")


def _variants(name, fn, cases, model, unit, labels):
    return variants(name, fn, cases, model, unit, labels, LIBRARY)


def problem_8_3(fn):
    """fn(b, s, h, t, dtype_bytes) -> (TP bytes per GPU per layer, PP bytes per boundary)."""
    cases = [dict(b=4, s=8192, h=8192, t=8, dtype_bytes=2), dict(b=1, s=4096, h=12288, t=4, dtype_bytes=2),
             dict(b=8, s=2048, h=5120, t=2, dtype_bytes=4)]
    tp, pp = _variants("Problem 8.3", fn, cases, lambda b, s, h, t, dtype_bytes: (
        activations.tp_bytes_per_layer(b, s, h, t, dtype_bytes), activations.pp_bytes_per_boundary(b, s, h, dtype_bytes)),
        " B", ("TP bytes", "PP bytes"))
    passed("Problem 8.3", f"TP moves {tp / 1e9:.3g} GB per layer, PP {pp / 1e9:.3g} GB per boundary "
           f"({tp / pp:.1f}x), right for 3 configurations")


def problem_8_4(fn):
    """fn(h, a, L, s, b, t) -> (bytes per layer with SP, per GPU with SP, per layer without, per GPU without),
    selective recomputation."""
    cases = [dict(h=12288, a=96, L=96, s=4096, b=1, t=8), dict(h=8192, a=64, L=80, s=8192, b=1, t=8),
             dict(h=5120, a=40, L=40, s=2048, b=2, t=4)]

    def model(h, a, L, s, b, t):
        per = [activations.activation_bytes_per_layer(s, b, h, a, t, sp, "selective") for sp in (True, False)]
        return per[0], L * per[0], per[1], L * per[1]

    got = _variants("Problem 8.4", fn, cases, model, " B", ("per layer, SP", "per GPU, SP", "per layer, no SP",
                                                              "per GPU, no SP"))
    passed("Problem 8.4", f"{got[0] / 1e6:.0f} MB per layer and {got[1] / 1e9:.1f} GB per GPU with sequence "
           f"parallelism, {got[2] / 1e6:.0f} MB and {got[3] / 1e9:.1f} GB without; right for 3 models")


def napkin_tp_across_nodes(fn):
    """fn(b, s, h, t, gpus_per_node) -> seconds of one all-reduce of the bf16 activations
    over t ranks (NCCL-like: a channel per NIC when it leaves the node)."""
    cases = [dict(b=1, s=4096, h=8192, t=16, gpus_per_node=8), dict(b=1, s=4096, h=8192, t=8, gpus_per_node=8),
             dict(b=2, s=2048, h=12288, t=8, gpus_per_node=4)]

    def model(b, s, h, t, gpus_per_node):
        return (collective_time("all_reduce", 2 * b * s * h, t, Topology(gpus_per_node=gpus_per_node)),)

    def wrapped(**case):
        return (fn(**case),) if case else (fn(),)

    (seconds,) = _variants("Napkin 2.1", wrapped, cases, model, " s", ("seconds",))
    inside = model(1, 4096, 8192, 8, 8)[0]
    passed("Napkin 2.1", f"{seconds * 1e3:.3g} ms per all-reduce across two nodes, {inside * 1e3:.3g} ms inside one "
           f"({seconds / inside:.1f}x), right for 3 configurations")
