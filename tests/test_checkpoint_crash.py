"""Saves that survive the process: a run killed (SIGKILL) at chosen points of a save, in a
subprocess, leaves every earlier save loadable and never a partial save that looks
complete; so do Ctrl-C and an exception in a rank; resuming from what is left, into the
same folder, ends where the run that never stopped ends."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from emulator import ConfigError, RankError, nn
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.parallel.checkpoint import Checkpoint, Checkpointing, durable
from emulator.parallel.mesh_hooks import MeshHooks
from emulator.training import synthetic_batches

ROOT = Path(__file__).resolve().parents[1]
STEPS = 3


def setup():
    model = nn.GPT(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_seq=8, dtype=np.float64)
    return model, model.init(np.random.default_rng(0)), synthetic_batches(STEPS, 8, 8, 16, seed=1)


def saving_run(folder, **kw):
    model, params, batches = setup()
    return run_on_mesh(model, params, batches, ParallelDims(dp=2), nn.AdamW(lr=1e-2),
                       checkpoint_dir=Checkpointing(folder, every=1), **kw)


def crash(folder, event, where):
    """In a subprocess: a saving run that kills itself (SIGKILL) when ``event`` happens to
    file ``where`` (``step_.../name``)."""
    code = f"""
import os, signal
from pathlib import Path
from emulator.parallel.checkpoint import durable
from tests.test_checkpoint_crash import saving_run

def hook(event, path):
    if event == {event!r} and f"{{path.parent.name}}/{{path.name}}" == {where!r}:
        os.kill(os.getpid(), signal.SIGKILL)

durable.on_write = hook
saving_run(Path({str(folder)!r}))
print("not killed")
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == -signal.SIGKILL, done.stdout + done.stderr


def uninterrupted():
    model, params, batches = setup()
    return run_on_mesh(model, params, batches, ParallelDims(dp=2), nn.AdamW(lr=1e-2))


def resume_and_compare(folder, full):
    """Go on from what is left, saving into the same folder: equal to the run that never stopped."""
    model, _, batches = setup()
    start = Checkpoint(folder).step
    resumed = run_on_mesh(model, None, batches[start:], ParallelDims(dp=2), nn.AdamW(lr=1e-2), resume_from=folder,
                          checkpoint_dir=Checkpointing(folder, every=1))
    assert resumed.start_step == start
    assert max(float(np.max(np.abs(resumed.params[k] - full.params[k]))) for k in full.params) < 1e-12
    assert [Checkpoint(folder / f"step_{s:08d}").step for s in range(1, STEPS + 1)] == [1, 2, 3]
    assert not list(folder.glob("*/*.tmp"))  # what the crash left was cleared when the step was saved again


KILLS = [  # (event, file, the latest save that must load afterwards)
    ("tmp written", "step_00000002/__0_0.npz", 1),  # the first shard of save 2, not renamed yet
    ("renamed", "step_00000002/__0_0.npz", 1),  # after one shard write of save 2
    ("tmp written", "step_00000002/__1_0.npz", 1),  # before the rename of its last shard
    ("tmp written", "step_00000002/.metadata", 1),  # every shard on disk, the manifest not renamed yet
    ("renamed", "step_00000002/.metadata", 2),  # just after: save 2 is complete
]


@pytest.mark.parametrize("event,where,complete", KILLS, ids=[f"{e}:{w}" for e, w, _ in KILLS])
def test_a_run_killed_mid_save_leaves_every_earlier_save_and_no_false_one(event, where, complete, tmp_path):
    crash(tmp_path, event, where)
    assert Checkpoint(tmp_path).step == complete
    assert Checkpoint(tmp_path / "step_00000001").step == 1
    if complete < 2:
        with pytest.raises(ConfigError, match=r"no complete checkpoint at .*step_00000002: it has no \.metadata "
                                              r"manifest: a save that did not finish.*step_00000001"):
            Checkpoint(tmp_path / "step_00000002")
    assert not (tmp_path / "step_00000003").exists()
    resume_and_compare(tmp_path, uninterrupted())


def test_a_run_killed_in_its_first_save_leaves_nothing_that_loads(tmp_path):
    crash(tmp_path, "tmp written", "step_00000001/.metadata")
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        Checkpoint(tmp_path)


def test_ctrl_c_during_a_save_keeps_the_saves_before_it(tmp_path):
    def hook(event, path):
        if event == "tmp written" and path.name == ".metadata" and path.parent.name == "step_00000003":
            raise KeyboardInterrupt

    durable.on_write = hook
    try:
        with pytest.raises((KeyboardInterrupt, RankError)):
            saving_run(tmp_path)
    finally:
        durable.on_write = None
    assert Checkpoint(tmp_path).step == 2 and (tmp_path / "step_00000003" / ".metadata.tmp").exists()
    resume_and_compare(tmp_path, uninterrupted())


def test_an_exception_in_a_rank_keeps_the_saves_made_before_it(tmp_path, monkeypatch):
    apply, calls = MeshHooks.apply, []

    def failing(self, *a, **kw):
        calls.append(1)
        if len(calls) == 5:  # rank 0's update in step 3 (each of the 2 ranks applies once per step)
            raise RuntimeError("a bug in step 3")
        return apply(self, *a, **kw)

    monkeypatch.setattr(MeshHooks, "apply", failing)
    with pytest.raises(RankError, match="a bug in step 3"):
        saving_run(tmp_path)
    monkeypatch.setattr(MeshHooks, "apply", apply)
    assert Checkpoint(tmp_path).step == 2 and Checkpoint(tmp_path / "step_00000001").step == 1
    resume_and_compare(tmp_path, uninterrupted())
