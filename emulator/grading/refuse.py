"""While a check runs a student's code, the library's own answer to the exercise refuses
to run: "this is the exercise: write it yourself".

``with refusing("Exercise 1.2", DDP, busbw): ...`` makes every call of those functions,
and every construction of those classes, raise :class:`Refused` until the block ends,
however the student reached them (``from emulator.cost import busbw`` included: the
function object itself is changed, then restored).
"""

from contextlib import contextmanager

from .common import CheckFailed


class Refused(CheckFailed):
    """The student's code called the library's solution of the exercise being checked."""


_current = {"what": None}


def _refuse(*args, **kwargs):
    raise __import__("emulator.grading.refuse", fromlist=["Refused"]).refusal()


def refusal():
    what = _current["what"]
    return Refused(f"{what}: your code called the library's own solution of this exercise; "
                   f"this is the exercise: write it yourself")


@contextmanager
def refusing(what, *targets):
    """Refuse ``targets`` (functions or classes) while the block runs."""
    saved = []
    previous = _current["what"]
    _current["what"] = what
    try:
        for t in targets:
            if isinstance(t, type):
                saved.append((t, "__init__", t.__dict__.get("__init__")))
                t.__init__ = _refuse
            else:
                saved.append((t, "__code__", t.__code__))
                t.__code__ = _refuse.__code__
        yield
    finally:
        for obj, attr, value in reversed(saved):
            if value is None:
                delattr(obj, attr)
            else:
                setattr(obj, attr, value)
        _current["what"] = previous
