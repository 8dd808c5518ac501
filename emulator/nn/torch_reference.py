"""The same models in torch, written functionally over a dict of tensors with the same keys
as :mod:`emulator.nn`. Tests check gradients against these with torch.autograd; GPU labs
and benchmarks run them. Needs torch (imported here, not by ``emulator.nn``)."""

import math

import torch
import torch.nn.functional as F


def linear(p, x, pre=""):
    y = x @ p[pre + "w"]
    return y + p[pre + "b"] if pre + "b" in p else y


def layer_norm(p, x, pre=""):
    return F.layer_norm(x, (x.shape[-1],), p[pre + "g"], p[pre + "b"], eps=1e-5)


def attention(p, x, pre="", causal=False, n_heads=1, n_kv_heads=None):
    b, s, d = x.shape
    n_kv = n_kv_heads or n_heads
    q = linear(p, x, pre + "q.").reshape(b, s, n_heads, -1).transpose(1, 2)
    k, v = (linear(p, x, f"{pre}{n}.").reshape(b, s, n_kv, -1).transpose(1, 2).repeat_interleave(n_heads // n_kv, 1)
            for n in "kv")
    o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return linear(p, o.transpose(1, 2).reshape(b, s, d), pre + "o.")


def mlp(p, x, pre="", kind="gelu"):
    if kind == "swiglu":
        return (F.silu(x @ p[pre + "gate.w"]) * (x @ p[pre + "up.w"])) @ p[pre + "down.w"]
    return linear(p, F.gelu(linear(p, x, pre + "fc1."), approximate="tanh"), pre + "fc2.")


def block(p, x, pre="", n_heads=1, n_kv_heads=None, mlp_kind="gelu", n_experts=0, top_k=1, capacity_factor=None,
          aux=None):
    """A block; with experts, each MoE layer's load-balancing loss is appended to ``aux``."""
    h = x + attention(p, layer_norm(p, x, pre + "ln1."), pre + "attn.", True, n_heads, n_kv_heads)
    a = layer_norm(p, h, pre + "ln2.")
    if not n_experts:
        return h + mlp(p, a, pre + "mlp.", mlp_kind)
    sub = {k[len(pre + "mlp."):]: v for k, v in p.items() if k.startswith(pre + "mlp.")}
    y, loss = moe(sub, a.reshape(-1, a.shape[-1]), top_k, capacity_factor, mlp_kind, with_aux=True)
    if aux is not None:
        aux.append(loss)
    return h + y.reshape(a.shape)


def gpt(p, idx, n_layers, n_heads, aux=None, **block_options):
    """logits of :class:`emulator.nn.GPT` for token ids ``idx`` (a LongTensor); ``block_options``
    as :func:`block` (n_kv_heads, mlp_kind, n_experts, top_k, capacity_factor)."""
    x = p["embed.tok.w"][idx] + p["embed.pos.w"][: idx.shape[1]]
    for i in range(n_layers):
        x = block(p, x, f"blocks.{i}.", n_heads, aux=aux, **block_options)
    return layer_norm(p, x, "head.ln.") @ p["head.proj.w"]


def moe(p, x, top_k, capacity_factor=None, kind="gelu", with_aux=False):
    """:class:`emulator.nn.MoE` (routing, capacity, experts, combine) in torch, x (T, d);
    ``with_aux``: also Switch's load-balancing loss E sum_e f_e P_e (f_e counted from the
    routing, which has no gradient; P_e the mean router probability)."""
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
            xe = x[tokens[a]]
            if kind == "swiglu":
                out = (F.silu(xe @ p["experts.gate.w"][e]) * (xe @ p["experts.up.w"][e])) @ p["experts.down.w"][e]
            else:
                h = F.gelu(xe @ p["experts.fc1.w"][e] + p["experts.fc1.b"][e], approximate="tanh")
                out = h @ p["experts.fc2.w"][e] + p["experts.fc2.b"][e]
            y = y.index_add(0, tokens[a], weights.reshape(-1)[a, None] * out)
    if not with_aux:
        return y
    f = torch.bincount(e_ids, minlength=n_experts).to(probs.dtype) / len(e_ids)
    return y, n_experts * (f * probs.mean(0)).sum()


def to_torch(params, requires_grad=True):
    return {k: torch.tensor(v, requires_grad=requires_grad) for k, v in params.items()}


__all__ = ["linear", "layer_norm", "attention", "mlp", "block", "gpt", "moe", "to_torch", "torch"]
