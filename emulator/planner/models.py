"""What the planner knows of a model: :class:`ModelSpec` (the shape of a decoder-only
transformer, as ``nn.GPT`` builds one) and :func:`model_preset` (published shapes).

``ModelSpec(n_layers, d_model, n_heads, d_ff, vocab, n_kv_heads=None, mlp="gelu",
n_experts=0, top_k=1)``: ``n_layers`` blocks of pre-norm attention (``n_heads`` query heads
of ``d_model / n_heads``, ``n_kv_heads`` K/V heads for grouped-query attention) and an MLP
(``"gelu"``: d -> d_ff -> d; ``"swiglu"``: two d -> d_ff matrices, one back), or a
mixture of ``n_experts`` such MLPs of width ``d_ff``, ``top_k`` per token. Every block
has biases and two norms with biases, as ``nn.GPT``; ``positions="learned"`` adds a
``max_seq x d_model`` position table (``nn.GPT``'s), ``"rope"`` none (the published
models; the emulator can only run learned ones). The embedding and the output layer are
separate ``vocab x d_model`` matrices.

Presets quote each model's published configuration; ``note`` says what the spec leaves
out (attention variants, shared experts, dense first layers), so a planner figure for
it is an approximation of the real model by this shape.
"""

from dataclasses import dataclass, replace

import numpy as np

from .. import nn
from ..errors import ConfigError


@dataclass(frozen=True)
class ModelSpec:
    n_layers: int
    d_model: int
    n_heads: int
    d_ff: int
    vocab: int
    n_kv_heads: int = None
    mlp: str = "gelu"
    n_experts: int = 0
    top_k: int = 1
    positions: str = "learned"
    max_seq: int = None
    name: str = ""
    source: str = ""
    note: str = ""
    norm: str = "layernorm"  # or "rmsnorm": what the kernels of the stacks norm (the parameter count is nn.GPT's)
    bias: bool = True  # whether the linear layers add biases (the bias kernels a stack runs or fuses)

    def __post_init__(self):
        bad = [f"{k}={getattr(self, k)!r} must be a positive int" for k in ("n_layers", "d_model", "n_heads", "d_ff",
                                                                             "vocab", "top_k")
               if not _positive(getattr(self, k))]
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        elif not _positive(self.n_kv_heads):
            bad.append(f"n_kv_heads={self.n_kv_heads!r} must be a positive int")
        if not bad:
            if self.d_model % self.n_heads:
                bad.append(f"d_model ({self.d_model}) must divide by n_heads ({self.n_heads})")
            if self.n_heads % self.n_kv_heads:
                bad.append(f"n_heads ({self.n_heads}) must divide by n_kv_heads ({self.n_kv_heads})")
        if self.mlp not in ("gelu", "swiglu"):
            bad.append(f"mlp={self.mlp!r} must be 'gelu' or 'swiglu'")
        if not (isinstance(self.n_experts, int) and self.n_experts >= 0):
            bad.append(f"n_experts={self.n_experts!r} must be 0 (dense) or a positive int")
        elif self.n_experts and _positive(self.top_k) and self.top_k > self.n_experts:
            bad.append(f"top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts})")
        if self.norm not in ("layernorm", "rmsnorm"):
            bad.append(f"norm={self.norm!r} must be 'layernorm' or 'rmsnorm'")
        if not isinstance(self.bias, bool):
            bad.append(f"bias={self.bias!r} must be True or False")
        if self.positions not in ("learned", "rope"):
            bad.append(f"positions={self.positions!r} must be 'learned' (a table, as nn.GPT) or 'rope' (none)")
        if self.max_seq is not None and not _positive(self.max_seq):
            bad.append(f"max_seq={self.max_seq!r} must be a positive int or None")
        if bad:
            raise ConfigError("ModelSpec: " + "; ".join(bad))

    # ----------------------------------------------------------------- shape
    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @property
    def widen(self):
        """Matrices that widen d -> d_ff in one MLP (GELU: 1; SwiGLU: gate and up)."""
        return 1 if self.mlp == "gelu" else 2

    def with_seq(self, seq_len):
        """The spec with its position table sized for ``seq_len`` if it has none yet."""
        return self if self.max_seq is not None else replace(self, max_seq=seq_len)

    def replace(self, **changes):
        return replace(self, **changes)

    # ----------------------------------------------------------------- counts
    def attention_params(self):
        d, kv = self.d_model, self.n_kv_heads * self.head_dim
        return 2 * d * d + 2 * d * kv + 2 * d + 2 * kv  # q, o (and biases), k, v

    def mlp_params(self):
        """One MLP (one expert of an MoE)."""
        d, f = self.d_model, self.d_ff
        return 2 * d * f + f + d if self.mlp == "gelu" else 3 * d * f

    def block_params(self):
        experts = self.mlp_params() * self.n_experts + self.d_model * self.n_experts if self.n_experts else \
            self.mlp_params()
        return 4 * self.d_model + self.attention_params() + experts

    def embedding_params(self, seq_len=None):
        table = self.max_seq or seq_len or 0
        return self.vocab * self.d_model + (table * self.d_model if self.positions == "learned" else 0)

    def params(self, seq_len=None):
        """Every parameter: embeddings, blocks, final norm and output layer."""
        return self.embedding_params(seq_len) + self.n_layers * self.block_params() + 2 * self.d_model + \
            self.d_model * self.vocab

    def active_params(self):
        """Parameters in matrix products one token passes through (the ``N`` of 6N): the
        blocks' matrices (top_k experts and the router for an MoE) and the output layer."""
        d, kv, f = self.d_model, self.n_kv_heads * self.head_dim, self.d_ff
        mlp = (self.widen + 1) * d * f
        per_block = 2 * d * d + 2 * d * kv + (self.top_k * mlp + d * self.n_experts if self.n_experts else mlp)
        return self.n_layers * per_block + d * self.vocab

    def model_flops_per_token(self, seq_len):
        """Training FLOPs per token for MFU: 6 x active parameters, plus attention's scores
        and their use over the whole sequence (4 s d per layer forward, times 3), counted
        as Megatron's and PaLM's MFU count them: in full, though a causal kernel computes
        about half, and without recomputation."""
        return 6 * self.active_params() + 12 * self.n_layers * seq_len * self.d_model

    def to_gpt(self, seq_len, dtype=None, **gpt_options):
        """An ``nn.GPT`` of this shape (learned positions only: the emulator has no RoPE)."""
        if self.positions != "learned":
            raise ConfigError(f"ModelSpec {self.name or ''}: the emulator's GPT has a learned position table; "
                              f"use spec.replace(positions='learned') to run it (its table then counts)")
        return nn.GPT(self.vocab, self.d_model, self.n_heads, self.d_ff, self.n_layers, self.max_seq or seq_len,
                      dtype=dtype or np.float32, n_kv_heads=self.n_kv_heads, mlp=self.mlp, n_experts=self.n_experts,
                      top_k=self.top_k, **gpt_options)

    @classmethod
    def of(cls, gpt):
        """The spec of an ``nn.GPT`` (or anything with its attributes)."""
        return cls(gpt.n_layers, gpt.d_model, gpt.n_heads, gpt.d_ff, gpt.vocab, gpt.n_kv_heads, gpt.mlp,
                   gpt.n_experts, gpt.top_k, max_seq=gpt.max_seq)


def _positive(v):
    return not isinstance(v, bool) and isinstance(v, int) and v >= 1


def _gpt(layers, d, heads, vocab, name, source, ff=None):
    return ModelSpec(layers, d, heads, ff or 4 * d, vocab, positions="learned", name=name, source=source)


_NARAYANAN = "Narayanan et al., SC21 (arXiv:2104.04473), Table 1; vocabulary 51,200, sequence 2048"
_MEGATRON_H100 = "NVIDIA/Megatron-LM README, images/model_table.png (2024-07); vocabulary 131,072, sequence 4096"
_LLAMA3 = "Llama 3 paper (arXiv:2407.21783), Table 3; vocabulary 128,256"

PRESETS = {
    "llama3-8b": ModelSpec(32, 4096, 32, 14336, 128256, 8, "swiglu", positions="rope", name="Llama 3 8B",
                           source=_LLAMA3, note="RoPE and RMSNorm; no biases (the spec counts nn.GPT's)", norm="rmsnorm", bias=False),
    "llama3-70b": ModelSpec(80, 8192, 64, 28672, 128256, 8, "swiglu", positions="rope", name="Llama 3 70B",
                            source=_LLAMA3, note="RoPE and RMSNorm; no biases (the spec counts nn.GPT's)", norm="rmsnorm", bias=False),
    "llama3-405b": ModelSpec(126, 16384, 128, 53248, 128256, 8, "swiglu", positions="rope", name="Llama 3 405B",
                             source=_LLAMA3, note="RoPE and RMSNorm; no biases (the spec counts nn.GPT's)", norm="rmsnorm", bias=False),
    "gpt3-175b": ModelSpec(96, 12288, 96, 49152, 51200, positions="learned", max_seq=2048, name="GPT-3 175B",
                           source="Brown et al. 2020, Table 2.1 (vocabulary padded to 51,200 as Megatron does)"),
    "deepseek-v3": ModelSpec(61, 7168, 128, 2048, 129280, None, "swiglu", 256, 8, positions="rope",
                             name="DeepSeek-V3", source="DeepSeek-V3 Technical Report (arXiv:2412.19437) and "
                                                        "deepseek-ai/DeepSeek-V3 config.json",
                             note="approximation: multi-head latent attention as plain attention, the shared "
                                  "expert, the 3 dense first layers and multi-token prediction left out", norm="rmsnorm", bias=False),
    "mixtral-8x22b": ModelSpec(56, 6144, 48, 16384, 32768, 8, "swiglu", 8, 2, positions="rope",
                               name="Mixtral 8x22B", source="mistralai/Mixtral-8x22B-v0.1 config.json", norm="rmsnorm", bias=False),
    "qwen3-235b-a22b": ModelSpec(94, 4096, 64, 1536, 151936, 4, "swiglu", 128, 8, positions="rope",
                                 name="Qwen3-235B-A22B", source="Qwen/Qwen3-235B-A22B config.json",
                                 note="approximation: its heads are 128 wide (64 x 128 > d_model); here d/64", norm="rmsnorm", bias=False),
    "olmo-7b": ModelSpec(32, 4096, 32, 11008, 50304, None, "swiglu", positions="rope", name="OLMo 7B",
                         source="Groeneveld et al. 2024 (arXiv:2402.00838), Table 1; allenai/OLMo-7B config", norm="layernorm", bias=False),
    "gemma2-27b": ModelSpec(46, 4608, 32, 36864, 256000, 16, "swiglu", positions="rope", name="Gemma 2 27B",
                            source="Gemma 2 report (arXiv:2408.00118), Table 1",
                            note="approximation: GeGLU counted as a gated MLP; its heads are 128 wide "
                                 "(32 x 128 < d_model); local/global attention not modelled", norm="rmsnorm", bias=False),
    "deepseek-67b": ModelSpec(95, 8192, 64, 22016, 102400, 8, "swiglu", positions="rope", name="DeepSeek LLM 67B",
                              source="DeepSeek LLM paper (arXiv:2401.02954), Table 2; deepseek-ai config.json", norm="rmsnorm", bias=False),
    "yi-34b": ModelSpec(60, 7168, 56, 20480, 64000, 8, "swiglu", positions="rope", name="Yi 34B",
                        source="Yi report (arXiv:2403.04652), Table 1", norm="rmsnorm", bias=False),
}
for _size, (_layers, _d, _heads) in {"1.7b": (24, 2304, 24), "3.6b": (30, 3072, 32), "7.5b": (36, 4096, 32),
                                      "18b": (40, 6144, 48), "39b": (48, 8192, 64), "76b": (60, 10240, 80),
                                      "145b": (80, 12288, 96), "310b": (96, 16384, 128), "530b": (105, 20480, 128),
                                      "1t": (128, 25600, 160)}.items():
    PRESETS[f"megatron-{_size}"] = _gpt(_layers, _d, _heads, 51200, f"Megatron GPT {_size.upper()} (2021)",
                                        _NARAYANAN).replace(max_seq=2048)
for _size, (_layers, _d, _heads) in {"1.7b": (24, 2048, 16), "7.1b": (30, 4096, 32), "16b": (32, 6144, 48),
                                      "32b": (48, 7168, 56), "70b": (84, 8192, 64), "119b": (92, 10240, 80),
                                      "177b": (96, 12288, 96), "314b": (96, 16384, 128),
                                      "462b": (112, 18432, 144)}.items():
    PRESETS[f"megatron-h100-{_size}"] = _gpt(_layers, _d, _heads, 131072, f"Megatron GPT {_size.upper()} (H100)",
                                             _MEGATRON_H100).replace(max_seq=4096)


def model_preset(name):
    """A published model's :class:`ModelSpec` by name (``model_preset("llama3-405b")``)."""
    key = str(name).lower()
    if key not in PRESETS:
        raise ConfigError(f"model_preset: no preset {name!r}; known: {', '.join(sorted(PRESETS))}, or build a "
                          f"ModelSpec(n_layers, d_model, n_heads, d_ff, vocab, ...)")
    return PRESETS[key]
