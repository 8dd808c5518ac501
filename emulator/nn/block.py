"""A pre-norm transformer block (GPT-2 layout), with the variants published models use:
grouped-query attention (``n_kv_heads``), a SwiGLU MLP (``mlp="swiglu"``), and a
mixture-of-experts MLP (``n_experts`` > 0: :class:`~emulator.nn.moe.MoE`)."""

import numpy as np

from ..errors import ConfigError
from .attention import Attention
from .layernorm import LayerNorm
from .mlp import MLP, MLP_KINDS, SwiGLU
from .moe import MoE
from .module import Composite, add_flops, check_heads, check_ndim, sub


def feed_forward(d_model, d_ff, dtype=np.float32, mlp="gelu", n_experts=0, top_k=1, capacity_factor=None,
                 aux_loss_coef=0.0):
    """The block's MLP: dense GELU or SwiGLU, or an MoE of such experts."""
    if mlp not in MLP_KINDS:
        raise ConfigError(f"mlp must be one of {MLP_KINDS}, got {mlp!r}")
    if n_experts:
        return MoE(d_model, d_ff, n_experts, top_k, capacity_factor, aux_loss_coef, dtype=dtype, mlp=mlp)
    return SwiGLU(d_model, d_ff, dtype=dtype) if mlp == "swiglu" else MLP(d_model, d_ff, dtype=dtype)


class TransformerBlock(Composite):
    """h = x + attn(ln1(x)); y = h + mlp(ln2(h)). x, y: (batch, seq, d_model)."""

    def __init__(self, d_model, n_heads, d_ff, causal=True, dtype=np.float32, n_kv_heads=None, mlp="gelu",
                 n_experts=0, top_k=1, capacity_factor=None, aux_loss_coef=0.0):
        check_heads("TransformerBlock", d_model, n_heads)
        self.d_model, self.dtype = d_model, dtype
        self.ln1 = LayerNorm(d_model, dtype=dtype)
        self.attn = Attention(d_model, n_heads, causal, dtype=dtype, n_kv_heads=n_kv_heads)
        self.ln2 = LayerNorm(d_model, dtype=dtype)
        self.mlp = feed_forward(d_model, d_ff, dtype, mlp, n_experts, top_k, capacity_factor, aux_loss_coef)

    def children(self):
        return [("ln1", self.ln1), ("attn", self.attn), ("ln2", self.ln2), ("mlp", self.mlp)]

    def forward(self, params, x):
        check_ndim("TransformerBlock", x, 3, "(batch, seq, d_model)")
        cache = {}
        a, cache["ln1"] = self.ln1.forward(sub(params, "ln1"), x)
        a, cache["attn"] = self.attn.forward(sub(params, "attn"), a)
        h = x + a
        m, cache["ln2"] = self.ln2.forward(sub(params, "ln2"), h)
        m, cache["mlp"] = self.mlp.forward(sub(params, "mlp"), m)
        return h + m, cache

    def backward_input(self, params, cache, dy):
        self._remember(cache, "mlp", dy)
        dm = self.mlp.backward_input(sub(params, "mlp"), cache["mlp"], dy)
        self._remember(cache, "ln2", dm)
        dh = dy + self.ln2.backward_input(sub(params, "ln2"), cache["ln2"], dm)
        self._remember(cache, "attn", dh)
        da = self.attn.backward_input(sub(params, "attn"), cache["attn"], dh)
        self._remember(cache, "ln1", da)
        return dh + self.ln1.backward_input(sub(params, "ln1"), cache["ln1"], da)

    def flops(self, x_shape):
        return add_flops(self.attn.flops(x_shape), self.mlp.flops(x_shape))
