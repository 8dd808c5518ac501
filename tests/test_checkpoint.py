"""Sharded checkpoints of run_on_mesh and restarts on other meshes: a run saved after k steps on
one mesh and resumed on another equals the run that never stopped (float64, 1e-12), over many
pairs of meshes; the files, the manifest and the write plan; what saving costs on the clock,
synchronous and asynchronous; saves a failure interrupted; bad input."""

import hashlib
import json
from dataclasses import replace

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import ConfigError, RankFailedError, RankFailure, nn
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.parallel.checkpoint import Checkpoint, Checkpointing, Storage
from emulator.training import synthetic_batches

DENSE = dict(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=4, max_seq=8)
STEPS, K, BATCH = 4, 2, 24


def dense(dtype=np.float64, **kw):
    return nn.GPT(**{**DENSE, **kw}, dtype=dtype)


def moe():
    return nn.GPT(16, 16, 4, 32, 2, 8, dtype=np.float64, n_kv_heads=2, n_experts=4, top_k=2, capacity_factor=None,
                  aux_loss_coef=0.1)


def adam():
    return nn.AdamW(lr=1e-2)


def max_difference(got, want):
    """The largest absolute difference over every parameter (they are of order 0.01 to 1;
    the attention's key biases, whose exact gradient is zero, hold round-off of 1e-14)."""
    assert sorted(got) == sorted(want)
    return max(float(np.max(np.abs(got[k].astype(np.float64) - want[k].astype(np.float64)))) for k in want)




D = ParallelDims
PAIRS = [
    (dense, D(dp=8), D(dp=6)),  # a node lost: 8 data-parallel ranks become 6
    (dense, D(tp=2), D(tp=4)),
    (dense, D(pp=2, micro_batches=2), D(pp=4, micro_batches=3)),  # another pipeline split
    (dense, D(dp=4, zero_stage=3), D(dp=2, zero_stage=1)),  # ZeRO-3 shards to ZeRO-1
    (dense, D(dp=2, zero_stage=1), D(dp=3, zero_stage=3)),
    (dense, D(dp=2, tp=2, zero_stage=2, sequence_parallel=True), D(dp=4, tp=2, zero_stage=3)),
    (dense, D(dp=2, tp=2, pp=2, zero_stage=1, micro_batches=2), D(tp=4, pp=2, micro_batches=2)),
    (dense, D(cp=2, dp=2), D(tp=2, cp=2, zero_stage=3, sequence_parallel=True)),
    (dense, D(dp=2, pp=2, v=2, schedule="interleaved_1f1b", micro_batches=2, zero_stage=3), D(dp=3, zero_stage=2)),
    (dense, D(dp=4), D()),  # back to one device
    # experts resharded over ep; MoE's capacity and balancing loss are statistics of each data-parallel replica's
    # micro-batch, so dp x micro_batches is part of the model's math: the pairs keep it
    (moe, D(dp=4, ep=4), D(dp=2, ep=2, tp=2, micro_batches=2)),
    (moe, D(dp=2, ep=2, zero_stage=3, micro_batches=2), D(dp=4, ep=2, zero_stage=1)),
]


@pytest.mark.parametrize("make,before,after", PAIRS, ids=[f"{m.__name__}:{a}->{b}" for m, a, b in PAIRS])
def test_resume_on_another_mesh_equals_the_uninterrupted_run(make, before, after, tmp_path):
    model = make()
    batches = synthetic_batches(STEPS, BATCH, 8, model.vocab, seed=1)
    params = model.init(np.random.default_rng(0))
    full = run_on_mesh(model, params, batches, before, adam())  # the run that never stopped
    first = run_on_mesh(model, params, batches[:K], before, adam(), checkpoint_dir=tmp_path)
    assert first.checkpoints == [tmp_path / f"step_{K:08d}"]
    resumed = run_on_mesh(model, None, batches[K:], after, adam(), resume_from=tmp_path)
    assert max_difference(resumed.params, full.params) < 1e-12
    np.testing.assert_allclose(first.losses + resumed.losses, full.losses, rtol=1e-12)
    assert resumed.start_step == K and first.start_step == 0
    assert first.seeds + resumed.seeds == full.seeds  # the job's random draws go on where they stopped


def test_resuming_on_the_same_mesh_is_exact_in_bf16_with_master_weights(tmp_path):
    model = dense(bfloat16)
    params = {k: v.astype(bfloat16) for k, v in dense().init(np.random.default_rng(0)).items()}
    batches = synthetic_batches(STEPS, 8, 8, 16, seed=1)
    dims, opt = D(dp=2, tp=2, zero_stage=1), lambda: nn.AdamW(lr=1e-2, mixed_precision=True)
    full = run_on_mesh(model, params, batches, dims, opt())
    run_on_mesh(model, params, batches[:K], dims, opt(), checkpoint_dir=tmp_path)
    resumed = run_on_mesh(model, None, batches[K:], dims, opt(), resume_from=tmp_path)
    for k in full.params:
        assert resumed.params[k].dtype == bfloat16
        assert np.array_equal(resumed.params[k], full.params[k]), k  # the fp32 master weights came back too
    ckpt = Checkpoint(tmp_path)
    assert ckpt.tensors["optim.master.head.proj.w"]["dtype"] == "float32"
    assert ckpt.tensors["model.head.proj.w"]["dtype"] == "bfloat16"


def test_manifest_tiles_every_tensor_and_replicas_are_written_once(tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    run_on_mesh(model, params, synthetic_batches(1, 8, 8, 16), D(dp=4, tp=2), adam(), checkpoint_dir=tmp_path)
    folder = tmp_path / "step_00000001"
    names = sorted(p.name for p in folder.iterdir())
    assert names == sorted([".metadata"] + [f"__{r}_0.npz" for r in range(8)])  # no temporary file left
    man = json.loads((folder / ".metadata").read_text())
    assert man["world_size"] == 8 and man["train"]["step"] == 1 and man["train"]["optim_t"] == 1
    for r in range(8):  # each shard's entry: its step, and the checksum of its bytes
        entry = man["files"][f"__{r}_0.npz"]
        assert entry["step"] == 1 and entry["rank"] == r
        assert entry["sha256"] == hashlib.sha256((folder / f"__{r}_0.npz").read_bytes()).hexdigest()
    for k, v in params.items():
        for prefix in ("model", "optim.m", "optim.v"):
            t = man["tensors"][f"{prefix}.{k}"]
            assert tuple(t["shape"]) == v.shape  # global shapes
            cover = np.zeros(v.shape, int)
            for c in t["chunks"]:
                cover[tuple(slice(o, o + s) for o, s in zip(c["offsets"], c["sizes"]))] += 1
            assert (cover == 1).all(), f"{prefix}.{k}: every value saved exactly once"
    # the vocab-parallel table is cut in two along the vocabulary (tp); its dp replicas are written once
    tok = man["tensors"]["model.embed.tok.w"]["chunks"]
    assert sorted(c["offsets"] for c in tok) == [[0, 0], [8, 0]]
    # writers balanced as DCP's dedup does: no rank writes much more than another
    per = man["bytes_per_rank"]
    assert sum(per) == man["bytes"] and max(per) < 2.0 * min(per)
    n_values = sum(v.size for v in params.values())
    assert man["bytes"] == 3 * 8 * n_values  # parameters and two moments, float64, each once


def test_each_saved_chunk_holds_the_right_values(tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    run = run_on_mesh(model, params, synthetic_batches(1, 8, 8, 16), D(dp=2, tp=2, zero_stage=3), adam(),
                      checkpoint_dir=tmp_path)
    ckpt = Checkpoint(tmp_path)
    for k, v in run.params.items():
        assert np.array_equal(ckpt.read(f"model.{k}", (0,) * v.ndim, v.shape), v)


def test_asynchronous_saving_hides_the_write(tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(6, 8, 8, 16)
    slow = Storage(write_bandwidth=4e9, read_bandwidth=4e9)  # a write takes about a step of this small model
    base = run_on_mesh(model, params, batches, D(dp=2), adam())
    sync = run_on_mesh(model, params, batches, D(dp=2), adam(),
                       checkpoint_dir=Checkpointing(tmp_path / "sync", every=2, storage=slow))
    asyn = run_on_mesh(model, params, batches, D(dp=2), adam(),
                       checkpoint_dir=Checkpointing(tmp_path / "async", every=2, async_save=True, storage=slow))
    for run in (sync, asyn):
        assert [p.name for p in run.checkpoints] == ["step_00000002", "step_00000004", "step_00000006"]
        assert max_difference(run.params, base.params) == 0.0  # saving changes no number
    per_rank = json.loads((tmp_path / "sync" / "step_00000002" / ".metadata").read_text())["bytes_per_rank"]
    write = max(per_rank) / 4e9
    tl_sync, tl_async = sync.world.timeline(), asyn.world.timeline()
    writes = [e for e in tl_sync.of(0, "compute") if e.name == "checkpoint write"]
    assert len(writes) == 3 and writes[0].duration == pytest.approx(per_rank[0] / 4e9)
    assert sync.step_time() >= base.step_time() + 3 * write * 0.999
    bg = tl_async.of(0, "storage")
    assert len(bg) == 3 and all(e.kind == "io" for e in bg)
    copies = [e for e in tl_async.of(0, "compute") if e.name == "checkpoint: copy to host"]
    assert copies[0].duration == pytest.approx(per_rank[0] / Storage().host_bandwidth)
    # training goes on while the writes run: the compute stream stops only to copy (and once to plan); the
    # last write, after the last step, is not hidden
    hidden = sync.step_time() - asyn.step_time()
    assert hidden > 0.5 * (sync.step_time() - base.step_time())
    assert asyn.step_time() < base.step_time() + 1.5 * write
    assert asyn.world.clock.final()[0] == pytest.approx(asyn.step_time())  # the job ends when its last write does


def test_a_failure_keeps_the_saves_made_before_it_and_resuming_from_them_is_exact(tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(6, 8, 8, 16, seed=1)
    full = run_on_mesh(model, params, batches, D(dp=2, tp=2), adam())
    clean = run_on_mesh(model, params, batches, D(dp=2, tp=2), adam(),
                        checkpoint_dir=Checkpointing(tmp_path / "clean", every=2))
    t4 = [e.end for e in clean.world.timeline().of(1, "compute") if e.name == "checkpoint write"][1]
    policy = Checkpointing(tmp_path / "run", every=2)
    with pytest.raises(RankFailedError) as info:
        run_on_mesh(model, params, batches, D(dp=2, tp=2), adam(), checkpoint_dir=policy,
                    faults=[RankFailure(rank=1, at=t4 + 1e-9)])  # right after its step-4 write
    err = info.value
    assert [p.name for p in err.checkpoints] == ["step_00000002", "step_00000004"]
    assert not (tmp_path / "run" / "step_00000006" / ".metadata").exists()
    resumed = run_on_mesh(model, None, batches[4:], D(dp=4), adam(), resume_from=tmp_path / "run")
    assert resumed.start_step == 4 and max_difference(resumed.params, full.params) < 1e-12


def test_a_save_the_failure_interrupts_has_no_manifest(tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(4, 8, 8, 16, seed=1)
    slow = Storage(write_bandwidth=1e6, read_bandwidth=1e6)
    policy = Checkpointing(tmp_path, every=2, async_save=True, storage=slow)
    clean = run_on_mesh(model, params, batches, D(dp=2), adam(), checkpoint_dir=policy)
    write = clean.world.timeline().of(0, "storage")[0]
    with pytest.raises(RankFailedError) as info:  # rank 0 dies while its step-2 write is in flight
        run_on_mesh(model, params, batches, D(dp=2), adam(), checkpoint_dir=replace(policy, overwrite=True),
                    faults=[RankFailure(0, at=(write.start + write.end) / 2)])
    assert info.value.checkpoints == []
    assert not (tmp_path / "step_00000002" / ".metadata").exists()  # a stale manifest from the clean run is gone
    # overwrite=True removed the clean run's saves first: what is left of step 4 is the shard rank 1 wrote before
    # its watchdog fired, with no manifest
    assert sorted(p.name for p in (tmp_path / "step_00000004").iterdir()) == ["__1_0.npz"]
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        Checkpoint(tmp_path)
    # the emulator wrote both shards at once, but on the emulated clock rank 0 died before its bytes were on storage
    with pytest.raises(ConfigError, match=r"step_00000002: the emulated job lost this save: rank 0's bytes would "
                                          r"have reached storage at .* but it stopped at"):
        Checkpoint(tmp_path / "step_00000002")


def test_latest_complete_save_is_chosen_and_a_step_folder_can_be_named(tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(4, 8, 8, 16, seed=1)
    run_on_mesh(model, params, batches, D(dp=2), adam(), checkpoint_dir=Checkpointing(tmp_path, every=1))
    assert Checkpoint(tmp_path).step == 4
    assert Checkpoint(tmp_path / "step_00000002").step == 2
    (tmp_path / "step_00000004" / ".metadata").unlink()  # as if the last save had not finished
    assert Checkpoint(tmp_path).step == 3


def test_loading_is_charged_on_the_clock(tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(2, 8, 8, 16, seed=1)
    run_on_mesh(model, params, batches[:1], D(dp=2), adam(), checkpoint_dir=tmp_path)
    resumed = run_on_mesh(model, None, batches[1:], D(dp=2), adam(), resume_from=tmp_path)
    (read,) = [e for e in resumed.world.timeline().of(0, "compute") if e.name == "checkpoint read"]
    n_values = sum(v.size for v in params.values())
    assert read.start == 0.0 and read.duration == pytest.approx(3 * 8 * n_values / Storage().read_bandwidth)


@pytest.mark.parametrize("call, match", [
    (lambda m, p, b, d: run_on_mesh(m, p, b, D(dp=2), adam(), resume_from=d), "params=None"),
    (lambda m, p, b, d: run_on_mesh(dense(n_layers=2), None, b, D(dp=2), adam(), resume_from=d),
     "does not fit this model"),
    (lambda m, p, b, d: run_on_mesh(m, None, b, D(dp=2), nn.AdamW(mixed_precision=True), resume_from=d),
     "mixed precision"),
    (lambda m, p, b, d: run_on_mesh(m, None, b, D(dp=2), adam(), resume_from=d / "nowhere"), "no complete checkpoint"),
    (lambda m, p, b, d: run_on_mesh(m, None, b, D(dp=2), adam(), shape_only=True, checkpoint_dir=d), "shape-only"),
    (lambda m, p, b, d: Checkpointing(d, every=0), "every="),
    (lambda m, p, b, d: Storage(write_bandwidth=0), "positive"),
])
def test_bad_input_is_refused(call, match, tmp_path):
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(1, 8, 8, 16)
    run_on_mesh(model, params, batches, D(dp=2), adam(), checkpoint_dir=tmp_path)
    with pytest.raises(ConfigError, match=match):
        call(model, params, batches, tmp_path)
