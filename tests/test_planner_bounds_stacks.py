"""The exhaustive search's step bounds never exceed ``evaluate`` under every software stack
(each cuts and times its gradient buckets its own way: Megatron's rule, torch DDP's 25 MB,
the 2021 all-reduce after the flush), and the check sees a data-parallel floor set too high."""

import pytest

from emulator.grading.lesson06 import small_hbm_cluster
from emulator.parallel.dims import ParallelDims
from emulator.planner import bounds, evaluate
from emulator.planner import exhaustive
from emulator.planner.precision_of import plan_context
from tests.test_planner_search_brute_force import CASES, every_setting

STACKS = ("megatron-core", "megatron-2021", "pytorch-eager", "pytorch-compile")


def _violations(name, stack, step=2):
    """Settings (every ``step``-th one) whose bound exceeds the step ``evaluate`` gives."""
    model, seq, batch, hbm, nodes, g = CASES[name]
    cluster = small_hbm_cluster(nodes=nodes, gpus_per_node=g, hbm=hbm)
    found = {ParallelDims(**kw): bound for bound, kw in
             exhaustive.candidates(model.with_seq(seq), cluster, seq, batch * seq, plan_context(stack), [])}
    out, checked = [], 0
    for i, d in enumerate(every_setting(model, cluster.gpus, batch)):
        if i % step or d not in found:
            continue
        e = evaluate(model, cluster, d, seq, batch * seq, stack=stack)
        if e.step_time is None:
            continue
        checked += 1
        if found[d] > e.step_time * (1 + 1e-9):
            out.append((str(d), found[d], e.step_time))
    assert checked > 50
    return out


@pytest.mark.parametrize("stack", STACKS)
def test_the_step_bound_holds_under_every_stack(stack):
    assert not _violations("data-parallel-16", stack)


def test_the_check_sees_a_floor_that_is_too_high(monkeypatch):
    real = bounds.Factorisation.floor
    # the floor binds: three times it no longer holds
    monkeypatch.setattr(bounds.Factorisation, "floor", lambda self, *a: 3 * real(self, *a))
    assert _violations("data-parallel-16", "megatron-core")
