"""GPU lab 07 on the CPU with gloo: sharded checkpoints with torch.distributed.checkpoint on 2
and 4 processes, a save on 4 loaded on 2, a rank killed mid-step that torchrun's elastic
agent restarts from the last checkpoint, each ending equal to a single-process run; a bad
restart and a missing setting are caught."""

import re

import pytest

from tests import _launch

LAB = "gpu_labs.07_checkpoint"  # run as torchrun -m runs it, from the course's folder
pytestmark = pytest.mark.slow


def torchrun(n, *flags, restarts=0, share_store=False):
    """Under torchrun: its elastic agent restarts the ranks (``restarts``); the lab's kill
    needs the agent's store unshared."""
    env = _launch.lab_env() if share_store else _launch.lab_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    return _launch.torchrun(n, LAB, *flags, max_restarts=restarts, env=env)


def forked(n, *flags):
    """The same ranks, forked from one process that imported torch once (:mod:`tests._launch`)."""
    return _launch.forked(n, LAB, *flags)


def ok_line(out):
    found = re.search(r"OK: after (\d+) steps \(started at step (\d+), attempt (\d+)\)", out.stdout)
    assert out.returncode == 0 and found, out.stdout[-2000:] + out.stderr[-3000:]
    return tuple(int(g) for g in found.groups())


@pytest.mark.parametrize("n", [2, 4])
def test_save_every_two_steps_and_end_equal_to_one_process(n, tmp_path):
    out = forked(n, "--fresh", "--steps", "6", "--ckpt-dir", str(tmp_path))
    assert ok_line(out) == (6, 0, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000002", "step_00000004", "step_00000006"]
    assert all((p / ".metadata").exists() and len(list(p.glob("*.distcp"))) == n for p in tmp_path.iterdir())
    assert out.stdout.count("saved 453,732 bytes") == 3  # parameters, two moments, the training state


def test_saved_on_four_ranks_resumed_on_two(tmp_path):
    first = forked(4, "--fresh", "--steps", "6", "--stop-after", "3", "--ckpt-dir", str(tmp_path))
    assert first.returncode == 0 and "stopped after step 3" in first.stdout, first.stderr[-3000:]
    second = forked(2, "--steps", "6", "--ckpt-dir", str(tmp_path))
    assert "resumed from step_00000003: step 3, saved by 4 ranks, loaded on 2" in second.stdout, second.stdout
    assert "DCP's planner and emulator.parallel.reshard agree on all" in second.stdout
    assert ok_line(second) == (6, 3, 0)


def test_a_rank_killed_mid_step_restarts_from_the_last_checkpoint(tmp_path):
    out = torchrun(2, "--fresh", "--steps", "6", "--kill-rank", "1", "--kill-step", "3", "--ckpt-dir", str(tmp_path),
                   restarts=1)
    assert "rank 1: killing itself in the middle of step 3" in out.stdout
    assert "attempt 1" in out.stdout and "resumed from step_00000002: step 2, saved by 2 ranks" in out.stdout
    assert ok_line(out) == (6, 2, 1)


def test_a_bad_restart_and_a_missing_setting_fail_loudly(tmp_path):
    forked(2, "--fresh", "--steps", "4", "--stop-after", "2", "--ckpt-dir", str(tmp_path))
    bad = forked(2, "--steps", "4", "--ckpt-dir", str(tmp_path), "--self-test-fault")
    assert bad.returncode != 0 and "differ from the single-process run" in bad.stderr, bad.stderr[-2000:]
    refused = torchrun(2, "--steps", "4", "--kill-rank", "1", "--kill-step", "3", "--ckpt-dir", str(tmp_path),
                       share_store=True)
    assert refused.returncode != 0 and "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in refused.stderr
