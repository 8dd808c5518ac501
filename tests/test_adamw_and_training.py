"""AdamW against torch.optim.AdamW; mixed-precision bytes; a small GPT learns like torch's."""

import numpy as np
import pytest
import torch
from ml_dtypes import bfloat16

from emulator import nn
from emulator.records.memory import nbytes_of
from emulator.nn import torch_reference as R

pytestmark = pytest.mark.usefixtures("torch_float64")  # torch in float64, restored after each test


def test_adamw_matches_torch_over_10_steps():
    rng = np.random.default_rng(0)
    params = {"a": rng.standard_normal((3, 4)), "b": rng.standard_normal(5)}
    opt = nn.AdamW(lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    state = opt.init(params)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    topt = torch.optim.AdamW(tp.values(), lr=0.05, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    for step in range(10):
        grads = {k: rng.standard_normal(v.shape) for k, v in params.items()}
        params, state = opt.step(params, grads, state)
        for k, v in tp.items():
            v.grad = torch.tensor(grads[k])
        topt.step()
        for k in params:
            assert np.allclose(params[k], tp[k].detach().numpy(), atol=1e-12), (step, k)


def test_mixed_precision_costs_16_bytes_per_parameter():
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((32, 32)).astype(bfloat16), "b": np.zeros(7, bfloat16)}
    n = 32 * 32 + 7
    opt = nn.AdamW(lr=1e-2, mixed_precision=True)
    state = opt.init(params)
    grads = {k: rng.standard_normal(v.shape).astype(bfloat16) for k, v in params.items()}
    new, state = opt.step(params, grads, state)
    assert new["w"].dtype == bfloat16 and state["master"]["w"].dtype == np.float32
    per_param = (nbytes_of(new) + nbytes_of(grads) + nbytes_of({k: state[k] for k in ("master", "m", "v")})) / n
    assert per_param == 16
    # the update happened in fp32 on the master copy, then was rounded to bf16
    assert np.array_equal(new["w"], state["master"]["w"].astype(bfloat16))
    with pytest.raises(ValueError, match="pass 16-bit parameters"):
        opt.init({"w": np.zeros(3, np.float32)})


def corpus(batch, seq, vocab, rng):
    """A repeating pattern with a random phase per row: the next token is predictable."""
    pattern = np.array([1, 4, 2, 7, 3, 5, 0, 6])[:vocab]
    starts = rng.integers(0, len(pattern), batch)
    idx = np.stack([np.roll(np.tile(pattern, seq // len(pattern) + 2), -s)[: seq + 1] for s in starts])
    return idx[:, :-1], idx[:, 1:]


def test_small_gpt_learns_and_matches_torch():
    V, D, H, FF, L, S, B, steps = 8, 16, 2, 32, 2, 16, 4, 150
    gpt = nn.GPT(V, D, H, FF, L, max_seq=S, dtype=np.float64)
    params = gpt.init(np.random.default_rng(0))
    opt = nn.AdamW(lr=1e-2, weight_decay=0.0)
    state = opt.init(params)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    topt = torch.optim.AdamW(tp.values(), lr=1e-2, weight_decay=0.0)
    rng = np.random.default_rng(1)
    losses, tlosses = [], []
    for _ in range(steps):
        x, y = corpus(B, S, V, rng)
        logits, cache = gpt.forward(params, x)
        loss, lcache = nn.cross_entropy(logits, y)
        _, grads = gpt.backward(params, cache, nn.cross_entropy_backward(lcache))
        params, state = opt.step(params, grads, state)
        losses.append(loss)
        topt.zero_grad()
        tl = torch.nn.functional.cross_entropy(R.gpt(tp, torch.tensor(x), L, H).reshape(-1, V),
                                               torch.tensor(y).reshape(-1))
        tl.backward()
        topt.step()
        tlosses.append(tl.item())
    assert losses[-1] < 0.1 * losses[0], f"loss went {losses[0]:.3f} -> {losses[-1]:.3f}"
    assert np.allclose(losses, tlosses, rtol=1e-6, atol=1e-8)
