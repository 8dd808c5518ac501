"""The same models in torch, written functionally over a dict of tensors with the same keys
as :mod:`emulator.nn`. Tests check gradients against these with torch.autograd; GPU labs
and benchmarks run them. Needs torch (imported here, not by ``emulator.nn``)."""

import torch
import torch.nn.functional as F


def linear(p, x, pre=""):
    y = x @ p[pre + "w"]
    return y + p[pre + "b"] if pre + "b" in p else y


def layer_norm(p, x, pre=""):
    return F.layer_norm(x, (x.shape[-1],), p[pre + "g"], p[pre + "b"], eps=1e-5)


def attention(p, x, pre="", causal=False, n_heads=1):
    b, s, d = x.shape
    q, k, v = (linear(p, x, f"{pre}{n}.").reshape(b, s, n_heads, -1).transpose(1, 2) for n in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return linear(p, o.transpose(1, 2).reshape(b, s, d), pre + "o.")


def mlp(p, x, pre=""):
    return linear(p, F.gelu(linear(p, x, pre + "fc1."), approximate="tanh"), pre + "fc2.")


def block(p, x, pre="", n_heads=1):
    h = x + attention(p, layer_norm(p, x, pre + "ln1."), pre + "attn.", causal=True, n_heads=n_heads)
    return h + mlp(p, layer_norm(p, h, pre + "ln2."), pre + "mlp.")


def gpt(p, idx, n_layers, n_heads):
    """logits of :class:`emulator.nn.GPT` for token ids ``idx`` (a LongTensor)."""
    x = p["embed.tok.w"][idx] + p["embed.pos.w"][: idx.shape[1]]
    for i in range(n_layers):
        x = block(p, x, f"blocks.{i}.", n_heads)
    return layer_norm(p, x, "head.ln.") @ p["head.proj.w"]


def to_torch(params, requires_grad=True):
    return {k: torch.tensor(v, requires_grad=requires_grad) for k, v in params.items()}


__all__ = ["linear", "layer_norm", "attention", "mlp", "block", "gpt", "to_torch", "torch"]
