"""The GPU labs' options and what they report, run on gloo with CPU ranks: a tensor-parallel
size that does not divide is refused, ``--dtype bfloat16`` passes at its tolerance, one
rank says its comparisons are empty, each lab names its backend and device, and a stalled
rank ends the run at ``--timeout``. (The labs against the emulator: tests/test_gpu_labs.py.)"""

import pytest

from tests import _launch

pytestmark = pytest.mark.slow


def torchrun(n, lab, *flags):
    return _launch.torchrun(n, f"gpu_labs.{lab}", *flags)


def forked(n, lab, *flags):
    return _launch.forked(n, f"gpu_labs.{lab}", *flags)


def test_a_group_size_that_does_not_divide_is_refused(tmp_path):
    out = forked(4, "02_tensor_parallel", "--tp", "3", "--iters", "1", "--out", str(tmp_path))
    assert out.returncode != 0
    assert "4 ranks with --tp 3: TP must divide the block's 8 heads and the 4 ranks" in out.stderr


BF16 = [("01_data_parallel", ["--steps", "1"], "OK: every variant matches"),
        ("02_tensor_parallel", ["--iters", "1"], "OK: the hand-written TP and SP blocks"),
        ("03_pipeline", ["--steps", "1"], "OK: 1F1B by hand"),
        ("04_context_parallel", ["--iters", "1"], "OK: ring attention"),
        ("05_expert_parallel", ["--iters", "1"], "OK: the expert-parallel layer")]


@pytest.mark.parametrize("lab,flags,ok", BF16, ids=[b[0][:2] for b in BF16])
def test_bfloat16(lab, flags, ok, tmp_path):
    out = forked(2, lab, "--dtype", "bfloat16", "--out", str(tmp_path), *flags)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "torch.bfloat16" in out.stdout and "tolerance 0.05 (relative" in out.stdout and ok in out.stdout


def test_one_rank_says_the_comparisons_are_empty(tmp_path):
    out = torchrun(1, "04_context_parallel", "--iters", "1", "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.count("no calls on either side (1 rank(s)): the comparison of calls is empty") == 4
    assert "one rank: nothing travels, so there is no overlap to measure" in out.stdout
    assert "100%" not in out.stdout


def test_the_labs_say_which_backend_and_device_ran(tmp_path):
    out = torchrun(2, "00_collectives", "--sizes", "1e3", "--iters", "1", "--out", str(tmp_path))
    assert "backend gloo (--backend gloo), device CPU" in out.stdout
    assert "torch's context_parallel: not run: it needs CUDA" in torchrun(
        2, "04_context_parallel", "--iters", "1", "--out", str(tmp_path)).stdout


def test_a_stalled_rank_ends_the_run_after_the_timeout(tmp_path):
    """The labs pass --timeout to init_process_group: the ranks waiting for a rank that
    never comes give up after it (gloo here; NCCL's watchdog does the same, see
    gpu_labs/README.md), instead of torch's default 30 minutes (10 for NCCL)."""
    import time

    start = time.monotonic()
    out = torchrun(2, "00_collectives", "--sizes", "1e3", "--iters", "1", "--timeout", "5",
                   "--self-test-fault", "stall", "--out", str(tmp_path))
    assert out.returncode != 0
    assert "Timed out" in out.stderr or "timed out" in out.stderr, out.stderr[-2000:]
    assert time.monotonic() - start < 5 * 10, "the run outlived its timeout by far"
