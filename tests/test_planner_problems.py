"""The planner's problems in words: a plan that cannot run says why, every structural
problem at once, and ParallelDims takes a planner's ModelSpec."""

import pytest

from emulator import ConfigError
from emulator.parallel import ParallelDims as D
from emulator.planner import ModelSpec, cluster_preset, evaluate, model_preset


def test_problems_say_what_is_wrong():
    m = model_preset("llama3-70b")
    c = cluster_preset("h100", nodes=8)
    wrong_size = evaluate(m, c, D(dp=2, tp=8), 4096, 2**20)
    assert not wrong_size.valid and "16 GPUs, but the cluster has 64" in wrong_size.problems[0]
    assert wrong_size.step_time is None
    crosses = evaluate(model_preset("megatron-h100-70b"), c, D(dp=4, tp=16, recompute="full"), 4096, 2**20)
    assert not crosses.valid and any("crosses a node" in p for p in crosses.problems)
    assert crosses.step_time is not None  # still timed, to show what crossing costs
    heads = evaluate(model_preset("llama3-8b"), cluster_preset("h100", nodes=3), D(dp=8, tp=3), 4096, 2**20)
    assert any("tp=3 must divide the 32 attention heads" in p for p in heads.problems)
    big = evaluate(m, c, D(dp=64), 4096, 2**20)
    over = [p for p in big.problems if p.startswith("does not fit")]
    assert over and "GB over" in over[0] and not big.valid and not big.fits
    ok = evaluate(m, c, D(dp=4, tp=8, pp=2, zero_stage=1, sequence_parallel=True, micro_batches=64,
                          recompute="selective"), 4096, 2**20)
    assert ok.valid and ok.fits and ok.problems == []
    assert 0 < ok.mfu < ok.hfu * 1.5 and 0 < ok.bubble < 0.1
    assert set(ok.memory_bytes) == {"params", "grads", "optimizer", "activations", "buffers"}
    assert {row["axis"] for row in ok.comm} == {"tp", "pp", "dp,cp"}
    a2a = evaluate(model_preset("mixtral-8x22b"), cluster_preset("h100", nodes=32),
                   D(dp=16, tp=4, pp=4, ep=8, zero_stage=1, micro_batches=16, sequence_parallel=True), 4096,
                   2**22)
    assert any(p.startswith("slow: the ep=8 all-to-all crosses nodes") for p in a2a.problems)
    with pytest.raises(ConfigError, match="ModelSpec"):
        evaluate("llama", c, D(), 4096, 2**20)
    with pytest.raises(ConfigError, match="seq_len"):
        evaluate(m, c, D(dp=64), 0, 2**20)


def test_every_structural_problem_is_listed_at_once():
    """TP 16 on Llama 3 70B (8 K/V heads) on nodes of 8: the K/V heads and the node it
    crosses; with a batch that is not whole sequences and too many layers' stages too, every
    one of them, not the first class only."""
    m, c = model_preset("llama3-70b"), cluster_preset("h100", nodes=4)
    kv = evaluate(m, c, D(dp=2, tp=16), 4096, 2**20)
    assert kv.step_time is None and not kv.valid
    assert any("tp=16 must divide the 8 K/V heads" in p for p in kv.problems)
    assert any("tp=16 crosses a node (8 GPUs per node)" in p for p in kv.problems)
    many = evaluate(ModelSpec(4, 128, 4, 512, 1024, n_kv_heads=2), cluster_preset("h100", nodes=2),
                    D(tp=4, pp=8, micro_batches=2), 256, 64 * 256 + 1)
    found = " | ".join(many.problems)
    for part in ("32 GPUs, but the cluster has 16", "not a whole number of 256-token sequences", "2 K/V heads",
                 "pp x v = 8 stages need at least as many layers"):
        assert part in found, part
    assert "crosses a node" not in found  # tp 4 in a node of 8: nothing to say about placement
    ok = evaluate(m, cluster_preset("h100", nodes=8), D(dp=4, tp=8, pp=2, zero_stage=1, sequence_parallel=True,
                                                         micro_batches=64, recompute="selective"), 4096, 2**20)
    assert ok.problems == []


def test_parallel_dims_accepts_a_planners_model_spec():
    """A ModelSpec leaves max_seq open (None): its problems are the sizes, not a TypeError."""
    m = model_preset("llama3-70b")
    assert m.max_seq is None
    assert D(dp=2, tp=8).problems(m, 4096, 16) == []
    assert D(dp=2, tp=8).validate(m, 131072) is not None
    with pytest.raises(ConfigError, match="8 K/V heads"):
        D(tp=16).validate(m, 4096, 16)
    fixed = m.with_seq(2048)
    assert any("longer than the model's max_seq (2048)" in p for p in D().problems(fixed, 4096))
