"""Memory as lesson 04's checks measure it: the peak Python's allocator holds while a
program runs (``tracemalloc``, NumPy's arrays included), and no torch inside a check (its
kernels allocate outside that allocator, where the measure would not see them)."""

import sys
import tracemalloc
from contextlib import contextmanager

from .common import CheckFailed


def torch_name(event, frame, arg):
    """The torch function a profiler event enters, or None."""
    if event == "call":
        name = frame.f_globals.get("__name__", "")
        return f"{name}.{frame.f_code.co_name}" if name.split(".")[0] == "torch" else None
    if event == "c_call":
        owner = getattr(arg, "__module__", None) or getattr(getattr(arg, "__objclass__", None), "__module__", None)
        self_ = getattr(arg, "__self__", None)
        if owner is None and isinstance(self_, type(sys)):
            owner = self_.__name__
        if owner and owner.split(".")[0] == "torch":
            return f"{owner}.{getattr(arg, '__name__', '?')}"
    return None


@contextmanager
def without_torch(what):
    """Fail the check if the code run inside calls into torch: its kernels allocate outside
    Python's allocator, so the memory measured here would not see them."""
    seen = []

    def profile(frame, event, arg):
        if not seen:
            name = torch_name(event, frame, arg)
            if name:
                seen.append(name)

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)
        if seen:
            raise CheckFailed(f"{what}: your code called {seen[0]}; write the exercise in NumPy (torch's kernels are "
                              f"not the exercise, and their memory is invisible to this check)")


def traced_peak(run):
    """Peak bytes Python's allocator (NumPy arrays included) holds while ``run()`` runs."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        result = run()
        return result, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
