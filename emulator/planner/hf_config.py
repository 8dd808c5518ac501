"""A Hugging Face ``config.json`` as a :class:`ModelSpec`: ``model_from_hf_config(path)``,
which is what ``pfs-planner --model path/to/config.json`` reads.

Keys read: ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
``num_key_value_heads`` (absent: as many as the query heads, as transformers assumes),
``head_dim``, ``intermediate_size`` and ``vocab_size``; for a mixture of experts the keys
of Mixtral (``num_local_experts``; each expert ``intermediate_size`` wide), Qwen3-MoE
(``num_experts``, ``moe_intermediate_size``, ``mlp_only_layers``, ``decoder_sparse_step``)
and DeepSeek-V3 (``n_routed_experts``, ``moe_intermediate_size``, ``n_shared_experts``,
``first_k_dense_replace``), with ``num_experts_per_tok``, and Qwen-MoE's
``shared_expert_intermediate_size``. A multimodal config's ``text_config`` is read when
the top level has no layers.

A spec is ``nn.GPT``'s shape, so what it cannot hold is approximated as the presets
approximate it (:mod:`.models`) and said in its ``note``: every MLP gated (gate, up and
down matrices, as these models have), RoPE (no position table), norms and biases counted
as ``nn.GPT``'s; heads ``d_model / n_heads`` wide where ``head_dim`` says otherwise;
multi-head latent attention as plain attention over ``num_key_value_heads`` heads; shared
experts, dense first layers and multi-token prediction left out (their widths named).
"""

import json
from pathlib import Path

from ..errors import ConfigError
from .models import ModelSpec

REQUIRED = {"num_hidden_layers": "the number of layers", "hidden_size": "d_model",
            "num_attention_heads": "the query heads", "vocab_size": "the vocabulary"}
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")  # Mixtral, Qwen-MoE, DeepSeek


def read_hf_config(path):
    """The dict in a ``config.json`` file, or a :class:`ConfigError` naming the file."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file (a value ending in .json is read as a Hugging Face "
                          f"config.json)") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot be read as text ({exc})") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: a config.json holds one JSON object; this one holds a {type(cfg).__name__}")
    return cfg


def model_from_hf_config(config, name=None):
    """The :class:`ModelSpec` of a Hugging Face config: a path to its ``config.json`` or the
    dict it holds. Raises a :class:`ConfigError` naming any key it needs and lacks."""
    where = str(config) if not isinstance(config, dict) else "config"
    cfg = read_hf_config(config) if not isinstance(config, dict) else config
    if "num_hidden_layers" not in cfg and isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path")}
    missing = [f"{k!r} ({what})" for k, what in REQUIRED.items() if cfg.get(k) is None]
    if missing:
        raise ConfigError(f"{where}: no {', '.join(missing)}; a decoder's config.json (Llama, Mixtral, Qwen, "
                          f"DeepSeek) has num_hidden_layers, hidden_size, num_attention_heads, intermediate_size and "
                          f"vocab_size")
    layers, d, heads = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    kv = cfg.get("num_key_value_heads") or heads
    notes = []
    experts_key = next((k for k in EXPERT_KEYS if cfg.get(k)), None)
    n_experts, top_k = (cfg[experts_key], _need(cfg, "num_experts_per_tok", where, "experts per token")) \
        if experts_key else (0, 1)
    if n_experts:  # Mixtral's (and OLMoE's) experts are intermediate_size wide; DeepSeek's and Qwen's say so apart
        moe_width = cfg.get("moe_intermediate_size") or experts_key == "n_routed_experts"
        width_key = "moe_intermediate_size" if moe_width else "intermediate_size"
        notes += _moe_notes(cfg, layers)
    else:
        width_key = "intermediate_size"
    d_ff = _need(cfg, width_key, where, "the MLP's width" + (" per expert" if n_experts else ""))
    notes += _attention_notes(cfg, d, heads, kv)
    if cfg.get("hidden_act", "silu") != "silu":
        notes.append(f"its {cfg['hidden_act']} gated MLP counted as SwiGLU's matrices")
    if cfg.get("tie_word_embeddings"):
        notes.append("its embedding and output layer are one matrix (tied); counted as two")
    notes.append("RoPE; norms and biases counted as nn.GPT's")
    return ModelSpec(layers, d, heads, d_ff, cfg["vocab_size"], kv, "swiglu", n_experts, top_k, positions="rope",
                     name=name or _name(cfg, config), source=f"{where} (a Hugging Face config.json)",
                     note="approximation: " + "; ".join(notes),
                     norm="rmsnorm" if "rms_norm_eps" in cfg else "layernorm",
                     bias=bool(cfg.get("attention_bias", False) or cfg.get("mlp_bias", False)))


def _need(cfg, key, where, what):
    if cfg.get(key) is None:
        raise ConfigError(f"{where}: no {key!r} ({what}) in it")
    return cfg[key]


def _attention_notes(cfg, d, heads, kv):
    out = []
    if cfg.get("kv_lora_rank"):
        out.append(f"multi-head latent attention (kv_lora_rank {cfg['kv_lora_rank']}, q_lora_rank "
                   f"{cfg.get('q_lora_rank')}) as plain attention with {kv} K/V heads")
    head_dim = cfg.get("head_dim")
    if head_dim and isinstance(heads, int) and heads > 0 and head_dim * heads != d:
        out.append(f"its heads are {head_dim} wide ({heads} x {head_dim} {'>' if head_dim * heads > d else '<'} "
                   f"d_model); here d_model/{heads}")
    return out


def _moe_notes(cfg, layers):
    out = []
    width = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    if cfg.get("n_shared_experts"):
        out.append(f"{cfg['n_shared_experts']} shared expert(s) ({width} wide) left out")
    if cfg.get("shared_expert_intermediate_size"):
        out.append(f"the shared expert ({cfg['shared_expert_intermediate_size']} wide) left out")
    dense = cfg.get("first_k_dense_replace") or 0
    if dense:
        out.append(f"the {dense} dense first layers ({cfg.get('intermediate_size')} wide) counted as MoE layers")
    step = cfg.get("decoder_sparse_step") or 1
    every = range(layers) if isinstance(layers, int) and isinstance(step, int) and step > 1 else ()
    only = set(cfg.get("mlp_only_layers") or []) | {i for i in every if (i + 1) % step}
    if only:
        out.append(f"{len(only)} dense layer(s) ({cfg.get('intermediate_size')} wide) counted as MoE layers")
    if cfg.get("num_nextn_predict_layers"):
        out.append(f"multi-token prediction ({cfg['num_nextn_predict_layers']} layer) left out")
    return out


def _name(cfg, config):
    if cfg.get("_name_or_path"):
        return str(cfg["_name_or_path"])
    if isinstance(config, dict):
        return ""
    p = Path(config)
    if p.name == "config.json" and p.parent.name:  # a downloaded repository: its folder's name
        return p.parent.name
    return p.name.removesuffix(".json").removesuffix(".config")
