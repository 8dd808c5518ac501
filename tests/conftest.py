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


# The files that take longest, longest first (seconds of a fresh clone's `make test` on two
# workers, read from its --durations=0 report: 440, 350, 340, 180, 140, 100, 80, 55, 36, 36,
# 34, 33). A file missing here only starts later; the order changes no result.
LONGEST_FIRST = ["tests/test_gpu_labs.py", "tests/test_notebooks.py", "tests/browser/test_jupyterlab.py",
                 "tests/test_instructor_tools.py", "tests/test_gpu_lab_mesh.py", "tests/test_gpu_lab_checkpoint.py",
                 "tests/test_grader_sandbox.py", "tests/test_pipeline.py", "tests/test_planner_search_brute_force.py",
                 "tests/test_torch_parallel.py", "tests/test_mesh.py", "tests/test_grading_lesson06_memory_and_bytes.py"]


def pytest_collection_modifyitems(config, items):
    """The longest files first, then the other files with slow tests, then the rest, each
    file's tests together and in their order. ``make test`` hands out whole files
    (``--dist loadfile --no-loadscope-reorder``: a module's fixtures set up once), so the
    workers start on the long files and end on short ones, side by side."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    slow = {item.path for item in items if item.get_closest_marker("slow")}

    def key(item):
        rel = item.path.relative_to(config.rootpath).as_posix()
        return rank.get(rel, len(rank) + (item.path not in slow))

    items[:] = sorted(items, key=key)
