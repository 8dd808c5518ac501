"""A pre-norm transformer block (GPT-2 layout)."""

import numpy as np

from .attention import Attention
from .layernorm import LayerNorm
from .mlp import MLP
from .module import Composite, add_flops, check_heads, check_ndim, sub


class TransformerBlock(Composite):
    """h = x + attn(ln1(x)); y = h + mlp(ln2(h)). x, y: (batch, seq, d_model)."""

    def __init__(self, d_model, n_heads, d_ff, causal=True, dtype=np.float32):
        check_heads("TransformerBlock", d_model, n_heads)
        self.d_model, self.dtype = d_model, dtype
        self.ln1, self.attn = LayerNorm(d_model, dtype=dtype), Attention(d_model, n_heads, causal, dtype=dtype)
        self.ln2, self.mlp = LayerNorm(d_model, dtype=dtype), MLP(d_model, d_ff, dtype=dtype)

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
