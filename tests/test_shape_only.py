"""Shape-only runs: the same programs without data give the data run's trace, ledger peaks
and timeline; folding symmetric axes keeps what the representatives see; arrays without
values behave as NumPy's and refuse what needs values."""

import numpy as np
import pytest

from emulator import Topology, nn
from emulator.arrays.shape_only import ShapeArray, ShapeOnlyError, shape_only_params
from emulator.parallel import ParallelDims, run_on_mesh, shape_only_batches
from emulator.training import synthetic_batches

SMALL = dict(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=4, max_seq=8, dtype=np.float32)


def events(world, ranks=None):
    keep = [e for e in world.timeline().events if ranks is None or e.rank in ranks]
    return sorted((e.rank, e.stream, e.kind, e.name, e.start, e.end, e.group) for e in keep)


@pytest.mark.parametrize("make,dims", [
    (lambda: nn.GPT(**SMALL), ParallelDims(dp=2, tp=2, pp=2, micro_batches=2, zero_stage=1, sequence_parallel=True)),
    (lambda: nn.GPT(**SMALL, n_kv_heads=2, mlp="swiglu"),
     ParallelDims(dp=2, tp=2, pp=2, micro_batches=2, zero_stage=3, recompute="full", schedule="zb_h1")),
    (lambda: nn.GPT(**SMALL), ParallelDims(dp=2, tp=2, cp=2, cp_attention="ulysses", zero_stage=2,
                                           sequence_parallel=True)),
    (lambda: nn.GPT(**SMALL), ParallelDims(pp=2, v=2, schedule="interleaved_1f1b", micro_batches=2, dp=2)),
])
def test_a_shape_only_run_is_the_data_run_without_data(make, dims):
    model = make()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(2, 4 * dims.dp, 8, model.vocab)
    data = run_on_mesh(model, params, batches, dims, nn.AdamW(lr=1e-2))
    shape = run_on_mesh(model, None, batches, dims, nn.AdamW(lr=1e-2), shape_only=True, fold=())
    assert shape.params is None and np.isnan(shape.losses).all()
    assert [r.as_dict() for r in shape.world.trace] == [r.as_dict() for r in data.world.trace]
    assert [(m.peak, m.peak_by_kind) for m in shape.world.memory] == [(m.peak, m.peak_by_kind)
                                                                      for m in data.world.memory]
    assert events(shape.world) == events(data.world)


def _folded_and_full(dims, gpus, stack=None):
    model = nn.GPT(64, 64, 4, 128, 4, 16, dtype=np.float32)
    batches, topo = shape_only_batches(2, 4 * dims.dp * dims.micro_batches, 16), Topology.h100(gpus_per_node=gpus)
    full = run_on_mesh(model, None, batches, dims, nn.AdamW(), topology=topo, shape_only=True, fold=(), stack=stack)
    folded = run_on_mesh(model, None, batches, dims, nn.AdamW(), topology=topo, shape_only=True, stack=stack)
    live = set(folded.world.live)
    assert len(live) == dims.pp
    return full, folded, live


def test_folding_keeps_what_the_representatives_see():
    """With tp filling a node (pipelines and data parallelism between nodes, as a mesh is
    laid out), the live ranks' timelines, ledgers and the messages that touch them are the
    unfolded run's. (ZeRO-1 as the 2021 stack runs it: its collectives after the pipeline,
    sharing no port with a pipeline transfer; next test for the overlapped ones.)"""
    full, folded, live = _folded_and_full(ParallelDims(dp=2, tp=2, pp=2, micro_batches=4, zero_stage=1,
                                                       sequence_parallel=True), 2, "megatron-2021")
    assert events(folded.world) == events(full.world, live)
    assert all(folded.world.memory[r].peak_by_kind == full.world.memory[r].peak_by_kind for r in live)
    touching = lambda w: sorted(tuple(r.as_dict().values()) for r in w.trace if r.src in live or r.dst in live)  # noqa
    assert touching(folded.world) == touching(full.world)


@pytest.mark.parametrize("dims,gpus", [(ParallelDims(dp=4, tp=4, pp=2, micro_batches=2, zero_stage=3), 4),
                                       (ParallelDims(dp=2, tp=2, pp=2, micro_batches=4, zero_stage=1,
                                                     sequence_parallel=True), 2)])
def test_folding_keeps_bytes_and_memory_and_step_time_within_two_percent(dims, gpus):
    """Where a folded rank's own transfers and a live group's share a NIC (ZeRO-3's
    prefetched gathers, or the distributed optimizer's bucketed reduce-scatters, beside the
    pipeline's sends), the engine books the shared port in the order operations complete.
    A collective whose other members are folded runs when its rank next waits, as the last
    member would arrive then, which keeps the unfolded order up to a few microseconds of
    the step (a rank that never runs has no arrival time of its own). Bytes and memory
    cannot differ."""
    full, folded, live = _folded_and_full(dims, gpus)
    assert all(folded.world.memory[r].peak_by_kind == full.world.memory[r].peak_by_kind for r in live)
    sent = lambda w: sorted((r.op, r.group, r.src, r.dst, r.nbytes) for r in w.trace if r.src in live)  # noqa: E731
    assert sent(folded.world) == sent(full.world)
    step = lambda w: max(w.clock.final()[r] for r in live)  # noqa: E731
    assert abs(step(folded.world) / step(full.world) - 1) < 0.02


def test_a_folded_axis_crossed_by_point_to_point_is_refused():
    with pytest.raises(Exception, match="point to point may not cross a folded axis"):
        run_on_mesh(nn.GPT(**SMALL), None, shape_only_batches(1, 4, 8), ParallelDims(pp=2, micro_batches=2),
                    nn.AdamW(), shape_only=True, fold=("pp",))


def test_shape_arrays_follow_numpy():
    a = ShapeArray((2, 8, 16), np.float32)
    assert (a @ np.zeros((16, 4), np.float32)).shape == (2, 8, 4)
    assert np.exp(a - a.max(-1, keepdims=True)).sum(-1).shape == (2, 8)
    assert (a * 2.0).dtype == np.float32 and (a.astype(np.float64) + 1).dtype == np.float64
    t = a.reshape(2, 8, 4, 4).transpose(0, 2, 1, 3)
    assert t.shape == (2, 4, 8, 4) and t.memory_key == a.memory_key  # a view: the same memory
    assert t.reshape(2, 4, 32).memory_key != a.memory_key  # NumPy copies a transposed array to reshape it
    assert a[:, 2:4].memory_key != a.memory_key and a[:, 2:4].shape == (2, 2, 16)
    assert a[np.array([0, 1, 1])].shape == (3, 8, 16)
    assert np.concatenate([a, np.zeros((2, 8, 16))], axis=1).shape == (2, 16, 16)
    assert np.argsort(-ShapeArray((6, 4), np.float64), axis=1)[:, 0].tolist() == [0, 1, 2, 3, 0, 1]  # balanced
    assert np.isnan(float(a.sum()))
    with pytest.raises(ShapeOnlyError, match="no values"):
        np.asarray(a)
    with pytest.raises(ShapeOnlyError, match="depends on data"):
        bool(a.any())


def test_a_model_initialises_without_values():
    model = nn.GPT(128256, 16384, 128, 53248, 2, 8192, n_kv_heads=8, mlp="swiglu")
    p = shape_only_params(model)
    assert all(isinstance(v, ShapeArray) for v in p.values())
    assert p["blocks.0.attn.k.w"].shape == (16384, 1024) and p["embed.tok.w"].shape == (128256, 16384)


@pytest.mark.slow
def test_llama3_405b_pretraining_mesh_runs_shape_only():
    """TP 8 x PP 16 x DP 128 on 16,384 GPUs with the real layer shapes: each stage's
    representative reports its timeline, its memory by kind and its bytes per axis and link
    (the wall time is the benchmark's business: benchmarks/shape_only.py)."""
    from benchmarks.shape_only import LLAMA3_405B
    from ml_dtypes import bfloat16

    model = nn.GPT(**LLAMA3_405B, dtype=bfloat16)
    dims = ParallelDims(dp=128, tp=8, pp=16, sequence_parallel=True, zero_stage=1, micro_batches=16,
                        recompute="selective")
    run = run_on_mesh(model, None, shape_only_batches(1, 2048, 8192), dims, nn.AdamW(mixed_precision=True),
                      shape_only=True)
    assert run.ranks() == [s * 1024 for s in range(16)]
    rows = run.summary()
    assert [r["layers"] for r in rows][:2] == ["embed + blocks 0-6", "blocks 7-14"]  # Llama 3's 7, 8 x 14, 7
    params = sum(r["peak params"] for r in rows) * 8 / 2  # bf16 params, 8 tp ranks per stage
    assert params == pytest.approx(405.9e9, rel=0.01)
    for r in rows:  # tp on NVLink, pp and dp on the NICs; 16 bytes per parameter, ZeRO-1 over 128
        assert r["tp nvlink"] > r["dp,cp nic"] > r["pp nic"] > 0 and "tp nic" not in r
        assert r["peak optimizer"] == pytest.approx(12 * r["peak params"] / 2 / 128, rel=0.01)
    assert 0 < run.step_time() < 60


def test_a_folded_collective_waits_for_its_rank_to_wait_as_its_members_would():
    """DDP's last bucket and the pipeline's last gradient send share the stage's NIC. In the
    unfolded run the data-parallel partner arrives after the send was matched, so the send
    goes first; completing the folded all-reduce at once would put it first instead and
    hold the send (and the previous stage) behind it, 3.7% of this step."""
    from emulator.planner import ModelSpec, cluster_preset, run_plan

    dims, cluster = ParallelDims(dp=2, tp=2, pp=2, micro_batches=4), cluster_preset("h100", nodes=4, gpus_per_node=2)
    steps = [run_plan(ModelSpec(8, 256, 8, 1024, 2048), cluster, dims, 512, 16 * 512, shape_only=True,
                      fold=fold).run.step_time() for fold in ((), ("dp",))]
    assert steps[1] == pytest.approx(steps[0], rel=1e-3), steps


def test_shape_only_broadcasting_is_numpys():
    """The shape-only arrays' own broadcast rule gives NumPy's shape, or NumPy's error, for
    every combination of up to three of these shapes (scalars, ones, mismatches)."""
    import itertools

    from emulator.arrays.shape_only import _broadcast

    dims = [(), (1,), (3,), (1, 3), (2, 1), (2, 3), (4, 1, 3), (4, 2, 3), (1, 1, 1), (5,), (2, 1, 1)]
    for k in (1, 2, 3):
        for combo in itertools.product(dims, repeat=k):
            try:
                want = np.broadcast_shapes(*combo)
            except ValueError as e:
                with pytest.raises(ValueError, match="broadcast"):
                    _broadcast(list(combo))
                assert "broadcast" in str(e)
                continue
            assert _broadcast(list(combo)) == want, combo


def test_shape_only_basic_indexing_is_numpys_each_time_it_is_asked():
    """Views of a shape-only array (shape, strides, first byte) are NumPy's, also when the
    same index is asked again (each is worked out once), ``True`` and ``1`` kept apart."""
    real = np.zeros((4, 6, 5), np.float32)
    indexes = [1, True, False, np.int64(2), -1, (slice(1, 3),), (slice(None, None, -2), 2), (Ellipsis, 1),
               (None, slice(0, 4, 3)), (1, Ellipsis, None), (slice(-3, None), slice(1, 5, 2), 0), ()]
    for base_real, base in ((real, ShapeArray(real.shape, real.dtype)),
                            (real.transpose(2, 0, 1), ShapeArray(real.shape, real.dtype).transpose(2, 0, 1))):
        for _ in range(2):
            for index in indexes:
                want, got = base_real[index], base[index]
                assert got.shape == want.shape, index
                if np.shares_memory(want, real):  # a view: the same memory, from the same byte, read alike
                    offset = want.__array_interface__["data"][0] - real.__array_interface__["data"][0]
                    assert (got.base, got.offset, got.strides) == (base.base, offset, want.strides), index
                else:  # NumPy copied (a boolean scalar is an advanced index): new memory, of its size
                    assert got.base is not base.base and got.nbytes == want.nbytes and isinstance(index, bool)
    with pytest.raises(IndexError):
        ShapeArray((2, 3), np.float32)[5]
