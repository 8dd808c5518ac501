"""Comparisons a lab's result must pass, with nothing left out.

A check that loops over what a run produced passes when the run produced nothing: a
dropped gradient, an empty output, a rank that recorded no calls. These functions
compare whole sets instead: every expected key must be there, with a value, of the
expected shape, within tolerance; an unexpected key is an error too; and comparing
nothing at all is a failure, never a pass.

:func:`differences` lists what is wrong as sentences (empty when all is well);
:func:`expect_match` calls ``common.fail`` with the first few of them;
:func:`expect_same_calls` does the same for two call traces, gathered from every rank.
"""

import numpy as np
import torch
import torch.distributed as dist

from .common import fail, fail_everywhere
from emulator.records.calls import Call, compare


def _array(v):
    if torch.is_tensor(v):
        return v.detach().to(torch.float64).cpu().numpy()
    return np.asarray(v, dtype=np.float64)


def error(got, want):
    """max|got - want| relative to the reference's largest magnitude (absolute below 1)."""
    g, w = _array(got), _array(want)
    if g.size == 0:
        return 0.0
    return float(np.abs(g - w).max()) / max(1.0, float(np.abs(w).max()))


def differences(got, want, tol):
    """What is wrong with ``got`` against ``want`` (dicts name -> tensor or array), as a
    list of sentences; empty when every expected entry is present, not None, of the
    right shape and within ``tol`` (:func:`error`), and nothing unexpected is there."""
    if not want:
        return ["nothing to compare: the reference is empty"]
    out = []
    for k in want:
        if k not in got:
            out.append(f"{k} is missing")
        elif got[k] is None:
            out.append(f"{k} is None (no value was produced)")
        elif tuple(np.shape(_array(got[k]))) != tuple(np.shape(_array(want[k]))):
            out.append(f"{k} has shape {tuple(np.shape(_array(got[k])))}, expected {tuple(np.shape(_array(want[k])))}")
        else:
            e = error(got[k], want[k])
            if not e <= tol:  # NaN fails too
                out.append(f"{k} differs by {e:.3g} (tolerance {tol:g})")
    out += [f"{k} was not expected" for k in got if k not in want]
    return out


def expect_match(what, got, want, tol, rank):
    """Fail naming ``what`` and ``rank`` unless :func:`differences` is empty; returns the
    largest error."""
    wrong = differences(got, want, tol)
    if wrong:
        more = f" (and {len(wrong) - 3} more)" if len(wrong) > 3 else ""
        fail(f"{what} on rank {rank}: " + "; ".join(wrong[:3]) + more)
    return max(error(got[k], want[k]) for k in want)


def gather_calls(rec):
    """Every rank's recorded calls, on every rank: a list indexed by rank."""
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, [c.as_list() for c in rec.calls])
    return [[Call(*c) for c in per_rank] for per_rank in every]


def calls_verdict(what, lab_calls, emulator_calls, how="call for call", names=("lab", "emulator")):
    """(problems, line to print) for a lab's calls (every rank's) against the emulator's
    (or another expected trace, ``names`` saying whose)."""
    total = sum(len(c) for c in emulator_calls)
    differ = compare(lab_calls, emulator_calls, names)
    if not differ and sum(len(c) for c in lab_calls) != total:
        differ = ["call counts differ"]
    if differ:
        whose = {"emulator": "the emulator's", "plan": "those its plan issues"}.get(names[1], f"the {names[1]}'s")
        return differ, f"{what}: the calls differ from {whose}: " + "; ".join(differ[:3])
    if total == 0:
        return [], f"{what}: no calls on either side ({len(lab_calls)} rank(s)): the comparison of calls is empty"
    whose = {"emulator": "the emulator's", "plan": "those its plan issues"}.get(names[1], f"the {names[1]}'s")
    return [], f"{what}: its {total} calls over {len(lab_calls)} ranks are {whose}, {how}"


def expect_same_calls(what, lab_calls, emulator_calls, how="call for call", names=("lab", "emulator")):
    """Compare a lab's calls (every rank's, as :func:`gather_calls` returns) with the
    emulator's for the same algorithm, on every rank; stop every rank if they differ.
    Returns a line to print: how many calls matched, or that there was nothing to
    compare (one rank, or an algorithm that needs no communication)."""
    differ, line = calls_verdict(what, lab_calls, emulator_calls, how, names)
    fail_everywhere(line, bool(differ))
    return line


def expect_same_calls_rank0(what, rec, emulator_calls, how="call for call"):
    """As :func:`expect_same_calls` when only rank 0 has run the emulator
    (``emulator_calls`` is None elsewhere): rank 0 judges and tells the others."""
    lab = gather_calls(rec)
    verdict = [calls_verdict(what, lab, emulator_calls, how) if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(verdict, src=0)
    differ, line = verdict[0]
    fail_everywhere(line, bool(differ))
    return line
