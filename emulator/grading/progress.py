"""Where a student stands: every check reports its outcome here, and the summary at the
end of a lesson lists each exercise as passed, failed or not attempted.

A check ends in one of three ways, and says so in one line that begins with its label
(``Exercise 3.1``, ``Napkin 0.2``, ``Problem 8.1``), so that a person finds it at once:

* ``PASSED Exercise 3.1: ...``: printed by the check (:func:`.common.passed`);
* ``NOT ATTEMPTED Exercise 3.1: ...``: the exercise's stub still raises
  ``NotImplementedError("Exercise 3.1: ...")``; the check says so and returns, so that
  Run All goes on to the demos below;
* ``CheckFailed: Exercise 3.1: ...``: raised at the check, the message first and
  nothing of the grading code in between (see :class:`.check_failed.CheckFailed`).

Returning on an exercise not attempted is what a lesson wants, not a script or a test:
:func:`in_lesson` turns it on (``emulator.notebook.setup()`` calls it); elsewhere the
``NotImplementedError`` goes on up, as any exception does. The unfinished lesson still
fails where it must: :func:`summary` raises unless every exercise passed.

The checks of the lesson modules (``emulator.grading.lessonNN``) are wrapped by
:func:`watch` when the package is imported, so a module of checks needs nothing of this:
a check is a public function whose code names its exercise (``what = "Exercise 3.1"``,
``passed("Napkin 0.2", ...)``), and :func:`label_of` reads that name.

A grader does not read what a notebook prints: it hands :func:`report_to` a witness that
the wrapper tells when each check starts and how it ended (``tools/grader/kernel.py``).
"""

import re
import types
from functools import wraps

from .check_failed import CheckFailed

LABEL = re.compile(r"(?:Exercise|Napkin|Problem) \d+\.\d+")
PASSED, FAILED, NOT_ATTEMPTED, NOT_CHECKED = "passed", "failed", "not attempted", "not checked"

_outcomes = {}  # label -> (status, detail): the latest outcome of each exercise's check
_state = {"in_lesson": False, "depth": 0}
_witness = None  # a grader's, told how each check ended (report_to)
STOPPED = "stopped"  # the check was stopped from outside (an interrupt, SystemExit), the witness is told


class NotAllPassed(CheckFailed):
    """The lesson's summary: some exercise has not passed (yet)."""


def in_lesson(on=True):
    """Checks of exercises not yet attempted say so and return (a lesson's Run All goes
    on); with ``on=False`` their ``NotImplementedError`` propagates."""
    _state["in_lesson"] = on


def label_in(text):
    """The exercise label that ``text`` begins with (``"Exercise 3.1"``), or None."""
    m = LABEL.match(str(text))
    return m.group(0) if m else None


def report_to(witness):
    """Tell ``witness(event, label, status="", detail="")`` when each check starts
    (``"start"``) and how it ended (``"end"``, with passed, failed, not attempted or stopped,
    and the check's message). Checks called by a check are not reported apart."""
    global _witness
    _witness = witness


def record(label, status, detail=""):
    _outcomes[label] = (status, detail)


def outcomes():
    """``{label: (status, detail)}``: the latest outcome of every check run so far."""
    return dict(_outcomes)


def forget():
    """Forget every outcome (a fresh kernel starts this way)."""
    _outcomes.clear()


def _constants(code):
    """The constants of a code object and of the functions defined inside it, in order."""
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _constants(c)
        else:
            yield c


def label_of(fn):
    """The exercise a check grades: the first label its code begins a string with
    (``what = "Exercise 3.1"``, ``passed("Problem 8.2", ...)``, a docstring such as
    ``"Exercise 3.1: fn(p, m) -> ..."``); None for a function that names no exercise."""
    for c in _constants(fn.__code__):
        if isinstance(c, str):
            label = label_in(c)
            if label and (len(c) == len(label) or c[len(label)] in ":,( "):
                return label
    return None


def _first_line(text):
    return next((line for line in str(text).splitlines() if line.strip()), "")


def _not_attempted(label, exc):
    """A stub raised: this exercise, or one it builds on, is not done yet."""
    stub = str(exc)
    if label_in(stub) == label:
        line = f"{stub}. Replace `raise NotImplementedError` in the cell above with your answer, run that " \
               f"cell, then this check again."
    else:
        line = f"{label} builds on {stub}, not attempted yet: answer that one first, then run this check again."
    record(label, NOT_ATTEMPTED, _first_line(line))
    if not _state["in_lesson"]:
        return False
    print(f"NOT ATTEMPTED {line}")
    return True


def _failed(label, exc):
    """The CheckFailed to raise for ``exc``, whose message begins with ``label``."""
    if isinstance(exc, CheckFailed):
        message = str(exc)
        failure = exc if label_in(message) == label else type(exc)(f"{label}: {message}")
    else:
        failure = CheckFailed(f"{label}: the check stopped on {type(exc).__name__}: {exc}")
    record(label, FAILED, _first_line(failure))
    return failure


def check(fn, label):
    """``fn``, reporting its outcome as ``label``'s: passed (the check prints it), not
    attempted (a stub raised NotImplementedError), or failed (a CheckFailed whose message
    begins with the label; any other exception becomes one, its own traceback kept)."""

    @wraps(fn)
    def checked(*args, **kwargs):
        if _state["depth"]:  # a check called by another check: the outer one reports
            return fn(*args, **kwargs)
        _state["depth"] += 1
        witness = _witness
        if witness is not None:
            witness("start", label)
        ended = (FAILED, "")
        try:
            result = fn(*args, **kwargs)
            status, detail = _outcomes.get(label, (PASSED, ""))
            ended = (PASSED, detail if status == PASSED else "")
            return result
        except NotImplementedError as exc:
            if label_in(exc) is None:  # not a stub: an error like any other
                failure = _failed(label, exc)
                ended = (FAILED, _first_line(failure))
                raise failure from exc
            attempted = _not_attempted(label, exc)
            ended = (NOT_ATTEMPTED, _outcomes[label][1])
            if attempted:
                return None
            raise
        except CheckFailed as exc:
            failure = _failed(label, exc)
            ended = (FAILED, _first_line(failure))
            if failure is exc:
                raise
            raise failure from None
        except Exception as exc:  # noqa: BLE001 -- reported as the exercise's failure, traceback kept
            failure = _failed(label, exc)
            ended = (FAILED, _first_line(failure))
            raise failure from exc
        except BaseException as exc:  # an interrupt (a cell's time ran out), SystemExit
            ended = (STOPPED, type(exc).__name__)
            raise
        finally:
            _state["depth"] -= 1
            if witness is not None:
                witness("end", label, *ended)

    checked.exercise = label
    return checked


def watch(module):
    """Wrap, in place, every check that ``module`` defines (public functions that name
    their exercise): afterwards ``module.check_x(...)`` reports to this registry."""
    for name, fn in list(vars(module).items()):
        if (isinstance(fn, types.FunctionType) and not name.startswith("_") and fn.__module__ == module.__name__
                and not hasattr(fn, "exercise")):
            label = label_of(fn)
            if label:
                setattr(module, name, check(fn, label))
    return module


def status_line(status, name, detail=""):
    """One line of a summary: ``passed         Exercise 3.1: 1F1B as data``."""
    line = f"{status:<14s} {name}"
    return f"{line}: {detail}" if detail else line


def _detail(label, detail):
    """A failure's message without the label it repeats."""
    return detail[len(label):].lstrip(":, ") if detail.startswith(label) else detail


def summary(*names):
    """Print one line per exercise of the lesson (``names``: ``"Exercise 3.1: 1F1B as
    data"``, ...): passed, failed (with the check's message), not attempted, or not
    checked (its check has not run in this kernel). Raise :class:`NotAllPassed` unless
    every one passed, so an unfinished lesson fails a grader that runs it."""
    if not names:
        raise ValueError("summary() needs the lesson's exercises, e.g. summary('Exercise 3.1: 1F1B as data')")
    rows = []
    for name in names:
        label = label_in(name)
        if label is None:
            raise ValueError(f"summary(): {name!r} does not begin with an exercise label such as 'Exercise 3.1'")
        status, detail = _outcomes.get(label, (NOT_CHECKED, "run its check cell"))
        rows.append((name, status, _detail(label, detail) if status in (FAILED, NOT_CHECKED) else ""))
    done = sum(status == PASSED for _, status, _ in rows)
    print(f"{done} of {len(rows)} exercises passed")
    for name, status, detail in rows:
        print(status_line(status, name, detail))
    if done < len(rows):
        missing = [label_in(name) for name, status, _ in rows if status != PASSED]
        raise NotAllPassed(f"{done} of {len(rows)} exercises passed; still to do: {', '.join(missing)}")

