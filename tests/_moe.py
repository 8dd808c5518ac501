"""The MoE layer the MoE tests share: small, with a router that prefers some experts."""

import numpy as np

from emulator import nn


def layer(n_experts, top_k, cf, dtype=np.float64, sharp=50.0, aux=0.0):
    moe = nn.MoE(8, 16, n_experts, top_k, cf, aux_loss_coef=aux, dtype=dtype)
    p = moe.init(np.random.default_rng(n_experts + top_k))
    p["router.w"] = (p["router.w"] * sharp).astype(dtype)  # a router that prefers some experts
    rng = np.random.default_rng(1)
    for k in ("experts.fc1.b", "experts.fc2.b"):
        p[k] = (p[k] + 0.1 * rng.standard_normal(p[k].shape)).astype(dtype)
    return moe, p
