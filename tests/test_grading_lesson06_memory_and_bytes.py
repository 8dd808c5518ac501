"""Lesson 06's checks of a plan's memory per rank (Exercise 6.2) and bytes sent per axis
(Exercise 6.3) reject plausible wrong counts and accept other correct ones."""

import numpy as np
import pytest

from emulator.grading import CheckFailed
from emulator.grading import lesson06 as g
from emulator.planner import evaluate, inventory


# ----------------------------------------------------------------- Exercise 6.2
def memory_by_arrays(layers, dims, rank):
    """Right, written differently: arrays of element counts, ceil by negative floor division."""
    n = {"dense": dims.dp * dims.cp, "experts": dims.dp * dims.cp // dims.ep}
    elems = np.array([[x["params"].get(k, 0) for k in ("dense", "experts")] for x in layers], dtype=np.int64)
    per = np.array([n["dense"], n["experts"]])
    mine = -(-elems // per)
    z = dims.zero_stage
    return {"params": 2 * float((mine if z == 3 else elems).sum()), "grads": 4 * float((mine if z >= 2 else elems).sum()),
            "optimizer": 12 * float((mine if z else elems).sum()), "buffers": 0.0,
            "activations": float(min(dims.pp - rank, dims.micro_batches) * sum(x["kept"] for x in layers))}


def test_plan_memory_plans_cover_every_case_the_text_teaches():
    plans = [d for _, d, _, _ in g.memory_plans()]
    assert {d.zero_stage for d in plans} == {0, 1, 2, 3}
    assert any(d.cp > 1 for d in plans) and any(d.ep > 1 for d in plans) and any(d.tp > 1 and d.sequence_parallel
                                                                                for d in plans)
    assert any(d.ep > 1 and d.zero_stage == 3 for d in plans)  # experts' parameters sharded over dp x cp / ep
    assert {d.pp for d in plans} >= {1, 2, 4}


@pytest.mark.slow
def test_plan_memory_check(capsys):
    g.check_plan_memory(memory_by_arrays)
    assert "PASSED Exercise 6.2" in capsys.readouterr().out

    def wrong(**change):
        def fn(layers, dims, rank):
            out = memory_by_arrays(layers, dims, rank)
            if "optimizer_unsharded" in change:
                out["optimizer"] = 12 * sum(sum(x["params"].values()) for x in layers)
            if "in_flight" in change:
                out["activations"] = change["in_flight"](dims, rank) * sum(x["kept"] for x in layers)
            if "grads_sharded_at_1" in change and dims.zero_stage == 1:
                out["grads"] = out["grads"] / (dims.dp * dims.cp)
            if "fp32" in change:
                out["params"] *= 2
            if "grads_bf16" in change:
                out["grads"] /= 2
            if "params_unsharded_at_3" in change and dims.zero_stage == 3:
                out["params"] = 2 * sum(sum(x["params"].values()) for x in layers)
            if "experts_over_dp_cp" in change and dims.ep > 1:
                out = memory_by_arrays(layers, dims.replace(ep=1), rank)
            if "buffers" in change:
                out["buffers"] = 10 ** 6
            return out
        return fn

    cases = [({"optimizer_unsharded": True}, "optimizer .*12 bytes of Adam's state per element of their 1/n slice"),
             ({"in_flight": lambda dims, rank: min(dims.pp, dims.micro_batches)}, "not p on every stage"),
             ({"in_flight": lambda dims, rank: dims.micro_batches}, "GPipe's count"),
             ({"grads_sharded_at_1": True}, "grads .*below ZeRO-2 every rank keeps all of its gradients"),
             ({"fp32": True}, "params .*bf16 weights, 2 bytes"),
             ({"grads_bf16": True}, "grads .*fp32, 4 bytes per element"),
             ({"params_unsharded_at_3": True}, "zero_stage=3.*ZeRO-3 shards the parameters too"),
             ({"experts_over_dp_cp": True}, "ep=.*dp x cp / ep ranks, not dp x cp")]
    for change, message in cases:
        with pytest.raises(CheckFailed, match=message):
            g.check_plan_memory(wrong(**change))
    g.check_plan_memory(wrong(buffers=True))  # not graded, as the text says
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_plan_memory(lambda layers, dims, rank: evaluate(None, None, dims, 1, 1))
    with pytest.raises(CheckFailed, match="return a dict"):
        g.check_plan_memory(lambda layers, dims, rank: [0] * 5)


# ----------------------------------------------------------------- Exercise 6.3
def bytes_by_calls(model, dims, seq_len, batch, rank):
    """Right, written differently: list every call, then add up what a ring sends."""
    t, p, m, n = dims.tp, dims.pp, dims.micro_batches, dims.dp * dims.cp
    b = batch // (dims.dp * m)
    act = b * seq_len * model.d_model * 4
    layers = inventory(model, dims, batch, seq_len, rank, param_bytes=4)
    calls = {"tp": [], "pp": [], "dp": []}
    for x in layers:
        if x["name"].startswith("blocks"):
            calls["tp"] += [act] * 4 * m
        elif x["name"] == "embed":
            calls["tp"] += [act] * m
        else:
            calls["tp"] += ([act] + [b * seq_len * 4] * 3) * m
        elems = sum(x["params"].values())
        calls["dp"].append((elems if dims.zero_stage == 0 else -(-elems // n) * n) * 4)
    calls["pp"] = [act] * (m * ((rank < p - 1) + (rank > 0)))
    return {"tp": sum(2 * (t - 1) / t * c for c in calls["tp"]), "pp": float(sum(calls["pp"])),
            "dp": sum(2 * (n - 1) / n * c for c in calls["dp"])}


def test_comm_bytes_check(capsys):
    g.check_comm_bytes(bytes_by_calls)
    assert "PASSED Exercise 6.3" in capsys.readouterr().out

    def changed(axis, how):
        def fn(model, dims, seq_len, batch, rank):
            out = bytes_by_calls(model, dims, seq_len, batch, rank)
            out[axis] = how(out[axis], model, dims, seq_len, batch, rank)
            return out
        return fn

    ring_once = changed("tp", lambda v, model, dims, *a: v * dims.tp / (2 * (dims.tp - 1)) if dims.tp > 1 else v)
    with pytest.raises(CheckFailed, match="tp sends"):  # a ring all-reduce sends its buffer once
        g.check_comm_bytes(ring_once)
    forward_only = changed("tp", lambda v, *a: v / 2)
    with pytest.raises(CheckFailed, match="tp sends"):
        g.check_comm_bytes(forward_only)

    def no_loss(model, dims, seq_len, batch, rank):
        out = bytes_by_calls(model, dims, seq_len, batch, rank)
        if rank == dims.pp - 1 and dims.tp > 1:
            b = batch // (dims.dp * dims.micro_batches)
            out["tp"] -= 3 * dims.micro_batches * 2 * (dims.tp - 1) / dims.tp * b * seq_len * 4
        return out

    with pytest.raises(CheckFailed, match="tp sends"):
        g.check_comm_bytes(no_loss)
    both_ways = changed("pp", lambda v, model, dims, seq, batch, rank: 2 * dims.micro_batches * batch //
                        (dims.dp * dims.micro_batches) * seq * model.d_model * 4 if dims.pp > 1 else 0)
    with pytest.raises(CheckFailed, match="pp sends"):  # the first and last stages send one way only
        g.check_comm_bytes(both_ways)
    unpadded = changed("dp", lambda v, model, dims, seq, batch, rank: g._unpadded_dp(model, dims, seq, batch, rank)
                       if dims.zero_stage else v)
    with pytest.raises(CheckFailed, match="you left the padding out"):
        g.check_comm_bytes(unpadded)
    bf16 = changed("dp", lambda v, *a: v / 2)
    with pytest.raises(CheckFailed, match="dp sends"):
        g.check_comm_bytes(bf16)
