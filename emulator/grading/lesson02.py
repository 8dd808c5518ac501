"""Checks for lesson 02 (tensor and sequence parallelism).

Each check runs the student's per-rank functions on 1, 2 and 4 emulated GPUs and compares
with the single-device layer (outputs and every gradient), then reads the trace: which
collectives, how many, how many bytes. While it runs, the library's own versions refuse.
"""

import numpy as np

from .. import nn
from ..engine.world import World
from ..accounting import activations
from ..accounting.all_reduce_time import activation_all_reduce_seconds
from ..cost import collective_time
from ..parallel import tensor_parallel as TP
from ..parallel.tensor_parallel import regions as SP, vocab as VP
from ..parallel.tensor_parallel.block import TensorParallelBlock
from .common import CheckFailed, check_close, compare_arrays, expect, passed, run_on_emulator
from .lesson02_sublayers import (A, B, D, FF, S, SP_S, expect_sp_forward_calls, positions, sp_reference, sp_shard,
                                sp_sublayer)
from .napkins import variants
from .refuse import refusing

LIBRARY = (TP.ColumnParallelLinear, TP.RowParallelLinear, TensorParallelBlock,
           SP.gather_from_sequence_parallel_region, SP.reduce_scatter_to_sequence_parallel_region,
           SP.gather_from_sequence_parallel_region_backward, SP.reduce_scatter_to_sequence_parallel_region_backward,
           TensorParallelBlock.sync_sequence_parallel_grads, VP.vocab_parallel_cross_entropy,
           activations.activation_bytes_per_layer, activations.activation_terms, activations.tp_bytes_per_layer,
           activations.pp_bytes_per_boundary, activations.selective_activation_bytes, collective_time)
# while the sequence-parallel checks run, the library's sequence-parallel block refuses (the
# collectives along a dim, SP.all_gather_dim and SP.reduce_scatter_dim, stay allowed)
SP_LIBRARY = (TensorParallelBlock, TensorParallelBlock.sync_sequence_parallel_grads)


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


def check_sp_forward(forward):
    """Exercise 2.3: the sequence-parallel MLP sublayer's forward on t ranks."""
    what = "Exercise 2.3"
    for t in (1, 2, 3, 4):
        full, x, dy = sp_sublayer(t)
        y_ref, _, _ = sp_reference(full, x, dy)
        world, out = _run(what, t, lambda c: forward(c, sp_shard(full, c.rank, t), x[:, positions(c.rank, t)].copy()),
                          SP_LIBRARY)
        for r, res in enumerate(out):
            expect(isinstance(res, tuple) and len(res) == 2, f"{what}: return (y, cache)")
            compare_arrays(f"{what}, t={t}, rank {r}, output (positions {positions(r, t).start}.."
                           f"{positions(r, t).stop - 1})", res[0], y_ref[:, positions(r, t)])
        if t > 1:
            expect_sp_forward_calls(what, t, world.calls[0])
    passed(what, "the sequence-parallel sublayer equals one device on 1, 2, 3 and 4 ranks, each rank holding its "
                 "positions; its forward is one all-gather and one reduce-scatter: an all-reduce's bytes")


def check_sp_backward(forward, backward):
    """Exercise 2.4: its backward, with the all-reduce of the partial gradients."""
    what = "Exercise 2.4"
    regathered = set()
    for t in (1, 2, 3, 4):
        full, x, dy = sp_sublayer(t)
        _, dx_ref, g_ref = sp_reference(full, x, dy)

        def prog(comm):
            mine = positions(comm.rank, t)
            p = sp_shard(full, comm.rank, t)
            _, cache = forward(comm, p, x[:, mine].copy())
            return backward(comm, p, cache, dy[:, mine].copy())

        world, out = _run(what, t, prog, SP_LIBRARY)
        for r, res in enumerate(out):
            expect(isinstance(res, tuple) and len(res) == 2 and isinstance(res[1], dict),
                   f"{what}: return (dx, grads), grads a dict keyed like p")
            compare_arrays(f"{what}, t={t}, rank {r}, input gradient", res[0], dx_ref[:, positions(r, t)])
        want = [sp_shard(g_ref, r, t) for r in range(t)]
        for k in want[0]:
            got = [res[1].get(k) for res in out]
            if any(g is None for g in got):
                raise CheckFailed(f"{what}: return a gradient for every parameter of p; {k} is missing")
            if all(np.shape(g) == np.shape(w[k]) and np.allclose(g, w[k]) for g, w in zip(got, want)):
                continue
            if k in ("ln.g", "ln.b", "fc2.b") and np.allclose(np.sum(got, axis=0), want[0][k]):
                raise CheckFailed(f"{what}, t={t}: the gradient of {k} on each rank is a part of the whole: the norm "
                                  f"and the bias after the reduce-scatter saw only this rank's positions. All-reduce "
                                  f"those gradients over the group (and only those)")
            if k.startswith(("fc1.", "fc2.w")):
                raise CheckFailed(f"{what}, t={t}: the gradient of {k} differs from one device's; this rank's slice "
                                  f"of fc1 and fc2 saw the whole sequence (after the all-gathers), so its gradient is "
                                  f"complete on the rank: do not sum it over the group")
            compare_arrays(f"{what}, t={t}, gradient of {k}", got[0], want[0][k])
        if t > 1:
            calls = world.calls[0][2:]
            local, whole = B * (SP_S // t) * D * 8, B * SP_S * D * 8
            got = [(c.op, c.nbytes) for c in calls]
            big = [c for c in calls if c.op == "all_reduce" and c.nbytes >= local]
            expect(not big, f"{what}, t={t}: the backward all-reduces {big[0].nbytes if big else 0} bytes of "
                            f"activations' gradients, as tensor parallelism alone does; under sequence parallelism "
                            f"the input gradient of the all-gathered region is reduce-scattered along the sequence")
            gathers = [n for op, n in got if op == "all_gather"]
            scatters = [n for op, n in got if op == "reduce_scatter"]
            small = [n for op, n in got if op == "all_reduce"]
            expect(scatters == [whole] and gathers in ([local], [local, local]) and sum(small) <= 3 * D * 8
                   and len(got) == len(gathers) + len(scatters) + len(small),
                   f"{what}, t={t}: the backward made {got}; it needs one all-gather of the output gradient (the "
                   f"reduce-scatter's backward, {local} bytes), one reduce-scatter of the input gradient (the "
                   f"all-gather's backward, {whole} bytes), the all-reduce of the partial gradients, and, unless "
                   f"the forward kept it, the all-gather of the norm's output again for fc1's weight gradient")
            if len(gathers) == 2:
                regathered.add(t)
    how = ("gathered the norm's output again for fc1's weight gradient (bytes, as Megatron does)" if regathered else
           "kept the gathered norm output from the forward (memory instead of bytes)")
    passed(what, f"input gradient and every parameter's gradient equal one device's on 1 to 4 ranks; you {how}, and "
                 f"all-reduced the norm's and fc2's bias gradients: the replicas stay identical")


def check_vocab_parallel_cross_entropy(fn):
    """Exercise 2.5: cross-entropy over vocabulary-split logits. Any traffic of a few
    numbers per token passes (three all-reduces, or the sum of exponentials and the
    target's logit fused in one (2, b, s) buffer, as Megatron does); moving the logits,
    V/t numbers per token on each rank, does not."""
    vocab, per_token = 96, 6  # at most 6 numbers per token sent in all; a rank's logits are 24 or more
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
            calls = world.calls[0]
            numbers = sum(c.nbytes for c in calls) / 8
            if numbers > per_token * B * S:
                biggest = max(calls, key=lambda c: c.nbytes)
                raise CheckFailed(f"Exercise 2.5, t={t}: rank 0's collectives carry {numbers:g} numbers for {B * S} "
                                  f"tokens (the largest, {biggest!r}); the logits must not travel ({n} per token on "
                                  f"each rank): the max, the sum of exponentials and the target's logit do, a few "
                                  f"numbers per token")
    passed("Exercise 2.5", "vocabulary-parallel cross-entropy equals the single-device loss and gradient on 1 to 4 "
           "ranks; only a few numbers per token cross the ranks")


def _variants(name, fn, cases, model, unit, labels):
    return variants(name, fn, cases, model, unit, labels, LIBRARY)


def problem_8_3(fn):
    """fn(b, s, h, t, dtype_bytes) -> (TP bytes per GPU per layer, PP bytes per boundary)."""
    cases = [dict(b=4, s=8192, h=8192, t=8, dtype_bytes=2), dict(b=1, s=4096, h=12288, t=4, dtype_bytes=2),
             dict(b=8, s=2048, h=5120, t=2, dtype_bytes=4)]
    tp, pp = _variants("Problem 8.3", fn, cases, lambda b, s, h, t, dtype_bytes: (
        activations.tp_bytes_per_layer(b, s, h, t, dtype_bytes), activations.pp_bytes_per_boundary(b, s, h, dtype_bytes)),
        " B", ("TP bytes", "PP bytes"))
    passed("Problem 8.3", f"TP moves {tp / 1e9:.3g} GB per layer (forward and backward), PP {pp / 1e9:.3g} GB per "
           f"boundary (forward only); both ways, {tp / (2 * pp):.1f}x per layer; right for 3 configurations")


def problem_8_4(fn):
    """fn(h, a, L, s, b, t) -> (bytes per layer with SP, per GPU with SP, per layer without, per GPU without),
    selective recomputation."""
    cases = [dict(h=12288, a=96, L=96, s=4096, b=1, t=8), dict(h=8192, a=64, L=80, s=8192, b=1, t=8),
             dict(h=5120, a=40, L=40, s=2048, b=2, t=4)]
    got = _variants("Problem 8.4", fn, cases, activations.selective_activation_bytes, " B",
                    ("per layer, SP", "per GPU, SP", "per layer, no SP", "per GPU, no SP"))
    passed("Problem 8.4", f"{got[0] / 1e6:.0f} MB per layer and {got[1] / 1e9:.1f} GB per GPU with sequence "
           f"parallelism, {got[2] / 1e6:.0f} MB and {got[3] / 1e9:.1f} GB without; right for 3 models")


def napkin_tp_across_nodes(fn):
    """fn(b, s, h, t, gpus_per_node) -> seconds of one all-reduce of the bf16 activations
    over t ranks (NCCL-like: a channel per NIC when it leaves the node)."""
    cases = [dict(b=1, s=4096, h=8192, t=16, gpus_per_node=8), dict(b=1, s=4096, h=8192, t=8, gpus_per_node=8),
             dict(b=2, s=2048, h=12288, t=8, gpus_per_node=4)]

    def model(b, s, h, t, gpus_per_node):
        return (activation_all_reduce_seconds(b, s, h, t, gpus_per_node),)

    def wrapped(**case):
        return (fn(**case),) if case else (fn(),)

    (seconds,) = _variants("Napkin 2.1", wrapped, cases, model, " s", ("seconds",))
    inside = model(1, 4096, 8192, 8, 8)[0]
    passed("Napkin 2.1", f"{seconds * 1e3:.3g} ms per all-reduce across two nodes, {inside * 1e3:.3g} ms inside one "
           f"({seconds / inside:.1f}x), right for 3 configurations")
