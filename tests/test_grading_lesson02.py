"""Lesson 02's checks reject plausible wrong answers and accept correct ones."""

import numpy as np
import pytest

from emulator import nn
from emulator.grading import CheckFailed
from emulator.grading import lesson02 as g
from emulator.parallel.sequence_parallel import all_gather_dim, reduce_scatter_dim


def mlp_forward(comm, p, x, bias_before=False):
    u = x @ p["fc1.w"] + p["fc1.b"]
    part = nn.gelu(u) @ p["fc2.w"]
    y = comm.all_reduce(part + p["fc2.b"]) if bias_before else comm.all_reduce(part) + p["fc2.b"]
    return y, {"x": x, "u": u}


def mlp_backward(comm, p, cache, dy, reduce=True):
    x, u = cache["x"], cache["u"]
    gl = nn.gelu(u)
    grads = {"fc2.b": dy.sum((0, 1)), "fc2.w": gl.reshape(-1, gl.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])}
    du = nn.gelu_backward(u, dy @ p["fc2.w"].T)
    grads["fc1.w"] = x.reshape(-1, x.shape[-1]).T @ du.reshape(-1, du.shape[-1])
    grads["fc1.b"] = du.sum((0, 1))
    dx = du @ p["fc1.w"].T
    return (comm.all_reduce(dx) if reduce else dx), grads


def test_tp_mlp_check(capsys):
    g.check_tp_mlp(mlp_forward, mlp_backward)  # recomputes GELU in backward instead of caching it: also right
    assert "PASSED Exercise 2.1" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="forward output"):
        g.check_tp_mlp(lambda c, p, x: mlp_forward(c, p, x, bias_before=True), mlp_backward)
    with pytest.raises(CheckFailed, match="input gradient"):
        g.check_tp_mlp(mlp_forward, lambda c, p, cache, dy: mlp_backward(c, p, cache, dy, reduce=False))
    from emulator.parallel.tensor_parallel import RowParallelLinear

    def library(comm, p, x):
        row = RowParallelLinear(comm, p["fc2.w"].shape[0] * comm.size, x.shape[-1], dtype=np.float64)
        u = x @ p["fc1.w"] + p["fc1.b"]
        return row.forward({"w": p["fc2.w"], "b": p["fc2.b"]}, nn.gelu(u))[0], {"x": x, "u": u}

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_tp_mlp(library, mlp_backward)


# ----------------------------------------------------------------- Exercises 2.3 and 2.4
PARTIAL = ("ln.g", "ln.b", "fc2.b")


def sp_forward(comm, p, x, keep=False, reduce="reduce_scatter", gather_x=False):
    """The sequence-parallel MLP sublayer; ``keep`` keeps the gathered norm output for
    backward (memory instead of bytes)."""
    if gather_x:  # all-gather the input, run the norm on the whole sequence: TP with the output sliced
        xa = all_gather_dim(comm, x)
        a_all = nn.layer_norm(xa, p["ln.g"], p["ln.b"])
        a = a_all[:, comm.rank * x.shape[1]:(comm.rank + 1) * x.shape[1]]
    else:
        a = nn.layer_norm(x, p["ln.g"], p["ln.b"])
        a_all = all_gather_dim(comm, a)
    u = a_all @ p["fc1.w"] + p["fc1.b"]
    part = nn.gelu(u) @ p["fc2.w"]
    if reduce == "reduce_scatter":
        z = reduce_scatter_dim(comm, part)
    else:  # all-reduce, then keep my positions: right values, twice the bytes
        n = x.shape[1]
        z = comm.all_reduce(part)[:, comm.rank * n:(comm.rank + 1) * n]
    cache = {"x": x, "a": a, "u": u}
    if keep:
        cache["a_all"] = a_all
    return x + z + p["fc2.b"], cache


def sp_backward(comm, p, cache, dy, sync=PARTIAL, input_grad="reduce_scatter"):
    x, a, u = cache["x"], cache["a"], cache["u"]
    h = x.shape[-1]
    grads = {"fc2.b": dy.sum((0, 1))}
    dz = all_gather_dim(comm, dy)
    g = nn.gelu(u)
    grads["fc2.w"] = g.reshape(-1, g.shape[-1]).T @ dz.reshape(-1, h)
    du = nn.gelu_backward(u, dz @ p["fc2.w"].T)
    a_all = cache["a_all"] if "a_all" in cache else all_gather_dim(comm, a)
    grads["fc1.w"] = a_all.reshape(-1, h).T @ du.reshape(-1, du.shape[-1])
    grads["fc1.b"] = du.sum((0, 1))
    if input_grad == "reduce_scatter":
        da = reduce_scatter_dim(comm, du @ p["fc1.w"].T)
    else:
        n = x.shape[1]
        da = comm.all_reduce(du @ p["fc1.w"].T)[:, comm.rank * n:(comm.rank + 1) * n]
    dx, grads["ln.g"], grads["ln.b"] = nn.layer_norm_backward(x, p["ln.g"], da)
    for k in sync:  # one all-reduce per tensor: also right
        grads[k] = comm.all_reduce(grads[k])
    return dy + dx, grads


def test_sp_forward_check(capsys):
    g.check_sp_forward(sp_forward)
    g.check_sp_forward(lambda c, p, x: sp_forward(c, p, x, keep=True))
    assert capsys.readouterr().out.count("PASSED Exercise 2.3") == 2
    with pytest.raises(CheckFailed, match="t=2: the forward made .*all_reduce.*reduce-scatter it along the sequence"):
        g.check_sp_forward(lambda c, p, x: sp_forward(c, p, x, reduce="all_reduce"))
    with pytest.raises(CheckFailed, match="output"):  # the bias added before the reduce-scatter: t times
        g.check_sp_forward(lambda c, p, x: (sp_forward(c, p, x)[0] + (c.size - 1) * p["fc2.b"], {}))
    with pytest.raises(CheckFailed, match="shape"):  # returns the whole sequence on every rank
        g.check_sp_forward(lambda c, p, x: (all_gather_dim(c, sp_forward(c, p, x)[0]), {}))


def test_sp_forward_check_refuses_the_library_block():
    from emulator.parallel.tp_block import TensorParallelBlock

    def by_library(comm, p, x):
        TensorParallelBlock(comm, 16, 4, 48, sequence_parallel=True)
        return sp_forward(comm, p, x)

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_sp_forward(by_library)


def test_sp_backward_check(capsys):
    g.check_sp_backward(sp_forward, sp_backward)  # gathers the norm's output again: Megatron's default
    assert "gathered the norm's output again" in capsys.readouterr().out
    g.check_sp_backward(lambda c, p, x: sp_forward(c, p, x, keep=True), sp_backward)  # keeps it: also right
    assert "kept the gathered norm output" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="t=2: the gradient of ln.g on each rank is a part of the whole"):
        g.check_sp_backward(sp_forward, lambda c, p, cache, dy: sp_backward(c, p, cache, dy, sync=()))
    with pytest.raises(CheckFailed, match="t=2: the gradient of fc2.b on each rank is a part"):  # the norms only
        g.check_sp_backward(sp_forward, lambda c, p, cache, dy: sp_backward(c, p, cache, dy, sync=("ln.g", "ln.b")))
    with pytest.raises(CheckFailed, match="gradient of fc1.w differs .* do not sum it over the group"):
        g.check_sp_backward(sp_forward, lambda c, p, cache, dy: sp_backward(c, p, cache, dy,
                                                                          sync=PARTIAL + ("fc1.w", "fc1.b")))
    with pytest.raises(CheckFailed, match="all-reduces 3072 bytes of activations' gradients"):
        g.check_sp_backward(sp_forward, lambda c, p, cache, dy: sp_backward(c, p, cache, dy, input_grad="all_reduce"))


def test_sp_backward_check_refuses_the_library_sync():
    from emulator.parallel.tp_block import TensorParallelBlock

    def by_library(comm, p, cache, dy):
        dx, grads = sp_backward(comm, p, cache, dy, sync=())
        return dx, TensorParallelBlock.sync_sequence_parallel_grads(None, grads)

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_sp_backward(sp_forward, by_library)


def test_vocab_parallel_check():
    def gathers_the_logits(comm, logits_shard, targets, vocab):
        full = np.concatenate(comm.all_to_all([logits_shard] * comm.size), axis=-1) if comm.size > 1 else logits_shard
        loss, cache = nn.cross_entropy(full, targets)
        n = vocab // comm.size
        return loss, nn.cross_entropy_backward(cache)[..., comm.rank * n:(comm.rank + 1) * n]

    with pytest.raises(CheckFailed, match="logits must not travel"):
        g.check_vocab_parallel_cross_entropy(gathers_the_logits)
    with pytest.raises(CheckFailed):  # the local softmax only
        g.check_vocab_parallel_cross_entropy(lambda comm, ls, t, v: (0.0, np.zeros_like(ls)))

    def gathers_in_slices(comm, logits_shard, targets, vocab):  # the logits, one vocabulary column at a time
        cols = [comm.all_gather(np.ascontiguousarray(logits_shard[..., j])) for j in range(logits_shard.shape[-1])]
        full = np.concatenate([np.stack([c[r * len(targets):(r + 1) * len(targets)] for c in cols], -1)
                               for r in range(comm.size)], axis=-1)
        loss, cache = nn.cross_entropy(full, targets)
        n = vocab // comm.size
        return loss, nn.cross_entropy_backward(cache)[..., comm.rank * n:(comm.rank + 1) * n]

    with pytest.raises(CheckFailed, match="logits must not travel"):
        g.check_vocab_parallel_cross_entropy(gathers_in_slices)


def fused_cross_entropy(comm, logits_shard, targets, vocab):
    """Megatron's fused vocab-parallel cross-entropy: the max in one all-reduce, then the
    sum of exponentials and the target's logit in one (2, b, s) buffer."""
    n = vocab // comm.size
    lo = comm.rank * n
    m = comm.all_reduce(logits_shard.max(-1), op="max")
    e = np.exp(logits_shard - m[..., None])
    mine = (targets >= lo) & (targets < lo + n)
    picked = np.take_along_axis(logits_shard, np.where(mine, targets - lo, 0)[..., None], -1)[..., 0]
    total, target_logit = comm.all_reduce(np.stack([e.sum(-1), np.where(mine, picked, 0.0)]))
    grad = e / total[..., None]
    idx = np.nonzero(mine)
    grad[idx + (targets[idx] - lo,)] -= 1
    return float(np.mean(np.log(total) + m - target_logit)), grad / targets.size


def test_vocab_parallel_check_accepts_megatrons_fused_all_reduce(capsys):
    g.check_vocab_parallel_cross_entropy(fused_cross_entropy)
    assert "PASSED Exercise 2.5" in capsys.readouterr().out


def test_problem_8_3_passes_with_its_ratio_like_with_like(capsys):
    """The graded pair stays (TP's both passes, a boundary's forward); the PASSED line says
    which is which and compares both ways: 3.5x per layer at t = 8, not the unlike 7x."""
    def four_all_reduces(b=4, s=8192, h=8192, t=8, dtype_bytes=2):  # right, another way: 4 rings of 2(t-1) steps
        chunk = b * s * h * dtype_bytes / t
        return 4 * 2 * (t - 1) * chunk, b * s * h * dtype_bytes
    g.problem_8_3(four_all_reduces)
    out = capsys.readouterr().out
    assert "PASSED Problem 8.3" in out and "both ways, 3.5x per layer" in out and "(7.0x)" not in out
    with pytest.raises(CheckFailed, match="PP bytes"):  # the boundary both ways is not what 8.3 asks
        g.problem_8_3(lambda b=4, s=8192, h=8192, t=8, dtype_bytes=2: (
            8 * b * s * h * dtype_bytes * (t - 1) / t, 2 * b * s * h * dtype_bytes))


def test_napkins_with_numbers_of_their_own():
    with pytest.raises(CheckFailed, match="b=1"):
        g.problem_8_3(lambda b=4, s=8192, h=8192, t=8, dtype_bytes=2: (3.758e9, 5.369e8))
    with pytest.raises(CheckFailed, match="per layer, no SP"):  # forgot that recomputation drops the s^2 term
        g.problem_8_4(lambda h=12288, a=96, L=96, s=4096, b=1, t=8: (
            s * b * h * 34 / t, L * s * b * h * 34 / t, s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
            L * s * b * h * (10 + 24 / t + 5 * a * s / (h * t))))
    with pytest.raises(CheckFailed, match="t=16"):  # one NIC's flat ring, not a channel per NIC
        g.napkin_tp_across_nodes(lambda b=1, s=4096, h=8192, t=16, gpus_per_node=8: 2 * (t - 1) * (
            5e-6 + 2 * b * s * h / t / 48e9))
