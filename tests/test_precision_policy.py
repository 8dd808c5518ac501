"""The precision policy: a bf16 run sends bf16 where Megatron does and fp32 where it forces
it, its numbers stay within a stated bound of the float64 run and of torch in bf16, and the
ledger holds the bytes per parameter the policy says."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import ConfigError, nn
from emulator.machine.precision import Precision, precision_preset, shorthand
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.training import synthetic_batches

SHAPE = dict(vocab=64, d_model=32, n_heads=4, d_ff=64, n_layers=2, max_seq=8)
DIMS = ParallelDims(dp=2, tp=2, sequence_parallel=True)


def _run(dtype, precision=None, steps=2, dims=DIMS):
    params = nn.GPT(**SHAPE, dtype=np.float64).init(np.random.default_rng(0))
    model = nn.GPT(**SHAPE, dtype=dtype)
    mixed = np.dtype(dtype) == np.dtype(bfloat16)
    return run_on_mesh(model, {k: v.astype(dtype) for k, v in params.items()}, synthetic_batches(steps, 4, 8, 64),
                       dims, nn.AdamW(lr=1e-3, mixed_precision=mixed), precision=precision)


def test_a_bf16_run_sends_what_megatron_sends():
    """Under Megatron's bf16 policy the tensor-parallel payloads are bf16 (2 bytes a value),
    the data-parallel gradients fp32 (4): ``--bf16`` forces fp32 reduction. A float64 run
    keeps float64 everywhere unless a policy is passed."""
    bf16, f64 = _run(bfloat16), _run(np.float64)
    assert bf16.world.precision.name == "megatron-bf16" and f64.world.precision is None
    for run, tp_bytes, dp_bytes in ((bf16, 2, 4), (f64, 8, 8)):
        tp = [c for c in run.world.calls[0] if c.group == "tp" and c.op in ("reduce_scatter", "all_gather")]
        dp = [c for c in run.world.calls[0] if c.group == "dp,cp"]
        rows = 2 * 8  # a replica's 2 sequences of 8 positions; its tp collectives carry (rows, d)
        assert tp and all(c.nbytes in (rows * 32 * tp_bytes, rows * 32 * tp_bytes // 2) for c in tp), tp
        assert dp and all(c.nbytes % dp_bytes == 0 for c in dp)
    dp = [c for c in bf16.world.calls[0] if c.group == "dp,cp" and c.op == "all_reduce"]
    weights = sum(int(np.prod(v.shape)) for k, v in bf16.params.items() if not k.startswith(("embed", "head")))
    assert sum(c.nbytes for c in dp) >= 4 * weights / 2  # fp32 gradients of this rank's half of the blocks


def test_bf16_stays_within_a_stated_bound_of_float64():
    """Two AdamW steps in bf16 (Megatron's policy: fp32 master weights, moments and gradient
    reduction; bf16 weights, activations and tensor-parallel payloads) against float64:
    every weight within four learning rates (Adam steps by about lr whatever the gradient's
    size, so where a gradient is rounding noise the two runs may step opposite ways, twice)
    plus one bf16 rounding of its size (bf16 keeps 8 significant bits: a relative step of
    2**-8), and the losses within 2%."""
    bf16, f64 = _run(bfloat16), _run(np.float64)
    for k, ref in f64.params.items():
        got = bf16.params[k].astype(np.float64)
        bound = 4 * 1e-3 + 2.0 ** -8 * np.abs(ref)
        assert np.all(np.abs(got - ref) <= bound), (k, float(np.max(np.abs(got - ref) - bound)))
    assert np.allclose(bf16.losses, f64.losses, rtol=0.02)
    assert not np.allclose(bf16.losses, f64.losses, rtol=1e-9)  # bf16 is not float64 in disguise


def test_bf16_forward_is_within_a_stated_bound_of_torch_in_bf16():
    """One forward of the same weights: the emulator's bf16 run (one device, no parallelism)
    against torch computing in bf16 on the CPU: losses within 1%."""
    torch = pytest.importorskip("torch")
    from emulator.nn import torch_reference as R

    params = nn.GPT(**SHAPE, dtype=np.float64).init(np.random.default_rng(0))
    x, y = synthetic_batches(1, 4, 8, 64)[0]
    run = _run(bfloat16, steps=1, dims=ParallelDims())
    tp = {k: torch.tensor(v.astype(np.float32)).to(torch.bfloat16) for k, v in params.items()}
    logits = R.gpt(tp, torch.tensor(x), SHAPE["n_layers"], SHAPE["n_heads"])
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, SHAPE["vocab"]), torch.tensor(y).reshape(-1))
    assert run.losses[0] == pytest.approx(float(loss), rel=0.01)


@pytest.mark.parametrize("policy,per_param", [("zero-mixed", 16), ("megatron-bf16", 18)])
def test_the_ledger_holds_the_policys_bytes_per_parameter(policy, per_param):
    """DDP under mixed-precision Adam: weights, gradients and the optimizer's master copy and
    moments, measured in the ledger, are the policy's bytes per parameter: the ZeRO paper's
    2 + 2 + 12 = 16 (lesson 01), Megatron's 2 + 4 + 12 = 18."""
    run = _run(bfloat16, precision=policy, steps=1, dims=ParallelDims(dp=2))
    led = run.world.memory[0]
    n = sum(int(np.prod(v.shape)) for v in run.params.values())
    held = {k: led.peak_breakdown[k] for k in ("params", "grads", "optimizer")}
    assert held["params"] == 2 * n and held["optimizer"] == 12 * n
    assert held["grads"] == (per_param - 14) * n
    assert precision_preset(policy).bytes_per_param() == {"params": 2, "grads": per_param - 14, "optimizer": 12}


def test_policies_that_cannot_run_are_refused():
    with pytest.raises(ConfigError, match="unknown dtype"):
        Precision("odd", params="bf17")
    with pytest.raises(ConfigError, match="master"):
        Precision("odd", params="fp32", master="fp32")
    with pytest.raises(ConfigError, match="no policy 'int4'"):
        precision_preset("int4")
    with pytest.raises(ConfigError, match="param_bytes"):
        shorthand(3, True)
    assert shorthand(2, True).name == "zero-mixed" and shorthand(4, False).name == "fp32" and shorthand() is None
