"""Lesson 03's napkins as the checks ask them: called with the problem's own numbers and
with others, counts compared exactly and fractions to 1e-6, the likely mistake named
(rounding down, the other definition of the bubble, memory that 1F1B does not need)."""

import math

from ..accounting import pipeline as formulas
from .common import CheckFailed, expect
from .refuse import refusing

FORMULAS = (formulas.micro_batches_for_bubble, formulas.pipeline_bubble, formulas.bubble_micro_batches,
            formulas.memory_vs_bubble)


def napkin(name, fn, cases, model, labels, hint):
    """A napkin answer called with the problem's own numbers (its defaults) and with the
    other ``cases``; counts compared exactly, fractions to 1e-6. ``hint(case, i, got)``
    names the likely mistake when number ``i`` is wrong. Returns the model's first answer."""
    for k, case in enumerate(cases):
        with refusing(name, *FORMULAS):
            got = fn() if k == 0 else fn(**case)
        want = model(**case)
        expect(isinstance(got, tuple) and len(got) == len(want), f"{name}: return {len(want)} numbers: "
                                                                 f"{', '.join(labels)}")
        args = ", ".join(f"{key}={v:g}" for key, v in case.items())
        for i, (label, g, w) in enumerate(zip(labels, got, want)):
            try:
                g = float(g)
            except (TypeError, ValueError):
                raise CheckFailed(f"{name} ({label}, {args}): expected a number, got {g!r}") from None
            if g == w if isinstance(w, int) else abs(g - w) <= 1e-6 * abs(w):
                continue
            shown = (f"{w}", f"{g:g}") if isinstance(w, int) else (f"{w:.4g}", f"{g:.4g}")
            raise CheckFailed(f"{name} ({label}, {args}): expected {shown[0]}, got {shown[1]}{hint(case, i, got)}")
    return model(**cases[0])


PROBLEM_8_2_CASES = [dict(p=12, target=0.05, seqs_per_micro=4), dict(p=8, target=0.03, seqs_per_micro=2),
                     dict(p=10, target=0.07, seqs_per_micro=4), dict(p=16, target=0.02, seqs_per_micro=1),
                     dict(p=24, target=0.08, seqs_per_micro=8)]


def rounding_hint(case, i, got):
    p, target = case["p"], case["target"]
    ideal, total = (formulas.micro_batches_for_bubble(p, target, of=of) for of in ("ideal", "total"))
    if i in (0, 2) and ideal != total and float(got[i]) == (total if i == 0 else ideal):
        return (": that is the count for the bubble as a share of the whole step; this number asks for it over "
                "the ideal time" if i == 0 else ": that is the count for the bubble over the ideal time; this "
                "number asks for the idle share of the whole step")
    bound = {0: (p - 1) / target, 2: (p - 1) * (1 - target) / target}.get(i)
    if bound is None or float(bound).is_integer():
        return ""
    if float(got[i]) == math.floor(bound):
        return (f": m must reach {bound:.4g}; {math.floor(bound)} micro-batches leave the bubble above the target, "
                f"so round up")
    if abs(float(got[i]) - bound) < 1e-6:
        return f": a number of micro-batches is whole; round {bound:.4g} up"
    return ""


NAPKIN_3_1_CASES = [dict(p=8, per_micro_batch=2e9, budget=40e9, max_m=256),
                    dict(p=4, per_micro_batch=3e9, budget=30e9, max_m=64),
                    dict(p=16, per_micro_batch=2e9, budget=24e9, max_m=256),  # p micro-batches do not fit
                    dict(p=4, per_micro_batch=1e9, budget=80e9, max_m=32),  # the batch caps GPipe before memory
                    dict(p=6, per_micro_batch=5e9, budget=52e9, max_m=128)]


def memory_hint(case, i, got):
    p, per, budget, max_m = case["p"], case["per_micro_batch"], case["budget"], case["max_m"]
    fits = int(budget // per)
    if i == 0 and float(got[0]) == fits > max_m:
        return f": the memory holds {fits}, but the batch has only {max_m} micro-batches"
    if i == 2 and float(got[2]) == max_m and p * per > budget:
        return (f": 1F1B's first stage holds min(p, m) micro-batches, and {p} of them ({p * per:.3g} bytes) do not "
                f"fit in {budget:.3g}; with fewer than p in flight it can run only as many as GPipe")
    if i == 2 and float(got[2]) == fits and p * per <= budget:
        return ": 1F1B's first stage holds at most p micro-batches whatever m, so m is limited by the batch only"
    return ""
