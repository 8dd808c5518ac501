"""The variants published models use, against torch.autograd (float64): grouped-query
attention, the SwiGLU MLP, MoE blocks with SwiGLU experts and the load-balancing loss in
a GPT; the auxiliary loss's gradient scaled as the loss is."""

import numpy as np
import pytest
import torch

from emulator import ConfigError, nn
from emulator.nn import torch_reference as R
from test_nn import B, D, S, check, x3

pytestmark = pytest.mark.usefixtures("torch_float64")  # torch in float64, restored after each test


@pytest.mark.parametrize("n_kv_heads", [1, 2, 4])
def test_grouped_query_attention(n_kv_heads):
    att = nn.Attention(D, 4, causal=True, dtype=np.float64, n_kv_heads=n_kv_heads)
    assert att.init(np.random.default_rng(0))["k.w"].shape == (D, n_kv_heads * D // 4)
    check(att, x3(), lambda p, x: R.attention(p, x, causal=True, n_heads=4, n_kv_heads=n_kv_heads))


def test_swiglu_mlp():
    check(nn.SwiGLU(D, 12, dtype=np.float64), x3(), lambda p, x: R.mlp(p, x, kind="swiglu"))


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_moe_block_with_swiglu_or_gelu_experts(mlp):
    blk = nn.TransformerBlock(D, 4, 12, dtype=np.float64, n_kv_heads=2, mlp=mlp, n_experts=4, top_k=2)
    check(blk, x3(), lambda p, x: R.block(p, x, n_heads=4, n_kv_heads=2, mlp_kind=mlp, n_experts=4, top_k=2))


def test_bad_variants_are_refused():
    with pytest.raises(ConfigError, match="n_kv_heads"):
        nn.Attention(D, 4, n_kv_heads=3)
    with pytest.raises(ConfigError, match="mlp"):
        nn.TransformerBlock(D, 4, 12, mlp="relu")


def _gpt(**kw):
    return nn.GPT(13, D, 4, 12, 2, S, dtype=np.float64, n_kv_heads=2, mlp="swiglu", n_experts=4, top_k=2, **kw)


@pytest.mark.parametrize("groups", [1, 2])
def test_gpt_with_moe_and_aux_loss_equals_torch(groups):
    """The loss of a step of ``groups`` equal micro-batches is the mean of their
    (cross-entropy + coef x the sum of the layers' load-balancing losses): the auxiliary
    gradient must carry the 1/groups the cross-entropy's does."""
    coef = 0.3
    model = _gpt(aux_loss_coef=coef, capacity_factor=1.5)
    params = model.init(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, 13, (2 * groups, S)), rng.integers(0, 13, (2 * groups, S))
    grads = {k: 0 for k in params}
    for g in range(groups):
        part = slice(2 * g, 2 * g + 2)
        logits, cache = model.forward(params, x[part])
        _, lc = nn.cross_entropy(logits, y[part])
        nn.scale_aux_loss(cache, 1 / groups)
        _, gr = model.backward(params, cache, nn.cross_entropy_backward(lc, 1 / groups))
        grads = {k: grads[k] + gr[k] for k in params}
    tp = R.to_torch(params)
    total = 0
    for g in range(groups):
        aux = []
        part = torch.tensor(x[2 * g:2 * g + 2])
        logits = R.gpt(tp, part, 2, 4, aux=aux, n_kv_heads=2, mlp_kind="swiglu", n_experts=4, top_k=2,
                       capacity_factor=1.5)
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, 13), torch.tensor(y[2 * g:2 * g + 2]).reshape(-1))
        total = total + (ce + coef * sum(aux)) / groups
    total.backward()
    for k in params:
        assert np.allclose(grads[k], tp[k].grad.numpy(), atol=1e-10), k


def test_without_the_aux_scale_the_router_gradient_is_wrong():
    """The check above fails when the auxiliary gradient ignores the loss scale."""
    model = _gpt(aux_loss_coef=0.3)
    params = model.init(np.random.default_rng(0))
    x = np.random.default_rng(1).integers(0, 13, (2, S))
    logits, cache = model.forward(params, x)
    _, lc = nn.cross_entropy(logits, x)
    _, scaled = model.backward(params, cache, nn.cross_entropy_backward(lc, 0.5))
    logits, cache = model.forward(params, x)
    nn.scale_aux_loss(cache, 0.5)
    _, right = model.backward(params, cache, nn.cross_entropy_backward(lc, 0.5))
    assert not np.allclose(scaled["blocks.0.mlp.router.w"], right["blocks.0.mlp.router.w"])
    # the last block's experts see no auxiliary gradient at all (it enters at the routers)
    assert np.array_equal(scaled["blocks.1.mlp.experts.up.w"], right["blocks.1.mlp.experts.up.w"])
