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


@pytest.fixture
def torch_float64():
    """torch's default dtype float64 for one test, restored after it, so that a module which
    compares against torch in float64 leaves the next test on the same worker at torch's own
    default (``pytestmark = pytest.mark.usefixtures("torch_float64")``)."""
    import torch

    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)
