"""A small GPT: token + position embedding, n transformer blocks, final norm and LM head.

The layers are reachable one by one (``gpt.layers``: a list of ``(name, module)``; a
layer's parameters are ``sub(params, name)``), so a pipeline can give each stage a
contiguous run of them and FSDP can gather them one at a time.
"""

import numpy as np

from ..errors import ConfigError

from .block import TransformerBlock
from .layernorm import LayerNorm
from .linear import Embedding, Linear
from .module import Composite, add_flops, check_heads, check_ndim, sub


class TokenPositionEmbedding(Composite):
    """x = tok[idx] + pos[0:s]; idx: (batch, seq) ints -> (batch, seq, d_model)."""

    def __init__(self, vocab, d_model, max_seq, dtype=np.float32):
        self.max_seq = max_seq
        self.tok, self.pos = Embedding(vocab, d_model, dtype=dtype), Embedding(max_seq, d_model, dtype=dtype)

    def children(self):
        return [("tok", self.tok), ("pos", self.pos)]

    def forward(self, params, idx):
        idx = np.asarray(idx)
        check_ndim("GPT", idx, 2, "of token ids (batch, seq)")
        if idx.shape[1] > self.max_seq:
            raise ConfigError(f"GPT: sequence length {idx.shape[1]} exceeds max_seq {self.max_seq}")
        t, ct = self.tok.forward(sub(params, "tok"), idx)
        positions = np.broadcast_to(np.arange(idx.shape[1]), idx.shape)
        p, cp = self.pos.forward(sub(params, "pos"), positions)
        return t + p, {"tok": ct, "pos": cp}

    def backward_input(self, params, cache, dy):
        self._remember(cache, "tok", dy)
        self._remember(cache, "pos", dy)
        return None


class LMHead(Composite):
    """logits = ln_f(x) @ w_out, (batch, seq, d_model) -> (batch, seq, vocab)."""

    def __init__(self, d_model, vocab, dtype=np.float32):
        self.ln, self.proj = LayerNorm(d_model, dtype=dtype), Linear(d_model, vocab, bias=False, dtype=dtype)

    def children(self):
        return [("ln", self.ln), ("proj", self.proj)]

    def forward(self, params, x):
        cache = {}
        h, cache["ln"] = self.ln.forward(sub(params, "ln"), x)
        y, cache["proj"] = self.proj.forward(sub(params, "proj"), h)
        return y, cache

    def backward_input(self, params, cache, dy):
        self._remember(cache, "proj", dy)
        dh = self.proj.backward_input(sub(params, "proj"), cache["proj"], dy)
        self._remember(cache, "ln", dh)
        return self.ln.backward_input(sub(params, "ln"), cache["ln"], dh)

    def flops(self, x_shape):
        return self.proj.flops(x_shape)


class GPT(Composite):
    """``GPT(vocab, d_model, n_heads, d_ff, n_layers, max_seq)``: causal language model.

    forward(params, idx (batch, seq) ints) -> logits (batch, seq, vocab).

    The variants published models use (see :class:`~emulator.nn.block.TransformerBlock`):
    ``n_kv_heads`` (grouped-query attention), ``mlp="swiglu"``, and ``n_experts`` > 0 for a
    mixture of experts in every block (``top_k``, ``capacity_factor`` (None: dropless),
    ``aux_loss_coef`` (Switch's load-balancing loss)). The loss a run reports is the
    cross-entropy; the auxiliary losses only add to the router's gradient."""

    def __init__(self, vocab, d_model, n_heads, d_ff, n_layers, max_seq, dtype=np.float32, n_kv_heads=None,
                 mlp="gelu", n_experts=0, top_k=1, capacity_factor=None, aux_loss_coef=0.0):
        check_heads("GPT", d_model, n_heads)
        for name, v in (("vocab", vocab), ("n_layers", n_layers), ("max_seq", max_seq), ("d_ff", d_ff)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"GPT: {name} must be a positive integer, got {v!r}")
        self.vocab, self.d_model, self.n_heads, self.d_ff = vocab, d_model, n_heads, d_ff
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.mlp, self.n_experts, self.top_k = mlp, n_experts, top_k
        self.capacity_factor, self.aux_loss_coef = capacity_factor, aux_loss_coef
        self.n_layers, self.max_seq, self.dtype = n_layers, max_seq, dtype
        self.embed = TokenPositionEmbedding(vocab, d_model, max_seq, dtype)
        self.blocks = [TransformerBlock(d_model, n_heads, d_ff, causal=True, dtype=dtype, n_kv_heads=n_kv_heads,
                                        mlp=mlp, n_experts=n_experts, top_k=top_k, capacity_factor=capacity_factor,
                                        aux_loss_coef=aux_loss_coef) for _ in range(n_layers)]
        self.head = LMHead(d_model, vocab, dtype)
        self.layers = [("embed", self.embed)] + [(f"blocks.{i}", b) for i, b in enumerate(self.blocks)] + \
                      [("head", self.head)]

    def children(self):
        return self.layers

    def forward(self, params, idx):
        cache, x = {}, idx
        for name, layer in self.layers:
            x, cache[name] = layer.forward(sub(params, name), x)
        return x, cache

    def backward_input(self, params, cache, dy):
        for name, layer in reversed(self.layers):
            self._remember(cache, name, dy)
            dy = layer.backward_input(sub(params, name), cache[name], dy)
        return dy

    def flops(self, idx_shape):
        """Of the whole model for token ids of ``idx_shape`` (batch, seq)."""
        x_shape = tuple(idx_shape) + (self.d_model,)
        return add_flops(*(layer.flops(idx_shape if name == "embed" else x_shape) for name, layer in self.layers))
