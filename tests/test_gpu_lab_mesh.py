"""The mesh lab on the CPU with gloo, on 4 processes (dp 2 x tp 2) and 8 (pp 2 x dp 2 x
tp 2): it trains as one process does, its pipeline and data-parallel calls agree with the
emulator's run of the same plan, and it fails, naming the rank, when a parameter is wrong
or missing or a call is dropped."""

from collections import Counter

import pytest

from emulator.records import calls
from tests import _launch

pytestmark = pytest.mark.slow


def torchrun(n, *flags):
    return _launch.torchrun(n, "gpu_labs.06_mesh", *flags, timeout=900)


def forked(n, *flags):
    """The same ranks, forked from one process that imported torch once (:mod:`tests._launch`)."""
    return _launch.forked(n, "gpu_labs.06_mesh", *flags, timeout=900)


@pytest.mark.parametrize("n,pp", [(4, 1), (8, 2)])
def test_mesh_lab(n, pp, tmp_path):
    out = (torchrun if n == 4 else forked)(n, "--pp", str(pp), "--out", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    axes = "dp 2 x tp 2" if pp == 1 else "pp 2 x dp 2 x tp 2"
    assert f"# {n} ranks as {axes}" in out.stdout
    assert "every parameter equals single-process training after 2 steps" in out.stdout
    assert "OK: the mesh trains as one process does" in out.stdout
    recorded = calls.load(tmp_path / "06_mesh.calls.json")
    assert len(recorded) == n
    for per_rank in recorded:
        by = Counter((c.group, c.op) for c in per_rank)
        assert by[("dp", "reduce_scatter")] == 4 // pp + 1  # each FSDP2 unit once per step
        assert by[("tp", "all_gather")] > 0 and by[("tp", "reduce_scatter")] > 0  # sequence parallelism
        assert by[("pp", "send")] == (4 if pp > 1 else 0)  # 4 micro-batches, one direction per stage


@pytest.mark.parametrize("fault,message", [
    ("wrong-gradient", "parameters after 2 steps, against one process on rank 3: blocks."),
    ("drop-parameter", "parameters after 2 steps, against one process on rank 3: blocks."),
    ("drop-call", "the calls differ from the emulator's on rank 3: FSDP2 should reduce-scatter each of its 5 units"),
])
def test_mesh_lab_fails_when_a_piece_is_wrong_or_missing(fault, message, tmp_path):
    out = forked(4, "--self-test-fault", fault, "--out", str(tmp_path))
    assert out.returncode != 0
    failed = [line for line in out.stderr.splitlines() if line.startswith("FAILED on rank")]
    assert any(message in line for line in failed), failed or out.stderr[-3000:]
    assert "OK:" not in out.stdout


def test_a_dropped_pipeline_transfer_is_caught(tmp_path):
    out = forked(8, "--pp", "2", "--self-test-fault", "drop-call", "--out", str(tmp_path))
    assert out.returncode != 0
    assert "the pipeline's sends and receives are not the emulator's" in out.stderr


def test_sizes_that_do_not_divide_are_refused(tmp_path):
    out = forked(4, "--tp", "3", "--out", str(tmp_path))
    assert out.returncode != 0 and "TP must divide the 8 heads" in out.stderr
