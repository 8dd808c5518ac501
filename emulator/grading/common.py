"""Shared helpers of the checks."""

import numpy as np

from ..errors import RankError


class CheckFailed(AssertionError):
    """The exercise's answer is wrong; the message says how."""


def passed(name, detail):
    print(f"PASSED {name}: {detail}")


def expect(condition, message):
    if not condition:
        raise CheckFailed(message)


def compare_arrays(what, got, want, rtol=1e-9, atol=1e-9):
    got = np.asarray(got)
    want = np.asarray(want)
    expect(got.shape == want.shape, f"{what}: shape {got.shape}, expected {want.shape}")
    bad = ~np.isclose(got, want, rtol=rtol, atol=atol)
    if bad.any():
        err = np.max(np.abs(got - want))
        raise CheckFailed(f"{what}: {int(bad.sum())} of {bad.size} values differ from the reference "
                          f"(largest error {err:.3g})")


def check_close(name, got, want, rel=0.02, unit="", quiet=False):
    """A napkin answer: within ``rel`` (relative) of the model's value."""
    try:
        ok = np.isfinite(float(got))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise CheckFailed(f"{name}: got {got!r}, expected a number")
    expect(abs(got - want) <= rel * abs(want),
           f"{name}: {got:.4g}{unit} is off by more than {rel:.0%}; recheck the formula and the units")
    if not quiet:
        passed(name, f"{got:.4g}{unit} (model: {want:.4g}{unit})")


def run_on_emulator(world, prog, what):
    """``world.run(prog)`` for a check: an exercise not done yet surfaces as its own
    NotImplementedError; any other failure becomes a CheckFailed quoting the emulator."""
    try:
        return world.run(prog)
    except CheckFailed:
        raise
    except RankError as exc:
        if isinstance(exc.original, NotImplementedError):
            raise exc.original from None
        raise CheckFailed(f"{what}: the program failed on the emulator:\n{exc}") from None
    except Exception as exc:  # noqa: BLE001 -- deadlock, mismatch, ...: the emulator's own message
        raise CheckFailed(f"{what}: the program failed on the emulator:\n{exc}") from None
