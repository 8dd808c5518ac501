"""The tensor-parallel block against the single-device block, with and without sequence
parallelism and recomputation; its cache against the activation formula, term by term;
the accounting contract (Problems 8.3 and 8.4)."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import World, nn
from emulator.accounting import (activation_bytes_per_layer, activation_terms, pp_bytes_per_boundary,
                                 tp_bytes_per_layer)
from emulator.parallel.tp_block import TensorParallelBlock, cached_terms

D, A, B, S = 16, 4, 2, 8
FF = 4 * D


def run(t, sp, recompute, P, x, dy, dropout=0.0, act=np.float64):
    def prog(comm):
        tb = TensorParallelBlock(comm, D, A, FF, sequence_parallel=sp, act_dtype=act, recompute=recompute,
                                 dropout=dropout, seed=3)
        p = tb.shard(P)
        sl = slice(comm.rank * S // t, (comm.rank + 1) * S // t) if sp else slice(None)
        y, c = tb.forward(p, x[:, sl])
        dx, g = tb.backward(p, c, dy[:, sl])
        return y, dx, g, tb

    w = World(t)
    out = w.run(prog)
    y = np.concatenate([o[0] for o in out], axis=1) if sp else out[0][0]
    dx = np.concatenate([o[1] for o in out], axis=1) if sp else out[0][1]
    return w, out, y, dx


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_equals_the_single_device_block(t, sp, recompute):
    blk = nn.TransformerBlock(D, A, FF, dtype=np.float64)
    P = blk.init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D))
    y_ref, cache = blk.forward(P, x)
    dy = np.random.default_rng(2).standard_normal(y_ref.shape)
    dx_ref, g_ref = blk.backward(P, cache, dy)
    w, out, y, dx = run(t, sp, recompute, P, x, dy)
    assert np.allclose(y, y_ref) and np.allclose(dx, dx_ref)
    for _, _, g, tb in out:
        want = tb.shard(g_ref)
        assert all(np.allclose(g[k], want[k]) for k in want), [k for k in want if not np.allclose(g[k], want[k])]
    ops = [c.op for c in w.calls[0]]
    if t == 1:  # a group of one sends nothing (Megatron's mappings bypass a tensor-parallel world of 1)
        assert ops == []
    elif not sp:  # two all-reduces forward, two backward (and the forward's two again under full recompute)
        assert ops == ["all_reduce"] * (6 if recompute == "full" else 4)
        assert all(c.nbytes == x.nbytes for c in w.calls[0])
    else:  # all-reduce -> all-gather + reduce-scatter; one more all-reduce: the norms' and biases' gradients
        forward = ["all_gather", "reduce_scatter"] * 2  # gather before q/k/v and fc1, scatter after o and fc2
        backward = ["all_gather", "all_gather", "reduce_scatter", "all_gather", "all_gather", "reduce_scatter"]
        assert ops == forward * (2 if recompute == "full" else 1) + backward + ["all_reduce"]


@pytest.mark.parametrize("t", [2, 4])
def test_dropout_drops_the_same_elements_as_one_device(t):
    P = nn.TransformerBlock(D, A, FF, dtype=np.float64).init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D))
    dy = np.random.default_rng(2).standard_normal(x.shape)
    _, _, y1, dx1 = run(1, False, "none", P, x, dy, dropout=0.2)
    for sp in (False, True):
        _, _, y, dx = run(t, sp, "selective", P, x, dy, dropout=0.2)
        assert np.allclose(y, y1) and np.allclose(dx, dx1)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_float32_parameters_with_bf16_activations_reduce_their_partial_grads_in_float32(recompute):
    """A GPU user's standalone block: float32 weights, activations kept in bf16, sequence
    parallelism. The norms' and biases' partial gradients are float32 arrays, and their
    all-reduce is declared and sent as float32; the block still equals one device's."""
    blk = nn.TransformerBlock(D, A, FF, dtype=np.float32)
    P = blk.init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D)).astype(np.float32)
    y_ref, cache = blk.forward(P, x)
    dy = np.random.default_rng(2).standard_normal(y_ref.shape).astype(np.float32)
    dx_ref, g_ref = blk.backward(P, cache, dy)
    w, out, y, dx = run(2, True, recompute, P, x, dy, act=bfloat16)
    reduce = [c for c in w.calls[0] if c.op == "all_reduce"]
    partial = sum(v.size for k, v in out[0][3].shard(g_ref).items() if k.startswith("ln") or k.endswith(("o.b", "fc2.b")))
    assert len(reduce) == 1 and reduce[0].nbytes == 4 * partial
    scale = max(np.abs(dx_ref).max(), 1.0)
    assert np.abs(y - y_ref).max() < 0.05 * max(np.abs(y_ref).max(), 1.0) and np.abs(dx - dx_ref).max() < 0.05 * scale
    for _, _, g, tb in out:
        want = tb.shard(g_ref)
        assert all(g[k].dtype == np.float32 for k in want)
        assert all(np.abs(g[k] - want[k]).max() < 0.05 * max(np.abs(want[k]).max(), 1.0) for k in want), \
            [k for k in want if np.abs(g[k] - want[k]).max() >= 0.05 * max(np.abs(want[k]).max(), 1.0)]


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
@pytest.mark.parametrize("stack,attention", [("megatron-2021", "unfused"), ("megatron-core", "flash")])
def test_cache_equals_the_formula_term_by_term(t, sp, recompute, stack, attention):
    d, a, b, s = 32, 4, 2, 16
    P = nn.TransformerBlock(d, a, 4 * d).init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((b, s, d)).astype(np.float32)

    def prog(comm):
        tb = TensorParallelBlock(comm, d, a, 4 * d, sequence_parallel=sp, act_dtype=bfloat16, recompute=recompute,
                                 dropout=0.1)
        sl = slice(comm.rank * s // t, (comm.rank + 1) * s // t) if sp else slice(None)
        return cached_terms(tb.forward(tb.shard(P), x[:, sl])[1])

    for got in World(t, stack=stack).run(prog):
        got = {k.split(".")[-1]: v for k, v in got.items()}
        assert got == {k: int(v) for k, v in activation_terms(s, b, d, a, t, sp, recompute, attention).items()}


def test_contract_reproduces_problems_8_3_and_8_4():
    assert tp_bytes_per_layer(4, 8192, 8192, 8) / 1e9 == pytest.approx(3.76, abs=0.005)
    assert pp_bytes_per_boundary(4, 8192, 8192) / 1e9 == pytest.approx(0.54, abs=0.005)
    with_sp = activation_bytes_per_layer(4096, 1, 12288, 96, t=8, sp=True, recompute="selective")
    without = activation_bytes_per_layer(4096, 1, 12288, 96, t=8, sp=False, recompute="selective")
    assert with_sp / 1e6 == pytest.approx(214, abs=0.5) and 96 * with_sp / 1e9 == pytest.approx(20.5, abs=0.05)
    assert without / 1e6 == pytest.approx(654, abs=0.5) and 96 * without / 1e9 == pytest.approx(62.8, abs=0.05)
    sbh = 4096 * 12288
    assert activation_bytes_per_layer(4096, 1, 12288, 96) == sbh * (34 + 5 * 96 * 4096 / 12288)


@pytest.mark.parametrize("bad", [dict(recompute="some"), dict(t=5), dict(a=7), dict(s=0), dict(b=1.5)])
def test_bad_arguments_raise_value_error(bad):
    args = dict(s=4096, b=1, h=12288, a=96, t=8, sp=False, recompute="none")
    args.update(bad)
    with pytest.raises(ValueError):
        activation_bytes_per_layer(**args)


@pytest.mark.parametrize("sp", [False, True])
def test_split_and_whole_backward_agree_to_the_bit_in_bf16(sp):
    """B then W (a pipeline's split backward, the mesh's path) and the whole backward (the
    lessons' path) read the same gradients, kept in the activations' dtype: bit-equal
    results and dtypes under bf16 activations."""
    blk = nn.TransformerBlock(D, A, FF, dtype=np.float32)
    P = blk.init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D)).astype(np.float32)
    dy = np.random.default_rng(2).standard_normal((B, S, D)).astype(bfloat16)

    def prog(comm, split):
        tb = TensorParallelBlock(comm, D, A, FF, sequence_parallel=sp, act_dtype=bfloat16)
        p = tb.shard(P)
        sl = slice(comm.rank * S // 2, (comm.rank + 1) * S // 2) if sp else slice(None)
        _, c = tb.forward(p, x[:, sl])
        if split:
            return tb.backward_input(p, c, dy[:, sl]), tb.backward_weight(p, c, dy[:, sl])
        return tb.backward(p, c, dy[:, sl])

    for (dx1, g1), (dx2, g2) in zip(World(2).run(prog, True), World(2).run(prog, False)):
        assert np.array_equal(dx1, dx2) and dx1.dtype == dx2.dtype
        assert sorted(g1) == sorted(g2)
        assert all(np.array_equal(g1[k], g2[k]) and g1[k].dtype == g2[k].dtype for k in g1), \
            [k for k in g1 if not np.array_equal(g1[k], g2[k]) or g1[k].dtype != g2[k].dtype]
