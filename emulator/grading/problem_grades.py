"""How an answer file's answer is compared with the model's: ``grade(numbers, answer, want)
-> (right?, what is wrong)``. Numbers within :data:`TOLERANCE`, counts exactly; a problem
whose answer has another shape (Problem 8.1's dict), or that accepts a second model
(Napkin 7.2) or an absolute slack (Napkin 5.2), has a grader of its own."""

from ..accounting.failures import goodput_daly

TOLERANCE = 0.02


def close(got, want):
    """``got`` is a number within :data:`TOLERANCE` of ``want``."""
    try:
        return abs(float(got) - want) <= TOLERANCE * abs(want)
    except (TypeError, ValueError):
        return False


def grade_close(numbers, answer, want):
    """A number within the tolerance, or a list of them (an integer of the model's answer,
    a count, compared exactly)."""
    if isinstance(want, list):
        if not (isinstance(answer, (list, tuple)) and len(answer) == len(want)):
            return False, f"expected {len(want)} numbers"
        bad = [i for i, (g, w) in enumerate(zip(answer, want))
               if not (g == w if isinstance(w, int) else close(g, w))]
        if not bad:
            return True, ""
        exact = isinstance(want[bad[0]], int)
        return False, f"answer {bad[0] + 1} is {'not the exact count' if exact else f'off by more than {TOLERANCE:.0%}'}"
    return (close(answer, want), "" if close(answer, want) else f"{answer} is off by more than {TOLERANCE:.0%}")


def grade_zero_stages(numbers, answer, want):
    """Problem 8.1: three numbers per ZeRO stage, and the stages that fit."""
    if not isinstance(answer, dict):
        return False, "expected a dict {stage: [params, grads, optimizer], 'fits': [...]}"
    for z in range(4):
        got = answer.get(str(z), answer.get(z))
        if not (isinstance(got, (list, tuple)) and len(got) == 3):
            return False, f"stage {z}: expected three numbers"
        for what, g, w in zip(("params", "grads", "optimizer"), got, want[str(z)]):
            if not close(g, w):
                return False, f"stage {z} {what}: {g} GB is off by more than {TOLERANCE:.0%}"
    if sorted(answer.get("fits", [])) != want["fits"]:
        return False, f"the stages that fit are not {sorted(answer.get('fits', []))}"
    return True, ""


def grade_goodput(numbers, answer, want):
    """Napkin 7.2: the goodput to first order, or Daly's exact expectation."""
    ok = close(answer, want) or close(answer, goodput_daly(**numbers))
    return ok, "" if ok else f"{answer} is off by more than {TOLERANCE:.0%} (to first order: {want:.4f})"


def grade_drops(numbers, answer, want):
    """Napkin 5.2: a count that may be 0, within one assignment."""
    try:
        ok = abs(float(answer) - want) <= max(1.0, TOLERANCE * want)
    except (TypeError, ValueError):
        ok = False
    return ok, "" if ok else f"{answer} is not {want:g} (within one assignment)"
