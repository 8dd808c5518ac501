"""Shared helpers of the checks."""

from numbers import Integral

import numpy as np

from ..errors import RankError
from .check_failed import CheckFailed
from .progress import PASSED, record

def passed(name, detail):
    """The check's last word when all went well: ``PASSED Exercise 1.2: ...``."""
    record(name, PASSED, detail)
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


def _number(x, digits=4):
    """``x`` as it reads: an integer in full (``220``), anything else to ``digits``
    significant digits (all of them where it was compared exactly)."""
    if isinstance(x, Integral) or float(x).is_integer() and abs(x) < 1e6:
        return f"{int(x):d}"
    return f"{float(x):.{digits}g}"


def tolerance(rel):
    """``rel`` as a student reads it: ``2%``, ``0.1%``, ``1e-06``."""
    return f"{rel:.0%}" if rel >= 0.01 else f"{rel:.1%}" if rel >= 0.001 else f"{rel:.0e} (relative)"


def check_close(name, got, want, rel=0.02, unit="", quiet=False):
    """A napkin answer against the model's value ``want``. An integer ``want`` (a count:
    micro-batches, steps, GPUs) is compared exactly; anything else within ``rel``
    (relative), or exactly when ``rel`` is 0. The message says what was expected and
    what came, ``expected 220, got 219``."""
    try:
        ok = np.isfinite(float(got))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise CheckFailed(f"{name}: got {got!r}, expected a number")
    if isinstance(want, Integral) and not isinstance(want, bool):
        expect(got == want, f"{name}: expected {want:d}, got {_number(got, 12)}{unit} (a whole number, compared "
                            f"exactly)")
    elif rel == 0:
        expect(got == want, f"{name}: expected {_number(want, 12)}, got {_number(got, 12)}{unit} (compared exactly)")
    else:
        expect(abs(got - want) <= rel * abs(want),
               f"{name}: expected {_number(want)}{unit}, got {_number(got)}{unit} (the check allows "
               f"{tolerance(rel)}); recheck the formula and the units")
    if not quiet:
        passed(name, f"{got:.4g}{unit} (model: {want:.4g}{unit})")


def one_handle_hint(exc):
    """For a rank's IndexError or unpacking error on a line that waits on, or unpacks,
    what ``batch_isend_irecv`` returned: the reminder that it is one handle per batch."""
    original = getattr(exc, "original", None)
    if not (isinstance(original, IndexError) or (isinstance(original, ValueError) and "unpack" in str(original))):
        return ""
    lines = [ln.strip() for ln in getattr(exc, "rank_traceback", "").splitlines()
             if ln.startswith("    ") and ln.strip(" ^~")]  # the source lines, not their markers
    if not lines or not ("wait(" in lines[-1] or "batch_isend_irecv" in lines[-1]):
        return ""
    return ("\nbatch_isend_irecv returns a list holding one handle for the whole batch, as torch does on NCCL "
            "(torch returns its coalescing manager's works: one Work): wait on that one, and read what arrived "
            "from the buffers you passed to P2POp(comm.irecv, buffer, peer).")


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
        raise CheckFailed(f"{what}: the program failed on the emulator:\n{exc}{one_handle_hint(exc)}") from None
    except Exception as exc:  # noqa: BLE001 -- deadlock, mismatch, ...: the emulator's own message
        raise CheckFailed(f"{what}: the program failed on the emulator:\n{exc}") from None
