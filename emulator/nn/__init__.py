"""Model pieces in NumPy with explicit forward and backward (B and W split).

See :mod:`emulator.nn.module` for the protocol every layer follows.
"""

from .activations import GELU, gelu, gelu_backward
from .adamw import AdamW
from .attention import Attention
from .attention_core import AttentionCore, causal_mask, softmax
from .block import TransformerBlock
from .gpt import GPT, LMHead, TokenPositionEmbedding
from .layernorm import LayerNorm, layer_norm, layer_norm_backward
from .linear import Embedding, Linear
from .loss import cross_entropy, cross_entropy_backward
from .mlp import MLP, SwiGLU
from .moe import MoE, scale_aux_loss
from .module import Composite, Module, add_flops, cache_bytes, prefixed, sub, total_flops

__all__ = ["Module", "Composite", "Linear", "Embedding", "GELU", "LayerNorm", "Attention", "AttentionCore",
           "MLP", "SwiGLU", "MoE", "scale_aux_loss", "TransformerBlock", "GPT", "TokenPositionEmbedding", "LMHead", "cross_entropy",
           "cross_entropy_backward", "AdamW", "sub", "prefixed", "softmax", "causal_mask", "cache_bytes",
           "add_flops", "total_flops", "gelu", "gelu_backward", "layer_norm", "layer_norm_backward"]
