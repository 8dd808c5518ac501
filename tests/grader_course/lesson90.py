"""The checks of the grader's test lesson (copied into a throwaway course's emulator/grading/)."""

from ..algorithms.global_view import ring_all_reduce
from .common import expect, passed
from .refuse import refusing


def check_double(fn):
    """Exercise 90.1: fn(x) == 2 x; the library's ring_all_reduce refuses while it runs."""
    for x in (0, 1, 7, -3):
        with refusing("Exercise 90.1", ring_all_reduce):
            got = fn(x)
        expect(got == 2 * x, f"Exercise 90.1: double({x}) returned {got!r}, expected {2 * x}")
    passed("Exercise 90.1", "doubles 0, 1, 7 and -3")


def check_triple(fn):
    """Exercise 90.2: fn(x) == 3 x."""
    for x in (0, 2, -5):
        got = fn(x)
        expect(got == 3 * x, f"Exercise 90.2: triple({x}) returned {got!r}, expected {3 * x}")
    passed("Exercise 90.2", "triples 0, 2 and -5")
