"""Loading verifies what it loads: an altered shard, a shard copied from another step, a
missing one, a damaged manifest are refused, naming the file and what to do. Resuming with
another learning rate, model setting or precision is refused unless allow_changes names
the change; another shape is refused always."""

import json
import shutil

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import ConfigError, nn
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.parallel.checkpoint import Checkpoint, Checkpointing
from emulator.training import synthetic_batches

D = ParallelDims
CONFIG = dict(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_seq=8)


def gpt(dtype=np.float64, **kw):
    return nn.GPT(**{**CONFIG, **kw}, dtype=dtype)


@pytest.fixture
def saved(tmp_path):
    """Three saves (steps 1, 2, 3) of a run on DP 2 with AdamW(lr=1e-2)."""
    model = gpt()
    params = model.init(np.random.default_rng(0))
    run_on_mesh(model, params, synthetic_batches(3, 8, 8, 16, seed=1), D(dp=2), nn.AdamW(lr=1e-2),
                checkpoint_dir=Checkpointing(tmp_path, every=1))
    return tmp_path


def resume(folder, model=None, opt=None, **kw):
    return run_on_mesh(model or gpt(), None, synthetic_batches(1, 8, 8, 16, seed=2), D(dp=2),
                       opt or nn.AdamW(lr=1e-2), resume_from=folder, **kw)


def test_an_altered_shard_is_refused_naming_the_file(saved):
    shard = saved / "step_00000003" / "__1_0.npz"
    arrays = dict(np.load(shard))
    arrays["c0"] = arrays["c0"] + 1e-6  # still a valid file of the same step, one block changed
    np.savez(shard, **arrays)
    with pytest.raises(ConfigError) as info:
        Checkpoint(saved)
    text = str(info.value)
    assert f"{shard} does not match the manifest: its sha256 is" in text and "altered or damaged" in text
    assert "restore __1_0.npz from the save it belongs to (step 3)" in text
    assert f"resume_from='{saved / 'step_00000002'}'" in text  # the way on: the save before it
    with pytest.raises(ConfigError, match="does not match the manifest"):
        resume(saved)
    assert Checkpoint(saved / "step_00000002").step == 2  # the others still load


def test_a_shard_copied_from_another_step_is_refused(saved):
    shutil.copy(saved / "step_00000001" / "__0_0.npz", saved / "step_00000003" / "__0_0.npz")
    with pytest.raises(ConfigError, match=r"step_00000003/__0_0.npz holds the shard of step 1, but this save is of "
                                          r"step 3: it was copied from another save; restore __0_0.npz"):
        Checkpoint(saved)


def test_a_missing_shard_and_a_damaged_manifest_are_refused(saved):
    (saved / "step_00000003" / "__0_0.npz").unlink()
    with pytest.raises(ConfigError, match=r"step_00000003/__0_0.npz, which the manifest names, cannot be read"):
        Checkpoint(saved)
    manifest = saved / "step_00000002" / ".metadata"
    manifest.write_text(manifest.read_text()[:-10])
    with pytest.raises(ConfigError, match=r"step_00000002/.metadata is not valid JSON.*step_00000001"):
        Checkpoint(saved / "step_00000002")
    edited = json.loads((saved / "step_00000001" / ".metadata").read_text())
    edited["files"]["__1_0.npz"]["sha256"] = "0" * 64
    (saved / "step_00000001" / ".metadata").write_text(json.dumps(edited))
    with pytest.raises(ConfigError, match=r"__1_0.npz does not match the manifest"):
        Checkpoint(saved / "step_00000001")


def test_another_learning_rate_is_refused_unless_allowed(saved):
    with pytest.raises(ConfigError) as info:
        resume(saved, opt=nn.AdamW(lr=1e-3))
    text = str(info.value)
    assert f"checkpoint {saved / 'step_00000003'} was saved by a run that differs from this one" in text
    assert "lr: 0.01 when saved, 0.001 now" in text and "allow_changes={'lr'}" in text
    slower = resume(saved, opt=nn.AdamW(lr=1e-3), allow_changes={"lr"})
    same = resume(saved)
    moved = {k: float(np.max(np.abs(slower.params[k] - same.params[k]))) for k in same.params}
    assert max(moved.values()) > 1e-6  # the new rate was used
    with pytest.raises(ConfigError, match="weight_decay: 0.01 when saved, 0.1 now"):
        resume(saved, opt=nn.AdamW(lr=1e-3, weight_decay=0.1), allow_changes={"lr"})


def test_another_model_setting_is_refused_unless_allowed_and_another_shape_always(saved):
    # the same shapes: loadable, but another model (its key-value heads follow its heads)
    with pytest.raises(ConfigError, match=r"(?s)n_heads: 4 when saved, 2 now\n  - n_kv_heads: 4 when saved, 2 now.*"
                                          r"allow_changes=\{'n_heads', 'n_kv_heads'\}"):
        resume(saved, model=gpt(n_heads=2))
    with pytest.raises(ConfigError, match="n_kv_heads: 4 when saved, 2 now"):
        resume(saved, model=gpt(n_heads=2), allow_changes={"n_heads"})
    assert resume(saved, model=gpt(n_heads=2), allow_changes={"n_heads", "n_kv_heads"}).start_step == 3
    with pytest.raises(ConfigError, match=r"(?s)does not fit this model.*allow_changes= cannot change that"):
        resume(saved, model=gpt(d_ff=64), allow_changes={"d_ff"})


def test_another_precision_is_refused_unless_allowed(saved):
    with pytest.raises(ConfigError, match=r"(?s)precision: parameters were saved in float64, the model's are float32.*"
                                          r"allow_changes=\{'precision'\}"):
        resume(saved, model=gpt(np.float32))
    as64 = resume(saved)
    as32 = resume(saved, model=gpt(np.float32), allow_changes={"precision"})
    for k, v in as64.params.items():
        assert as32.params[k].dtype == np.float32
        assert np.max(np.abs(as32.params[k] - v)) < 1e-5
    manifest = json.loads((saved / "step_00000003" / ".metadata").read_text())
    assert manifest["run"]["precision"] == {"params": ["float64"], "optimizer_state": ["float64"],
                                            "master_weights": None, "policy": None}
    assert manifest["run"]["optimizer"] == {"type": "AdamW", "lr": 0.01, "betas": [0.9, 0.999], "eps": 1e-8,
                                            "weight_decay": 0.01}


def test_a_change_to_mixed_precision_makes_master_weights_from_the_parameters(tmp_path):
    model = gpt(bfloat16)
    params = {k: v.astype(bfloat16) for k, v in gpt().init(np.random.default_rng(0)).items()}
    batches = synthetic_batches(2, 8, 8, 16, seed=1)
    run_on_mesh(model, params, batches[:1], D(dp=2), nn.AdamW(lr=1e-2), checkpoint_dir=tmp_path)
    with pytest.raises(ConfigError, match="mixed precision"):
        run_on_mesh(model, None, batches[1:], D(dp=2), nn.AdamW(lr=1e-2, mixed_precision=True), resume_from=tmp_path)
    run = run_on_mesh(model, None, batches[1:], D(dp=2), nn.AdamW(lr=1e-2, mixed_precision=True), resume_from=tmp_path,
                      allow_changes={"precision"})
    assert all(v.dtype == bfloat16 for v in run.params.values())


@pytest.mark.parametrize("allow, match", [
    ({"learning_rate"}, r"names \['learning_rate'\], which a checkpoint does not record; the names: \[.*'lr'"),
    (3, "allow_changes= is a set of names"),
])
def test_allow_changes_is_checked(allow, match, saved):
    with pytest.raises(ConfigError, match=match):
        resume(saved, allow_changes=allow)


def test_allow_changes_needs_resume_from(saved):
    model = gpt()
    with pytest.raises(ConfigError, match="allow_changes= names what may differ from the checkpoint a run resumes"):
        run_on_mesh(model, model.init(np.random.default_rng(0)), synthetic_batches(1, 8, 8, 16), D(), nn.AdamW(),
                    allow_changes={"lr"})


def test_a_precision_policy_is_recorded_and_compared(saved):
    from dataclasses import dataclass

    from emulator.arrays.shape_only import shape_only_params
    from emulator.parallel.checkpoint.fit import check_fit, run_record

    @dataclass(frozen=True)
    class Policy:  # the shape of emulator.machine.precision.Precision: a name and a dtype per kind of number
        name: str
        params: str = None
        master: str = None

    model, opt, fp32 = gpt(), nn.AdamW(lr=1e-2), Policy("fp32", params="fp32")
    shapes = {k: (v.shape, v.dtype) for k, v in shape_only_params(model).items()}
    record = run_record(model, opt, {k: d for k, (_, d) in shapes.items()}, fp32)
    assert record["precision"]["policy"] == {"name": "fp32", "params": "fp32", "master": None}
    checkpoint = Checkpoint(saved)  # saved without a policy
    check_fit(checkpoint, model, opt, shapes)
    with pytest.raises(ConfigError, match=r"precision: the policy was None when saved, \{'name': 'fp32'"):
        check_fit(checkpoint, model, opt, shapes, policy=fp32)
    check_fit(checkpoint, model, opt, shapes, allow_changes={"precision"}, policy=fp32)
    with pytest.raises(ConfigError, match="a precision policy is a Precision"):
        run_record(model, opt, {}, "fp32")
