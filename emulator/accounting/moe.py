"""Expert parallelism in numbers: the all-to-all bytes of an MoE layer, experts per GPU,
and the published shapes of three MoE models with the parallelism they trained with.

With ``tokens`` tokens on a GPU, each routed to ``top_k`` experts spread evenly over
``ep`` GPUs, a dispatch sends ``(ep - 1)/ep`` of the ``tokens * top_k`` rows of width
``d_model`` to other GPUs, and the combine sends as many back: per layer, forward, each
GPU sends ``2 tokens top_k d_model (ep-1)/ep`` values (and the backward as many again).
"""

import math

from ..errors import ConfigError

# Published shapes (config files and reports), and a parallelism for each: DeepSeek-V3's own,
# from its report; Mixtral's and Qwen 3's developers published none, so theirs are NVIDIA
# Megatron-Bridge recipes (starting points for a framework, not how the models were trained).
CASE_STUDIES = {
    "DeepSeek-V3": dict(d_model=7168, n_experts=256, top_k=8, d_ff_expert=2048, layers=61, moe_layers=58,
                        ep=64, pp=16, tp=1, source="DeepSeek-V3 Technical Report (arXiv:2412.19437); "
                                                   "deepseek-ai/DeepSeek-V3 config.json",
                        parallelism="published: report section 3.2 (16-way PP, 64-way EP over 8 nodes, ZeRO-1 DP, "
                                    "no TP)"),
    "Mixtral 8x22B": dict(d_model=6144, n_experts=8, top_k=2, d_ff_expert=16384, layers=56, moe_layers=56,
                          ep=8, pp=2, tp=4, source="mistralai/Mixtral-8x22B-v0.1 config.json",
                          parallelism="a recipe: NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/recipes/mixtral/"
                                      "mixtral.py, mixtral_8x22b_pretrain_config (TP 4, PP 2, EP 8; commit dbce0e4, "
                                      "since removed)"),
    "Qwen3-235B-A22B": dict(d_model=4096, n_experts=128, top_k=8, d_ff_expert=1536, layers=94, moe_layers=94,
                            ep=32, pp=8, tp=2, source="Qwen/Qwen3-235B-A22B config.json",
                            parallelism="a recipe: NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/perf_recipes/qwen/"
                                        "h100/qwen3_moe.py, qwen3_235b_a22b_pretrain_256gpu_h100_bf16_config (256 "
                                        "H100, TP 2, PP 8, VP 4, EP 32)"),
}


def all_to_all_bytes_per_layer(tokens, d_model, top_k, ep, dtype_bytes=2):
    """Bytes one GPU sends in the forward dispatch and combine of one MoE layer."""
    for name, v in (("tokens", tokens), ("d_model", d_model), ("top_k", top_k), ("ep", ep)):
        if not v >= 1:
            raise ConfigError(f"all_to_all_bytes_per_layer: {name} must be at least 1, got {v!r}")
    return 2 * tokens * top_k * d_model * dtype_bytes * (ep - 1) / ep


def experts_per_gpu(n_experts, ep):
    if n_experts % ep:
        raise ConfigError(f"experts_per_gpu: {n_experts} experts do not split over ep = {ep}")
    return n_experts // ep


def expected_drops(tokens, top_k, n_experts, capacity_factor, hot_share):
    """Assignments dropped when one expert receives ``hot_share`` of all ``tokens * top_k``
    assignments and the others share the rest evenly, with capacity
    ``ceil(capacity_factor * tokens * top_k / n_experts)`` per expert."""
    total = tokens * top_k
    cap = math.ceil(capacity_factor * total / n_experts - 1e-9)
    rest = (1 - hot_share) * total / (n_experts - 1)
    return max(0.0, hot_share * total - cap) + (n_experts - 1) * max(0.0, rest - cap)
