"""DDP and ZeRO-1/2/3 against single-device training; memory, traffic and timing against
the formulas; gradient accumulation and recomputation."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import ConfigError, Topology, World, nn
from emulator.accounting import zero_bytes_per_gpu, zero_traffic_per_gpu
from emulator.parallel import DDP, ZeRO3, assemble, data_parallel
from emulator.parallel.flat_layout import FlatLayout, layouts
from emulator.training import synthetic_batches, train, train_single

MODEL = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16, dtype=np.float64)
P0 = MODEL.init(np.random.default_rng(0))
BATCHES = synthetic_batches(3, 12, 16, 16, seed=3)


def run(n, zero_stage, batches=BATCHES, micro_batches=1, recompute=False, opt=None, topology=None, model=MODEL,
        params=P0, **options):
    opt = opt or nn.AdamW(lr=1e-2, weight_decay=0.1)
    w = World(n, topology=topology)
    out = w.run(lambda c: train(c, model, data_parallel(zero_stage, c, model, params, opt, **options), batches,
                                micro_batches, recompute))
    got = out[0].params if zero_stage < 3 else assemble(model, params, [o.shards for o in out])
    return w, out, got


def reference(opt=None, batches=BATCHES):
    return train_single(MODEL, P0, batches, opt or nn.AdamW(lr=1e-2, weight_decay=0.1))


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_same_parameters_as_single_device(n, zero_stage):
    ref, ref_losses = reference()
    w, out, got = run(n, zero_stage, prefetch=zero_stage == 3) if zero_stage == 3 else run(n, zero_stage)
    assert max(np.abs(got[k] - ref[k]).max() for k in ref) < 1e-10
    if zero_stage < 3:  # every rank ends with the same full parameters
        assert all(np.array_equal(out[r].params[k], got[k]) for r in range(n) for k in got)
    losses = np.mean([o.losses for o in out], axis=0)  # equal slices: mean of local means
    assert np.allclose(losses, ref_losses, rtol=1e-10)
    sent = np.mean(w.stats().bytes_sent) / len(BATCHES)
    padded = sum(l.padded for l in layouts(MODEL, P0, n).values())
    assert sent == pytest.approx(zero_traffic_per_gpu(padded if zero_stage else sum(v.size for v in P0.values()),
                                                      n, zero_stage, bytes_per_param=8))


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
@pytest.mark.parametrize("micro_batches", [2, 3])
def test_gradient_accumulation_equals_the_big_batch(zero_stage, micro_batches):
    ref, _ = reference()
    w, _, got = run(2, zero_stage, micro_batches=micro_batches)
    assert max(np.abs(got[k] - ref[k]).max() for k in ref) < 1e-10
    ops = [c.op for c in w.calls[0]]
    layers = len(MODEL.layers)
    if zero_stage == 0:  # no_sync: one all-reduce per bucket, on the last micro-batch only
        assert ops.count("all_reduce") == layers * len(BATCHES)
    else:  # ZeRO-2/3 must reduce-scatter every micro-batch: the full gradient has nowhere to wait
        per_step = layers * (micro_batches if zero_stage >= 2 else 1)
        assert ops.count("reduce_scatter") == per_step * len(BATCHES)


def test_recomputation_trades_memory_for_compute():
    ref, _ = reference()
    peaks, times = {}, {}
    for recompute in (False, True):
        w, _, got = run(2, 0, recompute=recompute)
        assert max(np.abs(got[k] - ref[k]).max() for k in ref) < 1e-10
        peaks[recompute] = w.memory_report()[0]["peak_activations"]
        times[recompute] = sum(e.duration for e in w.timeline().of(0, "compute", "compute")  # the model's compute
                               if not e.name.startswith(("optimizer", "compute slowed")))
    assert peaks[True] < peaks[False] / 5
    assert times[True] == pytest.approx(times[False] * (6 + 2) / 6)  # one more forward: 2 of 6 FLOPs units


@pytest.mark.parametrize("bucket_bytes", [None, 1, 20_000, 10**9])
def test_ddp_buckets(bucket_bytes):
    ref, _ = reference()
    w, _, got = run(2, 0, bucket_bytes=bucket_bytes)
    assert max(np.abs(got[k] - ref[k]).max() for k in ref) < 1e-10
    ddp = DDP(World(2).run(lambda c: c)[0], MODEL, P0, nn.AdamW(), bucket_bytes=bucket_bytes)
    n_buckets = len(ddp.buckets)
    assert n_buckets == {None: 4, 1: len(P0), 10**9: 1}.get(bucket_bytes, n_buckets)
    assert 4 < n_buckets < len(P0) if bucket_bytes == 20_000 else True
    assert [c.op for c in w.calls[0]].count("all_reduce") == n_buckets * len(BATCHES)


def test_ddp_reduces_while_backward_runs():
    w, _, _ = run(2, 0, batches=BATCHES[:1], topology=Topology(flops=3e11))
    tl = w.timeline()
    comm = [e for e in tl.of(0, kind="comm") if e.name == "all_reduce"]
    last_backward = max(e.end for e in tl.of(0, kind="compute") if e.name.startswith("B "))
    assert len(comm) == 4 and min(e.start for e in comm) < last_backward  # overlapped, not after


@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_mixed_precision_memory_matches_the_formula(zero_stage):
    model = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16)
    p = {k: v.astype(bfloat16) for k, v in model.init(np.random.default_rng(0)).items()}
    psi = sum(v.size for v in p.values())
    assert all(l.size == l.padded for l in layouts(model, p, 4).values())  # so the formula is exact
    w, _, _ = run(4, zero_stage, batches=BATCHES[:1], model=model, params=p, opt=nn.AdamW(mixed_precision=True))
    f = zero_bytes_per_gpu(psi, 4, zero_stage)
    for row in w.memory_report():
        assert (row["peak_params"], row["peak_grads"], row["peak_optimizer"]) == (f.params, f.grads, f.optimizer)
        assert row["peak_activations"] > 0


def test_prefetch_overlaps_gathers_with_compute():
    times = {}
    for prefetch in (False, True):
        w, _, _ = run(2, 3, batches=BATCHES[:1], topology=Topology(flops=3e11), prefetch=prefetch)
        times[prefetch] = max(w.stats().time)
    assert times[True] < 0.9 * times[False]


def test_strategies_on_a_mesh_axis():
    """The data-parallel group can be one axis of a mesh: here dp over 2 ranks, twice."""
    ref, _ = reference()
    w = World(mesh={"dp": 2, "tp": 2})
    opt = nn.AdamW(lr=1e-2, weight_decay=0.1)
    out = w.run(lambda c: train(c, MODEL, ZeRO3(c.group("dp"), MODEL, P0, opt), BATCHES))
    for tp in range(2):
        ranks = w.mesh.group_ranks("dp", tp)
        got = assemble(MODEL, P0, [out[r].shards for r in ranks])
        assert max(np.abs(got[k] - ref[k]).max() for k in ref) < 1e-10
    assert {c.group for c in w.calls[3]} == {"dp"}


def test_bad_configurations():
    with pytest.raises(ConfigError, match="does not split over 5 ranks"):
        run(5, 1)
    with pytest.raises(ConfigError, match="zero_stage must be"):
        run(2, 4)
    with pytest.raises(ConfigError, match="does not split into 5 equal micro-batches"):
        run(2, 0, micro_batches=5)


def test_flat_layout_round_trip():
    lay = FlatLayout.of(P0, 3)
    flat = lay.flatten(P0)
    assert lay.padded % 3 == 0 and flat.shape == (lay.padded,)
    back = lay.unflatten(flat)
    assert all(np.array_equal(back[k], P0[k]) for k in P0)
    shards = [lay.shard(flat, r, 3) for r in range(3)]
    assert np.array_equal(np.concatenate(shards), flat)
