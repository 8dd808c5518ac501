"""Model pieces against torch.autograd on the same weights and inputs (float64)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from emulator import nn
from emulator.nn import torch_reference as R

pytestmark = pytest.mark.usefixtures("torch_float64")  # torch in float64, restored after each test
RNG = np.random.default_rng(0)
B, S, D, H, FF, V = 2, 5, 8, 2, 12, 11


def t(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def torch_grads(y, dy, tensors):
    y.backward(torch.tensor(dy))
    return {k: v.grad.numpy() for k, v in tensors.items()}


def check(module, x, torch_fn, x_is_float=True):
    params = module.init(np.random.default_rng(1))
    params = {k: v + RNG.standard_normal(v.shape) * 0.1 for k, v in params.items()}  # not just ones/zeros
    y, cache = module.forward(params, x)
    dy = RNG.standard_normal(y.shape)
    dx, grads = module.backward(params, cache, dy)
    tp = {k: t(v) for k, v in params.items()}
    tx = t(x) if x_is_float else torch.tensor(x)
    ty = torch_fn(tp, tx)
    assert np.allclose(y, ty.detach().numpy(), atol=1e-10), "forward differs"
    tg = torch_grads(ty, dy, {**tp, **({"__x": tx} if x_is_float else {})})
    assert set(grads) == set(params) and all(grads[k].shape == params[k].shape for k in params)
    for k in params:
        assert np.allclose(grads[k], tg[k], atol=1e-9), f"grad of {k} differs"
    if x_is_float:
        assert np.allclose(dx, tg["__x"], atol=1e-9), "input grad differs"
    # B then W is backward, on a fresh cache
    y2, cache2 = module.forward(params, x)
    dx_b = module.backward_input(params, cache2, dy)
    g_w = module.backward_weight(params, cache2, dy)
    assert (dx_b is None and dx is None) or np.array_equal(dx_b, dx)
    assert all(np.array_equal(g_w[k], grads[k]) for k in grads)
    # W alone (without B first) also works
    _, cache3 = module.forward(params, x)
    g_alone = module.backward_weight(params, cache3, dy)
    assert all(np.allclose(g_alone[k], grads[k]) for k in grads)


def lin(p, x, pre=""):
    return R.linear(p, x, pre)


def ln(p, x, pre=""):
    return R.layer_norm(p, x, pre)


def attn(p, x, causal=False):
    return R.attention(p, x, causal=causal, n_heads=H)


def mlp(p, x):
    return R.mlp(p, x)


def block(p, x):
    return R.block(p, x, n_heads=H)


def x3():
    return RNG.standard_normal((B, S, D))


def test_linear():
    check(nn.Linear(D, 6, dtype=np.float64), x3(), lambda p, x: lin(p, x))
    check(nn.Linear(D, 6, bias=False, dtype=np.float64), x3(), lambda p, x: lin(p, x))


def test_gelu_layernorm_embedding():
    check(nn.GELU(), x3(), lambda p, x: F.gelu(x, approximate="tanh"))
    check(nn.LayerNorm(D, dtype=np.float64), x3(), ln)
    idx = RNG.integers(0, V, (B, S))
    check(nn.Embedding(V, D, dtype=np.float64), idx, lambda p, i: p["w"][i], x_is_float=False)


@pytest.mark.parametrize("causal", [False, True])
def test_attention(causal):
    check(nn.Attention(D, H, causal=causal, dtype=np.float64), x3(), lambda p, x: attn(p, x, causal=causal))


def test_causal_mask_hides_the_future():
    a = nn.Attention(D, H, causal=True, dtype=np.float64)
    p = a.init(np.random.default_rng(0))
    x = x3()
    y1, _ = a.forward(p, x)
    x2 = x.copy()
    x2[:, -1] += 5.0  # change only the last position
    y2, _ = a.forward(p, x2)
    assert np.allclose(y1[:, :-1], y2[:, :-1]) and not np.allclose(y1[:, -1], y2[:, -1])


def test_mlp_and_block():
    check(nn.MLP(D, FF, dtype=np.float64), x3(), mlp)
    check(nn.TransformerBlock(D, H, FF, dtype=np.float64), x3(), block)


def test_gpt_and_cross_entropy():
    L = 2
    gpt = nn.GPT(V, D, H, FF, L, max_seq=S, dtype=np.float64)
    idx = RNG.integers(0, V, (B, S))
    check(gpt, idx, lambda p, i: R.gpt(p, i, L, H), x_is_float=False)
    assert [name for name, _ in gpt.layers] == ["embed", "blocks.0", "blocks.1", "head"]
    logits = RNG.standard_normal((B, S, V))
    targets = RNG.integers(0, V, (B, S))
    loss, cache = nn.cross_entropy(logits, targets)
    tl = t(logits)
    ref = F.cross_entropy(tl.reshape(-1, V), torch.tensor(targets).reshape(-1))
    ref.backward()
    assert np.isclose(loss, ref.item())
    assert np.allclose(nn.cross_entropy_backward(cache), tl.grad.numpy())


def test_float32_is_the_default():
    gpt = nn.GPT(V, D, H, FF, 1, max_seq=S)
    p = gpt.init(np.random.default_rng(0))
    assert all(v.dtype == np.float32 for v in p.values())
    y, cache = gpt.forward(p, RNG.integers(0, V, (B, S)))
    _, grads = gpt.backward(p, cache, np.ones_like(y))
    assert y.dtype == np.float32 and all(g.dtype == np.float32 for g in grads.values())


def test_same_seed_same_values():
    a = nn.GPT(V, D, H, FF, 2, S).init(np.random.default_rng(7))
    b = nn.GPT(V, D, H, FF, 2, S).init(np.random.default_rng(7))
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_shapes_that_do_not_fit():
    with pytest.raises(ValueError, match="d_model \\(10\\) must be divisible by n_heads \\(4\\)"):
        nn.Attention(10, 4)
    with pytest.raises(ValueError, match="divisible"):
        nn.GPT(V, 10, 3, FF, 1, S)
    blk = nn.TransformerBlock(D, H, FF)
    p = blk.init(np.random.default_rng(0))
    with pytest.raises(ValueError, match="3-d input \\(batch, seq, d_model\\), got shape \\(5, 8\\)"):
        blk.forward(p, np.zeros((5, D)))
    with pytest.raises(ValueError, match="last dim is 8, got shape \\(2, 5, 7\\)"):
        nn.Linear(D, 3).forward(nn.Linear(D, 3).init(np.random.default_rng(0)), np.zeros((2, 5, 7)))
    gpt = nn.GPT(V, D, H, FF, 1, max_seq=4)
    with pytest.raises(ValueError, match="exceeds max_seq 4"):
        gpt.forward(gpt.init(np.random.default_rng(0)), np.zeros((1, 5), int))


@pytest.mark.parametrize("causal", [False, True])
def test_attention_core_on_blocks_equals_full_attention(causal):
    """Split queries and keys into blocks at their sequence positions: the core on each
    (query block, all keys) gives the rows of full attention; gradients too."""
    core = nn.AttentionCore(causal)
    q, k, v = (RNG.standard_normal((B, H, 6, 4)) for _ in range(3))
    o, cache = core.forward({}, (q, k, v))
    do = RNG.standard_normal(o.shape)
    dq, dk, dv = core.backward_input({}, cache, do)
    tq, tk, tv = t(q), t(k), t(v)
    to = F.scaled_dot_product_attention(tq, tk, tv, is_causal=causal)
    to.backward(torch.tensor(do))
    assert np.allclose(o, to.detach().numpy()) and np.allclose(dq, tq.grad.numpy())
    assert np.allclose(dk, tk.grad.numpy()) and np.allclose(dv, tv.grad.numpy())
    for start in (2, 4):  # the last queries against the keys up to them
        o_blk, _ = core.forward({}, (q[:, :, start:], k, v), q_start=start)
        assert np.allclose(o_blk, o[:, :, start:])
    if causal:
        with pytest.raises(ValueError, match="see no key"):
            core.forward({}, (q[:, :, :2], k[:, :, 4:], v[:, :, 4:]), q_start=0, k_start=4)


def test_flops_count_the_matmuls_and_the_attention_square():
    b, s, L = 2, 16, 2
    gpt = nn.GPT(V, D, H, FF, L, max_seq=s)
    p = gpt.init(np.random.default_rng(0))
    dense = sum(v.size for k, v in p.items() if k.endswith(".w") and not k.startswith("embed"))
    f = gpt.flops((b, s))
    attention = 4 * b * s * s * D * L  # q k^T and p v, 2 FLOPs per multiply-add
    assert f["forward"] == 2 * dense * b * s + attention
    assert f["backward_input"] == 2 * dense * b * s + 2 * attention and f["backward_weight"] == 2 * dense * b * s
    assert nn.total_flops(f) == 6 * dense * b * s + 3 * attention  # the 6ND rule, plus attention
    assert nn.LayerNorm(D).flops((b, s, D)) == {"forward": 0, "backward_input": 0, "backward_weight": 0}


def test_cache_bytes_name_every_tensor_once():
    blk = nn.TransformerBlock(D, H, FF, dtype=np.float64)
    x = x3()
    _, cache = blk.forward(blk.init(np.random.default_rng(0)), x)
    got = nn.cache_bytes(cache)
    act = x.nbytes  # (b, s, d) in float64
    assert got["attn.core.p"] == B * H * S * S * 8 and got["mlp.act.t"] == act * FF // D
    assert "attn.k.x" not in got and got["attn.q.x"] == act  # q, k, v share their input: once
    from emulator.records.memory import nbytes_of

    assert nbytes_of(cache) == sum(got.values())  # the ledger counts the same way


def test_linear_without_bias_params_adds_no_bias():
    """A row-parallel layer adds its bias once, after the reduce: without "b" none is added."""
    lin = nn.Linear(D, 3, dtype=np.float64)
    p = lin.init(np.random.default_rng(0))
    p["b"] += 1.0
    x = x3()
    full, _ = lin.forward(p, x)
    partial = sum(lin.forward({"w": p["w"][i::2]}, x[..., i::2])[0] for i in range(2))
    assert np.allclose(partial + p["b"], full)
