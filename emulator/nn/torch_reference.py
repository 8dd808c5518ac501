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


def moe(p, x, top_k, capacity_factor=None):
    """:class:`emulator.nn.MoE` (routing, capacity, experts, combine) in torch, x (T, d)."""
    import math

    probs = torch.softmax(x @ p["router.w"], -1)
    idx = torch.argsort(-probs.detach(), dim=1, stable=True)[:, :top_k]
    sel = probs.gather(1, idx)
    weights = sel / sel.sum(1, keepdim=True)
    n_experts = probs.shape[1]
    e_ids = idx.reshape(-1)
    keep = torch.ones_like(e_ids, dtype=torch.bool)
    if capacity_factor is not None:
        cap = math.ceil(capacity_factor * x.shape[0] * top_k / n_experts - 1e-9)
        onehot = torch.nn.functional.one_hot(e_ids, n_experts)
        keep = (onehot.cumsum(0) * onehot).sum(1) - 1 < cap
    y = torch.zeros_like(x)
    tokens = torch.arange(x.shape[0]).repeat_interleave(top_k)
    for e in range(n_experts):
        a = ((e_ids == e) & keep).nonzero().reshape(-1)
        if len(a):
            h = F.gelu(x[tokens[a]] @ p["experts.fc1.w"][e] + p["experts.fc1.b"][e], approximate="tanh")
            out = h @ p["experts.fc2.w"][e] + p["experts.fc2.b"][e]
            y = y.index_add(0, tokens[a], weights.reshape(-1)[a, None] * out)
    return y


def to_torch(params, requires_grad=True):
    return {k: torch.tensor(v, requires_grad=requires_grad) for k, v in params.items()}


__all__ = ["linear", "layer_norm", "attention", "mlp", "block", "gpt", "moe", "to_torch", "torch"]
