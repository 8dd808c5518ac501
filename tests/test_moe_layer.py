"""The MoE layer against torch autograd: its forward and backward, its capacity and what it
drops, its load-balancing loss (expert parallelism against this layer: tests/test_moe.py)."""

import numpy as np
import pytest
import torch

from emulator import ConfigError, nn
from emulator.nn import torch_reference as R
from tests._moe import layer

SHAPES = [(4, 1, None), (4, 2, None), (8, 2, 1.0), (8, 2, 0.5), (6, 2, 1.25), (4, 4, None), (8, 1, 2.0)]


@pytest.mark.parametrize("n_experts, top_k, cf", SHAPES)
def test_moe_equals_torch_autograd(n_experts, top_k, cf):
    moe, p = layer(n_experts, top_k, cf)
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((3, 10, 8)), rng.standard_normal((3, 10, 8))
    y, cache = moe.forward(p, x)
    dx, grads = moe.backward(p, cache, dy)
    tp = R.to_torch(p)
    tx = torch.tensor(x.reshape(-1, 8), requires_grad=True)
    ty = R.moe(tp, tx, top_k, cf)
    (ty * torch.tensor(dy.reshape(-1, 8))).sum().backward()
    np.testing.assert_allclose(y.reshape(-1, 8), ty.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(dx.reshape(-1, 8), tx.grad.numpy(), atol=1e-12)
    for k, g in grads.items():
        np.testing.assert_allclose(g, tp[k].grad.numpy(), atol=1e-12, err_msg=k)
    assert cache["counts"].sum() + cache["dropped"] == 30 * top_k
    if cf is not None:
        assert cache["counts"].max() <= int(np.ceil(cf * 30 * top_k / n_experts))


def test_b_then_w_equals_backward_and_flops_count_active_experts():
    moe, p = layer(4, 2, None)
    x = np.random.default_rng(3).standard_normal((2, 6, 8))
    y, c1 = moe.forward(p, x)
    dx, g = moe.backward(p, c1, np.ones_like(y))
    _, c2 = moe.forward(p, x)
    dx2 = moe.backward_input(p, c2, np.ones_like(y))
    g2 = moe.backward_weight(p, c2, np.ones_like(y))
    assert np.allclose(dx, dx2) and all(np.allclose(g[k], g2[k]) for k in g)
    f = moe.flops((12, 8))
    assert f["forward"] == 2 * 12 * 8 * 4 + 2 * 12 * 2 * 2 * 8 * 16  # router + k experts per token
    assert moe.active_parameters() < moe.parameters()


def test_capacity_drops_first_come_first_served():
    moe = nn.MoE(2, 2, 2, 1, capacity_factor=1.0, dtype=np.float64)
    p = {"router.w": np.array([[10.0, -10.0], [0.0, 0.0]]), "experts.fc1.w": np.ones((2, 2, 2)),
         "experts.fc1.b": np.zeros((2, 2)), "experts.fc2.w": np.ones((2, 2, 2)), "experts.fc2.b": np.zeros((2, 2))}
    x = np.array([[1.0, 0], [1.0, 0], [1.0, 0], [-1.0, 0]])  # three tokens want expert 0, capacity is 2
    y, cache = moe.forward(p, x)
    assert cache["dropped"] == 1 and cache["counts"].tolist() == [2, 1]
    assert np.all(y[2] == 0) and np.all(y[0] != 0)  # the third token in line gets nothing


def test_load_balancing_loss_and_its_gradient():
    moe, p = layer(4, 1, None, aux=0.01)
    x = np.random.default_rng(4).standard_normal((20, 8))
    y, cache = moe.forward(p, x)
    assert cache["aux_loss"] >= 1.0 - 1e-12  # E sum f P is at least 1 (equal when balanced)
    _, g = moe.backward(p, cache, np.zeros_like(y))
    eps, w = 1e-6, p["router.w"].copy()

    def aux(wr):
        return moe.forward(dict(p, **{"router.w": wr}), x)[1]["aux_loss"]

    num = np.zeros_like(w)  # f is counted, not differentiated: its gradient flows through P only
    for i in np.ndindex(w.shape):
        d = np.zeros_like(w)
        d[i] = eps
        _, c_plus = moe.forward(dict(p, **{"router.w": w + d}), x)
        p_plus = c_plus["route"]["p"].mean(0)
        p_minus = moe.forward(dict(p, **{"router.w": w - d}), x)[1]["route"]["p"].mean(0)
        f = np.bincount(cache["route"]["idx"].ravel(), minlength=4) / 20
        num[i] = 0.01 * 4 * (f * (p_plus - p_minus)).sum() / (2 * eps)
    np.testing.assert_allclose(g["router.w"], num, rtol=1e-5, atol=1e-10)
    assert aux(w) == pytest.approx(cache["aux_loss"])


def test_bad_moe_arguments_raise_value_error():
    for args, words in [((8, 16, 4, 5), "top_k"), ((8, 16, 0, 1), "n_experts"), ((8, 16, 4, 1, -1.0), "capacity")]:
        with pytest.raises(ValueError, match=words):
            nn.MoE(*args)
    with pytest.raises(ValueError, match="last dim"):
        nn.MoE(8, 16, 4, 1).forward(nn.MoE(8, 16, 4, 1).init(np.random.default_rng(0)), np.zeros((2, 5)))


def test_capacity_ignores_float_noise_in_the_factor():
    from emulator.nn.moe import capacity

    # a slider sends 1.2500000000000002 for 1.25: still 320 = ceil(1.25 * 1024 * 2 / 8), not 321
    assert capacity(1024, 2, 8, 1.25) == capacity(1024, 2, 8, 1.2500000000000002) == 320
    assert capacity(1024, 2, 8, 1.26) == 323 and capacity(1024, 2, 8, None) is None


@pytest.mark.parametrize("top_k, cap", [(1, 2), (2, 3), (2, 0), (3, 5), (2, None)])
def test_gshard_capacity_serves_every_first_choice_before_any_second(top_k, cap):
    from emulator.nn.moe import keep_first, keep_first_choices_first

    rng = np.random.default_rng(top_k * 10 + (cap or 0))
    n_experts, tokens = 4, 30
    ids = np.concatenate([rng.permutation(n_experts)[:top_k] for _ in range(tokens)])
    keep = keep_first_choices_first(ids, n_experts, cap, top_k)
    seen = np.zeros(n_experts, int)
    want = np.zeros(len(ids), bool)
    for choice in range(top_k):  # brute force: choice by choice, token by token
        for t in range(tokens):
            i = t * top_k + choice
            want[i] = cap is None or seen[ids[i]] < cap
            seen[ids[i]] += 1
    np.testing.assert_array_equal(keep, want)
    first = keep_first(ids, n_experts, cap)
    assert keep.sum() == first.sum()  # each expert keeps min(count, cap) either way: the same number dropped
    if top_k == 1:
        np.testing.assert_array_equal(keep, first)
        return
    choice = np.tile(np.arange(top_k), tokens)
    for e in range(n_experts):  # an expert never drops a first choice while it keeps a later one
        assert not (((ids == e) & (choice == 0) & ~keep).any() and ((ids == e) & (choice > 0) & keep).any())
    with pytest.raises(ConfigError, match="whole tokens"):
        keep_first_choices_first(ids[:-1], n_experts, cap, top_k)
