"""The published rows are priced only as their code could run them: interleaved pipelines
Megatron could build, and no sequence parallelism before Megatron had it."""

import pytest

from emulator.planner import model_preset
from emulator.planner.interleaving import ANY, LLAMA3, MEGATRON_CORE_R08, MEGATRON_V25
from emulator.planner.published import RUNS, fastest_fitting, predict, settings
from emulator.planner.cluster import cluster_preset


@pytest.mark.parametrize("rules, layers, pp, v, why", [
    (MEGATRON_V25, 60, 4, 2, "60 layers do not divide into 4 x 2"),  # 76B: 15 layers a stage
    (MEGATRON_V25, 48, 2, 2, "only 3 or more stages, not 2"),  # 39B: v2.5 asserts pp > 2
    (MEGATRON_V25, 80, 8, 2, ""),
    (MEGATRON_CORE_R08, 48, 2, 2, ""),  # two stages, with --overlap-p2p-communication on by default
    (MEGATRON_CORE_R08, 92, 4, 2, "92 layers do not divide into 4 x 2"),  # the H100 119B: 23 a stage
    (MEGATRON_CORE_R08, 112, 16, 2, "112 layers do not divide into 16 x 2"),
    (ANY, 60, 4, 2, ""), (LLAMA3, 126, 16, 2, ""),  # uneven stages: Llama 3's 7, 8 x 14, 7
])
def test_each_framework_refuses_the_interleavings_its_code_refuses(rules, layers, pp, v, why):
    problem = rules.problem(layers, pp, v)
    assert (why in problem) if why else problem == ""
    if why:
        assert rules.name in problem and rules.source in problem


def _schedules(groups):
    return [(g[0].schedule, g[0].v) for g in groups]


def test_the_rows_settings_hold_interleaving_only_where_the_code_builds_it():
    run = next(r for r in RUNS if r.model == "megatron-76b")
    assert run.interleaving is MEGATRON_V25
    assert _schedules(settings(run.dims, 60)) == [("1f1b", 1), ("interleaved_1f1b", 2)]
    assert _schedules(settings(run.dims, 60, run.interleaving)) == [("1f1b", 1)]
    r145 = next(r for r in RUNS if r.model == "megatron-145b")
    assert _schedules(settings(r145.dims, 80, r145.interleaving)) == [("1f1b", 1), ("interleaved_1f1b", 2)]


def test_without_the_rule_the_search_would_pick_an_interleaving_megatron_cannot_build():
    """The check below can fail: with every interleaving allowed, the 76B row's fastest plan
    is interleaved over 4 stages of 15 layers, which Megatron-LM v2.5 builds as 56 layers."""
    run = next(r for r in RUNS if r.model == "megatron-76b")
    model, cluster = model_preset(run.model), cluster_preset(run.cluster, nodes=run.gpus // 8)
    free = fastest_fitting(model, cluster, run.dims, run.seq_len, run.batch * run.seq_len, run.stack)
    assert free.dims.schedule == "interleaved_1f1b"
    assert run.interleaving.problem(model.n_layers, free.dims.pp, free.dims.v)


def test_every_row_is_priced_as_a_plan_its_code_could_run():
    for run in RUNS:
        est, _ = predict(run)
        d, layers = est.dims, model_preset(run.model).n_layers
        if d.schedule == "interleaved_1f1b":
            assert run.interleaving.problem(layers, d.pp, d.v) == "", run.model
        if run.stack == "megatron-2021":  # Megatron-LM v2.5 has no --sequence-parallel
            assert not d.sequence_parallel and "no sequence parallelism" in run.stated, run.model
        elif run.tp > 1:
            assert d.sequence_parallel, run.model
