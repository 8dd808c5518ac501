"""Lesson 06's checks reject plausible wrong answers and accept other correct ones (a plan's
memory and bytes, Exercises 6.2 and 6.3: tests/test_grading_lesson06_memory_and_bytes.py)."""

import numpy as np
import pytest

from emulator.grading import CheckFailed
from emulator.grading import lesson06 as g
from emulator.mesh import Mesh
from emulator.parallel import ParallelDims
from emulator.planner import mesh_tradeoff, search

KINDS = ("params", "grads", "optimizer", "activations", "buffers")


# ----------------------------------------------------------------- Exercise 6.1
def unravel(rank, sizes):
    """Right, written differently: NumPy's unravel_index over the mesh's shape."""
    axes, shape = list(sizes), tuple(sizes.values())
    idx = np.unravel_index(rank, shape)
    coords = {a: int(i) for a, i in zip(axes, idx)}
    groups = {}
    for k, a in enumerate(axes):
        groups[a] = [int(np.ravel_multi_index(tuple(j if q == k else idx[q] for q in range(len(axes))), shape))
                     for j in range(shape[k])]
    return coords, groups


def test_mesh_coords_check(capsys):
    g.check_mesh_coords(unravel)
    assert "PASSED Exercise 6.1" in capsys.readouterr().out

    def first_axis_innermost(rank, sizes):
        return unravel(rank, dict(reversed(list(sizes.items()))))

    with pytest.raises(CheckFailed, match="last axis is innermost"):
        g.check_mesh_coords(first_axis_innermost)

    def without_itself(rank, sizes):
        c, groups = unravel(rank, sizes)
        return c, {a: [r for r in ranks if r != rank] for a, ranks in groups.items()}

    with pytest.raises(CheckFailed, match="group along"):
        g.check_mesh_coords(without_itself)

    def strided_from_zero(rank, sizes):  # the group of coordinate 0, not this rank's
        c, groups = unravel(rank, sizes)
        return c, {a: unravel(0, sizes)[1][a] for a in groups}

    with pytest.raises(CheckFailed, match="group along"):
        g.check_mesh_coords(strided_from_zero)
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_mesh_coords(lambda rank, sizes: (Mesh(sizes).coords(rank), {}))
    with pytest.raises(CheckFailed, match="return"):
        g.check_mesh_coords(lambda rank, sizes: unravel(rank, sizes)[0])


# ----------------------------------------------------------------- Exercise 6.4
def tradeoff_by_hand(n_params, gpus, tp, pp, gpus_per_node, global_batch, micro_batch=1):
    """Right, written differently: floats for m, every rule in one expression."""
    ok = tp <= gpus_per_node and gpus % (tp * pp) == 0 and global_batch % (gpus // (tp * pp) * micro_batch) == 0
    m = global_batch / (gpus / (tp * pp)) / micro_batch
    return {"valid": ok, "state_bytes": n_params * 16 / gpus, "bubble": (pp - 1) / (m + pp - 1) if ok else None}


def tradeoff_by_reasons(n_params, gpus, tp, pp, gpus_per_node, global_batch, micro_batch=1):
    """Right, written differently again: collect what is wrong, sequences per replica first."""
    wrong = []
    if tp > gpus_per_node:
        wrong.append("node")
    replicas, rest = divmod(gpus, tp * pp)
    if rest:
        wrong.append("gpus")
    per_replica, rest = divmod(global_batch, replicas) if replicas else (0, 1)
    if rest or per_replica % micro_batch:
        wrong.append("batch")
    m = per_replica // micro_batch
    bubble = None if wrong else 1 - m / (m + pp - 1)
    return {"valid": not wrong, "state_bytes": (2 + 2 + 12) * n_params / gpus, "bubble": bubble}


def test_mesh_tradeoff_check(capsys):
    g.check_mesh_tradeoff(tradeoff_by_hand)
    g.check_mesh_tradeoff(tradeoff_by_reasons)
    assert capsys.readouterr().out.count("PASSED Exercise 6.4") == 2

    def variant(**change):
        def fn(n_params, gpus, tp, pp, gpn, batch, micro_batch=1):
            out = tradeoff_by_hand(n_params, gpus, tp, pp, gpn, batch, micro_batch)
            dp = gpus // (tp * pp)
            if "state" in change:
                out["state_bytes"] = 16 * n_params / (tp * pp)
            if "ideal" in change and out["valid"]:
                out["bubble"] = (pp - 1) / (batch / dp)
            if "node_only" in change:  # no divisibility test at all
                out["valid"] = tp <= gpn
                out["bubble"] = (pp - 1) / (batch / (dp * micro_batch) + pp - 1) if out["valid"] and dp else None
            if "no_node" in change:
                out["valid"] = gpus % (tp * pp) == 0 and batch % (dp * micro_batch) == 0
            if "no_micro_batch" in change:  # micro_batch ignored: m = batch / dp, and dp alone must divide it
                out["valid"] = tp <= gpn and gpus % (tp * pp) == 0 and batch % dp == 0
                out["bubble"] = (pp - 1) / (batch / dp + pp - 1) if out["valid"] else None
            if "bubble_when_invalid" in change and not out["valid"]:
                out["bubble"] = 0.0
            if "rounded" in change and out["bubble"] is not None:
                out["bubble"] = round(out["bubble"], 4)
            return out
        return fn

    with pytest.raises(CheckFailed, match="16 bytes per parameter over every GPU"):
        g.check_mesh_tradeoff(variant(state=True))
    with pytest.raises(CheckFailed, match="bubble"):
        g.check_mesh_tradeoff(variant(ideal=True))
    with pytest.raises(CheckFailed, match=r"valid should be False: tp x pp = 16 does not divide the 24 GPUs"):
        g.check_mesh_tradeoff(variant(node_only=True))
    with pytest.raises(CheckFailed, match=r"valid should be False: tp=16 does not fit in a node of 8"):
        g.check_mesh_tradeoff(variant(no_node=True))
    with pytest.raises(CheckFailed, match=r"you took m = batch / dp = 128; with 4 sequences per micro-batch"):
        g.check_mesh_tradeoff(variant(no_micro_batch=True))
    with pytest.raises(CheckFailed, match="return None"):
        g.check_mesh_tradeoff(variant(bubble_when_invalid=True))
    with pytest.raises(CheckFailed, match=r"bubble 0\.0078, expected 0\.007751937984496124"):  # digits enough to see it
        g.check_mesh_tradeoff(variant(rounded=True))
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_mesh_tradeoff(mesh_tradeoff)


# ----------------------------------------------------------------- Exercise 6.5
@pytest.mark.slow
def test_choose_plan_check(capsys):
    def sharded_and_recomputed(model, cluster, seq_len, batch_tokens):  # right without searching: a rule
        return ParallelDims(dp=cluster.gpus, zero_stage=2, recompute="full")

    g.check_choose_plan(sharded_and_recomputed)
    assert "PASSED Exercise 6.5" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="needs .* GB on its fullest GPU"):  # plain DDP does not fit
        g.check_choose_plan(lambda model, cluster, seq, tokens: ParallelDims(dp=cluster.gpus))
    with pytest.raises(CheckFailed, match="below"):  # fits, but a pipeline of 8 one-layer stages idles
        g.check_choose_plan(lambda model, cluster, seq, tokens: ParallelDims(pp=8, micro_batches=8, recompute="full"))
    with pytest.raises(CheckFailed, match="needs .* GB on its fullest GPU"):  # GPipe's last stage holds every
        g.check_choose_plan(lambda model, cluster, seq, tokens: ParallelDims(  # micro-batch's logits' gradient
            pp=8, micro_batches=8, schedule="gpipe", recompute="full"))
    with pytest.raises(CheckFailed, match="cannot run here"):
        g.check_choose_plan(lambda model, cluster, seq, tokens: ParallelDims(dp=4, zero_stage=1))
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_choose_plan(lambda model, cluster, seq, tokens: search(model, cluster, seq, tokens)[0][0])
    with pytest.raises(CheckFailed, match="ParallelDims"):
        g.check_choose_plan(lambda model, cluster, seq, tokens: {"dp": 8})


# ----------------------------------------------------------------- napkins
def test_napkins(capsys):
    g.napkin_state(lambda n_params=70e9, dp=4, tp=8, pp=2: (2 * n_params * 2 / (tp * pp) / 1e9,
                                                             (4 + 8) * n_params / (dp * tp * pp) / 1e9))
    g.napkin_dp_tokens(lambda flops=989e12, bandwidth=48e9, dp=64, grad_bytes=2:
                       2 * grad_bytes * (dp - 1) / dp * flops / (6 * bandwidth))
    g.napkin_llama_cp(lambda seq=131072, tokens=16 * 2**20, positions_per_gpu=8192, gpus=16384, tp=8, pp=16:
                      (seq // positions_per_gpu, gpus // (tp * pp * seq // positions_per_gpu),
                       tokens * tp * pp // (positions_per_gpu * gpus)))
    out = capsys.readouterr().out
    assert all(f"PASSED Napkin 6.{k}" in out for k in (1, 2, 3))
    with pytest.raises(CheckFailed, match="Napkin 6.1"):  # hard-coded to the lecture's numbers
        g.napkin_state(lambda **kw: (17.5, 13.125))
    with pytest.raises(CheckFailed, match="optimizer"):  # ZeRO-1 forgotten
        g.napkin_state(lambda n_params=70e9, dp=4, tp=8, pp=2: (4 * n_params / (tp * pp) / 1e9,
                                                                 12 * n_params / (tp * pp) / 1e9))
    with pytest.raises(CheckFailed, match="Napkin 6.2"):  # the all-reduce counted once, not 2(n-1)/n
        g.napkin_dp_tokens(lambda flops=989e12, bandwidth=48e9, dp=64, grad_bytes=2:
                           grad_bytes * flops / (6 * bandwidth))
    with pytest.raises(CheckFailed, match="Napkin 6.2"):
        g.napkin_dp_tokens(lambda **kw: 13521.0)
    with pytest.raises(CheckFailed, match="dp"):  # DP left at 128: the GPUs would not add up
        g.napkin_llama_cp(lambda seq=131072, tokens=16 * 2**20, positions_per_gpu=8192, gpus=16384, tp=8, pp=16:
                          (seq // positions_per_gpu, gpus // (tp * pp), tokens // seq))
    with pytest.raises(CheckFailed, match="Napkin 6.3"):
        g.napkin_llama_cp(lambda **kw: (16, 8, 16))
