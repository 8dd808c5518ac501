import os
import time

import pytest

# One BLAS thread for the tests and the notebook kernels they start (see the Makefile).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture
def within():
    """``with within(1.0): ...`` fails the test if the block takes longer (a hang would be
    cut by pytest-timeout, so a slow failure still fails)."""

    class _Within:
        def __init__(self, seconds):
            self.seconds = seconds

        def __enter__(self):
            self.t0 = time.perf_counter()

        def __exit__(self, *exc):
            took = time.perf_counter() - self.t0
            assert took < self.seconds, f"took {took:.2f}s, more than {self.seconds}s"
            return False

    return _Within
