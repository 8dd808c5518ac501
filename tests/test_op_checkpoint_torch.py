"""The per-op checkpoint against PyTorch's own: a Llama block written as torchtitan writes it,
wrapped in ``torch.utils.checkpoint`` with torchtitan's policy (``_save_list`` and
``_custom_policy`` of parallelize_llama.py at 9dec370), keeps exactly the ops
:mod:`emulator.parallel.tensor_parallel.op_checkpoint` says, in the same order, and exactly
the bytes the planner counts; its gradients equal the block's without checkpointing. CPU,
float32: torch's CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) stands
in the list for the CUDA one."""

from collections import defaultdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts  # noqa: E402

from emulator.parallel import ParallelDims  # noqa: E402
from emulator.parallel.tensor_parallel import op_checkpoint  # noqa: E402
from emulator.planner import ModelSpec  # noqa: E402
from emulator.planner.layers import rank_layers  # noqa: E402
from emulator.planner.precision_of import plan_context  # noqa: E402

D, HEADS, KV, FF, B, S = 64, 4, 2, 160, 2, 32
aten = torch.ops.aten
SAVE = {aten.mm.default, aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_flash_attention.default, aten._scaled_dot_product_flash_attention_for_cpu.default,
        torch.ops._c10d_functional.reduce_scatter_tensor.default, aten.abs.default, aten.max.default}


class LlamaBlock(torch.nn.Module):
    """torchtitan's TransformerBlock without RoPE (elementwise: run again either way)."""

    def __init__(self):
        super().__init__()
        dh = D // HEADS
        self.attention_norm, self.ffn_norm = torch.nn.RMSNorm(D), torch.nn.RMSNorm(D)
        self.wq, self.wo = torch.nn.Linear(D, D, bias=False), torch.nn.Linear(D, D, bias=False)
        self.wk, self.wv = torch.nn.Linear(D, KV * dh, bias=False), torch.nn.Linear(D, KV * dh, bias=False)
        self.w1, self.w3 = torch.nn.Linear(D, FF, bias=False), torch.nn.Linear(D, FF, bias=False)
        self.w2 = torch.nn.Linear(FF, D, bias=False)

    def attention(self, x):
        b, s, _ = x.shape
        xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)
        q = xq.view(b, s, HEADS, -1).transpose(1, 2)
        k, v = (t.view(b, s, KV, -1).repeat_interleave(HEADS // KV, dim=2).transpose(1, 2) for t in (xk, xv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))

    def forward(self, x):
        h = x + self.attention(self.attention_norm(x))
        z = self.ffn_norm(h)
        return h + self.w2(F.silu(self.w1(z)) * self.w3(z))


def torchtitan_policy(kept):
    """torchtitan's ``_custom_policy`` (a fresh count per checkpointed call), recording what
    the forward keeps: (op, its output's bytes)."""
    meta = defaultdict(int)

    def policy(ctx, func, *args, **kwargs):
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == aten.mm.default:
            meta[f"{mode}_mm_count"] += 1
        to_save = func in SAVE and not (func == aten.mm.default and meta[f"{mode}_mm_count"] % 2 == 0)
        if to_save and not ctx.is_recompute:
            outs = ctx.op_output if isinstance(ctx.op_output, (tuple, list)) else (ctx.op_output,)
            kept.append((func, sum(t.nbytes for t in outs if isinstance(t, torch.Tensor))))
        return CheckpointPolicy.MUST_SAVE if to_save else CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def run(checkpointed):
    torch.manual_seed(0)
    block = LlamaBlock().to(torch.float32)  # whatever default dtype another test left behind
    x = torch.randn(B, S, D, dtype=torch.float32, requires_grad=True)
    kept = []
    if checkpointed:
        y = checkpoint(block, x, use_reentrant=False, context_fn=lambda: torchtitan_policy(kept))
    else:
        y = block(x)
    y.square().sum().backward()
    return kept, x.grad, {n: p.grad for n, p in block.named_parameters()}


def emulator_kept():
    model = ModelSpec(1, D, HEADS, FF, 64, n_kv_heads=KV, mlp="swiglu", norm="rmsnorm", bias=False)
    layer = rank_layers(model.with_seq(S), ParallelDims(recompute="op"), B, S, plan_context("pytorch-eager",
                                                                                             param_bytes=4),
                        ["blocks.0"])[0]
    return op_checkpoint.split_forward(layer.ops["F"])[0], layer


def test_torch_keeps_the_ops_and_the_bytes_the_emulator_counts():
    kept, _, _ = run(True)
    mine, layer = emulator_kept()
    assert [x.name for x in mine] == ["attention: qkv: q", "attention: qkv: v", "attention: core", "mlp: fc1: gate",
                                      "mlp: fc2"]
    # op by op, in order: wq's, wv's, SDPA's (its output and log-sum-exp), w1's and w2's outputs, to the byte
    torch_ops = [("attention" if "attention" in str(f) else "gemm", n) for f, n in kept]
    assert torch_ops == [(x.kind, op_checkpoint.saved_bytes([x], 4)) for x in mine]
    assert layer.kept == B * S * D * 4 + sum(n for _, n in kept)  # and the block's input, which the checkpoint keeps


def test_torchs_checkpointed_gradients_equal_the_plain_ones():
    _, dx, grads = run(True)
    _, dx_ref, ref = run(False)
    assert torch.allclose(dx, dx_ref, atol=1e-6) and all(torch.allclose(grads[k], ref[k], atol=1e-6) for k in ref)
    assert np.isfinite(dx.numpy()).all()
