"""A run never deletes saves it did not make: a fresh run into a folder of saves is refused,
naming the folder and the ways on, and leaves them as they were; overwrite=True replaces
them; a resumed run saves into its folder after the save it resumed from, and is refused
where saves after that one are in its way."""

import numpy as np
import pytest

from emulator import ConfigError, nn
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.parallel.checkpoint import Checkpoint, Checkpointing
from emulator.training import synthetic_batches

D = ParallelDims


def setup(steps=4):
    model = nn.GPT(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_seq=8, dtype=np.float64)
    return model, model.init(np.random.default_rng(0)), synthetic_batches(steps, 8, 8, 16, seed=1)


def adam():
    return nn.AdamW(lr=1e-2)


def contents(folder):
    return {p.relative_to(folder): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_fresh_run_into_a_folder_of_saves_is_refused_and_the_saves_stay(tmp_path):
    model, params, batches = setup()
    run_on_mesh(model, params, batches, D(dp=2), adam(), checkpoint_dir=Checkpointing(tmp_path, every=2))
    before = contents(tmp_path)
    with pytest.raises(ConfigError) as info:
        run_on_mesh(model, params, batches[:1], D(tp=2), adam(), checkpoint_dir=tmp_path)
    text = str(info.value)
    for part in (f"checkpoint_dir {tmp_path} already holds saves that this run did not make (step_00000002, "
                 f"step_00000004)", f"resume_from='{tmp_path}'", "another folder",
                 f"Checkpointing('{tmp_path}', overwrite=True)"):
        assert part in text, f"{part!r} not in:\n{text}"
    assert contents(tmp_path) == before  # nothing deleted, nothing written
    assert Checkpoint(tmp_path).step == 4


def test_overwrite_true_replaces_the_saves_in_the_way(tmp_path):
    model, params, batches = setup()
    run_on_mesh(model, params, batches, D(dp=2), adam(), checkpoint_dir=Checkpointing(tmp_path, every=2))
    run = run_on_mesh(model, params, batches[:1], D(tp=2), adam(),
                      checkpoint_dir=Checkpointing(tmp_path, overwrite=True))
    assert run.checkpoints == [tmp_path / "step_00000001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001"]  # the saves at steps 2 and 4 are gone
    assert Checkpoint(tmp_path).step == 1


def test_a_resumed_run_goes_on_saving_into_its_folder_after_the_save_it_resumed_from(tmp_path):
    model, params, batches = setup()
    full = run_on_mesh(model, params, batches, D(dp=2), adam())
    run_on_mesh(model, params, batches[:2], D(dp=2), adam(), checkpoint_dir=Checkpointing(tmp_path, every=1))
    kept = contents(tmp_path)
    resumed = run_on_mesh(model, None, batches[2:], D(tp=2), adam(), resume_from=tmp_path,
                          checkpoint_dir=Checkpointing(tmp_path, every=1))
    assert resumed.checkpoints == [tmp_path / "step_00000003", tmp_path / "step_00000004"]
    assert {k: v for k, v in contents(tmp_path).items() if k in kept} == kept  # its own saves come after
    assert Checkpoint(tmp_path).step == 4
    assert max(float(np.max(np.abs(resumed.params[k] - full.params[k]))) for k in full.params) < 1e-12


def test_resuming_from_an_earlier_save_is_refused_where_later_ones_are_in_the_way(tmp_path):
    model, params, batches = setup()
    run_on_mesh(model, params, batches, D(dp=2), adam(), checkpoint_dir=Checkpointing(tmp_path, every=1))
    with pytest.raises(ConfigError) as info:
        run_on_mesh(model, None, batches[2:], D(dp=2), adam(), resume_from=tmp_path / "step_00000002",
                    checkpoint_dir=Checkpointing(tmp_path, every=1))
    text = str(info.value)
    assert f"checkpoint_dir {tmp_path} holds saves after step 2, the one this run resumes from: step_00000003, " \
           f"step_00000004" in text
    assert f"resume_from='{tmp_path}'" in text and "overwrite=True" in text and "another folder" in text
    assert Checkpoint(tmp_path).step == 4
    # overwrite=True deletes only the saves after the one it resumes from, then saves its own
    run = run_on_mesh(model, None, batches[2:3], D(dp=2), adam(), resume_from=tmp_path / "step_00000002",
                      checkpoint_dir=Checkpointing(tmp_path, every=1, overwrite=True))
    assert run.checkpoints == [tmp_path / "step_00000003"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000001", "step_00000002", "step_00000003"]


def test_resuming_into_another_folder_that_holds_saves_is_refused(tmp_path):
    model, params, batches = setup()
    run_on_mesh(model, params, batches[:2], D(dp=2), adam(), checkpoint_dir=tmp_path / "a")
    run_on_mesh(model, params, batches[:1], D(dp=2), adam(), checkpoint_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match=r"already holds saves that this run did not make \(step_00000001\).*"
                                          r"resumes from .*a/step_00000002, in another folder"):
        run_on_mesh(model, None, batches[2:], D(dp=2), adam(), resume_from=tmp_path / "a",
                    checkpoint_dir=tmp_path / "b")
    run = run_on_mesh(model, None, batches[2:3], D(dp=2), adam(), resume_from=tmp_path / "a",
                      checkpoint_dir=tmp_path / "c")  # an empty folder is fine
    assert run.checkpoints == [tmp_path / "c" / "step_00000003"]


def test_a_save_that_did_not_finish_is_not_in_the_way(tmp_path):
    model, params, batches = setup()
    run_on_mesh(model, params, batches[:2], D(dp=2), adam(), checkpoint_dir=Checkpointing(tmp_path, every=1))
    (tmp_path / "step_00000002" / ".metadata").unlink()  # as a crash before its manifest leaves it
    run = run_on_mesh(model, None, batches[1:2], D(dp=2), adam(), resume_from=tmp_path,
                      checkpoint_dir=Checkpointing(tmp_path, every=1))
    assert run.checkpoints == [tmp_path / "step_00000002"] and Checkpoint(tmp_path).step == 2


@pytest.mark.parametrize("make, match", [
    (lambda d: d / "file", "is a file; name a folder"),
    (lambda d: d / "saved" / "step_00000001", "is itself a checkpoint"),
])
def test_a_checkpoint_dir_that_is_not_a_folder_of_saves_is_refused(make, match, tmp_path):
    model, params, batches = setup(1)
    run_on_mesh(model, params, batches, D(), adam(), checkpoint_dir=tmp_path / "saved")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=match):
        run_on_mesh(model, params, batches, D(), adam(), checkpoint_dir=make(tmp_path))
    with pytest.raises(ConfigError, match="overwrite= is True"):
        Checkpointing(tmp_path, overwrite="yes")
