"""DDP and ZeRO-1/2/3 against single-device training; memory and traffic against the formulas."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import World, nn
from emulator import data_parallel as DP
from emulator.accounting import zero_bytes_per_gpu, zero_traffic_per_gpu

MODEL = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16, dtype=np.float64)
P0 = MODEL.init(np.random.default_rng(0))
PSI = sum(v.size for v in P0.values())
BATCHES = DP.synthetic_batches(3, 12, 16, 16, seed=3)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_same_parameters_as_single_device(n, stage):
    opt = nn.AdamW(lr=1e-2, weight_decay=0.1)
    ref, ref_losses = DP.train_single(MODEL, P0, BATCHES, opt)
    w = World(n)
    out = w.run(lambda c: DP.data_parallel_train(c, MODEL, P0, BATCHES, opt, stage=stage, prefetch=stage == 3))
    got = out[0]["params"] if stage < 3 else DP.assemble(MODEL, P0, out)
    assert max(np.abs(got[k] - ref[k]).max() for k in ref) < 1e-10
    if stage < 3:  # every rank ends with the same full parameters
        assert all(np.array_equal(out[r]["params"][k], got[k]) for r in range(n) for k in got)
    losses = np.mean([o["losses"] for o in out], axis=0)  # equal slices: mean of local means
    assert np.allclose(losses, ref_losses, rtol=1e-10)
    sent = np.mean(w.stats().bytes_sent) / len(BATCHES)
    padded = sum(l.padded for l in DP.layouts(MODEL, P0, n).values())
    expected = zero_traffic_per_gpu(padded, n, stage, bytes_per_param=8)
    assert sent == pytest.approx(expected)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_mixed_precision_memory_matches_the_formula(stage):
    model = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16)
    p = {k: v.astype(bfloat16) for k, v in model.init(np.random.default_rng(0)).items()}
    psi = sum(v.size for v in p.values())
    assert all(l.size == l.padded for l in DP.layouts(model, p, 4).values())  # so the formula is exact
    w = World(4)
    w.run(lambda c: DP.data_parallel_train(c, model, p, BATCHES[:1], nn.AdamW(mixed_precision=True), stage=stage))
    f = zero_bytes_per_gpu(psi, 4, stage)
    for row in w.memory_report():
        assert (row["peak_params"], row["peak_grads"], row["peak_optimizer"]) == (f.params, f.grads, f.optimizer)
        assert row["peak_activations"] > 0


def test_prefetch_overlaps_gathers_with_compute():
    from emulator import Topology

    times = {}
    for prefetch in (False, True):
        w = World(2, topology=Topology(flops=3e11))
        w.run(lambda c: DP.data_parallel_train(c, MODEL, P0, BATCHES[:1], nn.AdamW(), stage=3, prefetch=prefetch))
        times[prefetch] = max(w.stats().time)
    assert times[True] < 0.9 * times[False]


def test_batch_must_split_over_ranks():
    with pytest.raises(Exception, match="does not split over 5 ranks"):
        World(5).run(lambda c: DP.data_parallel_train(c, MODEL, P0, BATCHES, nn.AdamW(), stage=1))
    with pytest.raises(Exception, match="stage must be"):
        World(2).run(lambda c: DP.data_parallel_train(c, MODEL, P0, BATCHES, nn.AdamW(), stage=4))


def test_flat_layout_round_trip():
    lay = DP.FlatLayout.of(P0, 3)
    flat = lay.flatten(P0)
    assert lay.padded % 3 == 0 and flat.shape == (lay.padded,)
    back = lay.unflatten(flat)
    assert all(np.array_equal(back[k], P0[k]) for k in P0)
    shards = [lay.shard(flat, r, 3) for r in range(3)]
    assert np.array_equal(np.concatenate(shards), flat)
