"""The exhaustive search's memory bound never exceeds the peak ``evaluate`` finds, over every
setting of small clusters (and the check catches a bound that does)."""

import pytest

from emulator.planner import bounds, exhaustive
from emulator.planner.layers import rank_layers
from emulator.planner.precision_of import plan_context
from tests.test_planner_search_brute_force import CASES, case, every_setting


def _pairs(name, step=3):
    """(memory bound, the worst rank's peak) for every ``step``-th setting of a case."""
    model, seq, batch, cluster, stack = case(name)
    model, ctx, parts = model.with_seq(seq), plan_context(stack), {}
    out = []
    for i, d in enumerate(every_setting(model, cluster.gpus, batch, stack)):
        if i % step or exhaustive.structural_problems(model, cluster, d, seq, batch * seq):
            continue  # every step-th setting that can be built
        base = (d.dp, d.tp, d.pp, d.cp, d.ep)
        part = parts.setdefault(base, bounds.Factorisation(model, cluster, base, ctx))
        b = batch // (d.dp * d.micro_batches)
        kinds = rank_layers(model, d.replace(sequence_parallel=d.tp > 1), b, seq, ctx, bounds.KINDS)
        bound = bounds.memory_bound(part, kinds, d.zero_stage, d.schedule, d.v, d.micro_batches, d.recompute == "full")
        out.append((d, bound, exhaustive._peak(model, d, seq, batch, ctx)))
    return out


def _violations(pairs):
    return [(str(d), bound, peak) for d, bound, peak in pairs if bound > peak * (1 + 1e-12)]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_memory_bound_is_never_above_the_peak(name):
    pairs = _pairs(name)
    assert len(pairs) > 100 and not _violations(pairs)
    # the gradients' moment binds somewhere: the bound is not merely the first backward's
    assert any(bound == pytest.approx(peak, rel=0.05) for _, bound, peak in pairs)


def test_the_check_fails_on_a_bound_that_counts_the_gradients_twice(monkeypatch):
    real = bounds.Factorisation._held

    def doubled(self, kinds, z):
        static, with_grads = real(self, kinds, z)
        return static, [2 * w - s for s, w in zip(static, with_grads)]

    monkeypatch.setattr(bounds.Factorisation, "_held", doubled)
    assert _violations(_pairs("pipeline"))
