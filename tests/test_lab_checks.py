"""gpu_labs' shared checks, in one process: a comparison that is missing a piece fails,
a comparison of nothing fails, a correct answer computed another way passes; and the
backend choice refuses a node with fewer GPUs than ranks instead of falling back."""

import numpy as np
import pytest
import torch

from emulator.records.calls import Call
from gpu_labs.checks import calls_verdict, differences, error
from gpu_labs.common import TOLERANCE, choose_backend


def grads(seed=0, n=3):
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(4, 5, generator=g, dtype=torch.float64) for i in range(n)}


def test_complete_and_right_passes():
    want = grads()
    assert differences(want, want, 1e-12) == []


def test_a_correct_answer_computed_another_way_passes():
    want = grads()
    got = {k: (v.T @ torch.eye(4, dtype=torch.float64)).T.to(torch.float32) for k, v in want.items()}
    assert differences(got, want, TOLERANCE[torch.float32]) == []


@pytest.mark.parametrize("damage,expect", [
    (lambda g: g.pop("w1"), "w1 is missing"),
    (lambda g: g.update(w1=None), "w1 is None"),
    (lambda g: g.update(w1=g["w1"][:2]), "w1 has shape (2, 5), expected (4, 5)"),
    (lambda g: g.update(w1=g["w1"] * 1.01), "w1 differs by"),
    (lambda g: g.update(w1=g["w1"] * float("nan")), "w1 differs by nan"),
    (lambda g: g.update(extra=g["w1"]), "extra was not expected"),
])
def test_every_kind_of_damage_is_named(damage, expect):
    want = grads()
    got = dict(want)
    damage(got)
    wrong = differences(got, want, 1e-9)
    assert len(wrong) == 1 and expect in wrong[0], wrong


def test_comparing_nothing_fails_instead_of_passing():
    assert differences({}, {}, 1e-9) == ["nothing to compare: the reference is empty"]
    assert differences(grads(), {}, 1e-9)


def test_large_and_edge_sized_inputs():
    big = {"w": torch.randn(1000, 1000, dtype=torch.float64)}
    off = {"w": big["w"].clone()}
    off["w"][-1, -1] += 1.0  # one element of a million
    assert differences(big, big, 1e-12) == [] and "w differs by" in differences(off, big, 1e-9)[0]
    empty = {"w": torch.empty(0, 3)}
    assert differences(empty, {"w": torch.empty(0, 3)}, 1e-9) == []
    assert "shape" in differences({"w": torch.empty(0, 3)}, {"w": torch.empty(1, 3)}, 1e-9)[0]


def test_error_is_relative_to_the_reference_scale():
    assert error(torch.tensor([101.0]), torch.tensor([100.0])) == pytest.approx(0.01)
    assert error(torch.tensor([0.01]), torch.tensor([0.0])) == pytest.approx(0.01)  # absolute below 1


def test_bfloat16_tolerance_separates_rounding_from_a_wrong_value():
    want = {"w": torch.randn(64, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(1))}
    rounded = {"w": want["w"].to(torch.bfloat16)}
    assert differences(rounded, want, TOLERANCE[torch.bfloat16]) == []
    wrong = {"w": rounded["w"].clone()}
    wrong["w"][3, 3] += 0.5
    assert differences(wrong, want, TOLERANCE[torch.bfloat16])


def test_calls_comparison_names_a_missing_call_and_says_when_it_is_empty():
    a = [[Call("all_reduce", "tp", 16), Call("send", "world", 8, 1)], [Call("all_reduce", "tp", 16)]]
    assert calls_verdict("x", a, a)[0] == []
    differ, line = calls_verdict("x", [a[0][:1], a[1]], a)
    assert differ and "more calls" in line
    differ, line = calls_verdict("x", [[]], [[]])
    assert differ == [] and "the comparison of calls is empty" in line


@pytest.mark.parametrize("requested,ranks,gpus,backend", [
    ("auto", 8, 8, "nccl"), ("auto", 4, 8, "nccl"), ("auto", 4, 0, "gloo"), ("gloo", 8, 8, "gloo"),
    ("nccl", 2, 2, "nccl"),
])
def test_backend_choice(requested, ranks, gpus, backend):
    assert choose_backend(requested, ranks, gpus)[0] == backend


@pytest.mark.parametrize("requested", ["auto", "nccl"])
def test_more_ranks_than_gpus_is_refused_not_run_on_the_cpu(requested):
    with pytest.raises(ValueError, match="8 ranks on this node but 4 GPU"):
        choose_backend(requested, 8, 4)


def test_nccl_without_gpus_is_refused():
    with pytest.raises(ValueError, match="needs GPUs"):
        choose_backend("nccl", 2, 0)


def test_gloo_on_a_gpu_node_says_the_gpus_stay_unused():
    assert "stay unused" in choose_backend("gloo", 8, 8)[1]
