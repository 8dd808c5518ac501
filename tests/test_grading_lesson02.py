"""Lesson 02's checks reject plausible wrong answers and accept correct ones."""

import numpy as np
import pytest

from emulator import nn
from emulator.grading import CheckFailed
from emulator.grading import lesson02 as g


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


def test_sequence_regions_check(capsys):
    def ag(comm, x):
        return np.moveaxis(comm.all_gather(np.ascontiguousarray(np.moveaxis(x, 1, 0))), 0, 1)

    def rs(comm, x):
        return np.moveaxis(comm.reduce_scatter(np.ascontiguousarray(np.moveaxis(x, 1, 0))), 0, 1)

    g.check_sequence_regions(ag, rs)
    assert "PASSED Exercise 2.3" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="along the sequence"):
        g.check_sequence_regions(lambda comm, x: comm.all_gather(x), rs)  # gathers along dim 0

    def rs_by_all_reduce(comm, x):  # right values, twice the bytes
        n = x.shape[1] // comm.size
        return comm.all_reduce(x)[:, comm.rank * n:(comm.rank + 1) * n]

    with pytest.raises(CheckFailed, match="one all-gather and one reduce-scatter"):
        g.check_sequence_regions(ag, rs_by_all_reduce)


def test_sequence_parallel_grads_check(capsys):
    partial = ["ln1.g", "ln1.b", "ln2.g", "ln2.b", "attn.o.b", "mlp.fc2.b"]

    def right(comm, grads):
        return {k: comm.all_reduce(v) if k in partial else v for k, v in grads.items()}

    g.check_sequence_parallel_grads(right)
    assert "PASSED Exercise 2.4" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="partial sums"):
        g.check_sequence_parallel_grads(lambda comm, grads: grads)
    with pytest.raises(CheckFailed, match="partial sums"):  # summing everything, the split weights too
        g.check_sequence_parallel_grads(lambda comm, grads: {k: comm.all_reduce(v) for k, v in grads.items()})
    with pytest.raises(CheckFailed, match="partial sums"):  # the norms only, not the biases
        g.check_sequence_parallel_grads(lambda comm, grads: {k: comm.all_reduce(v) if k.startswith("ln") else v
                                                             for k, v in grads.items()})


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
