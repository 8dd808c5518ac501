"""Which experts a rank holds: the router whole, a contiguous slice of the stacked experts."""

import numpy as np

from ...errors import ConfigError
from ...nn.moe import expert_keys


def shard_experts(params, size, rank):
    """The parameters rank ``rank`` of ``size`` holds: the router whole, its contiguous
    slice of the stacked experts along dim 0."""
    n_experts = params["router.w"].shape[1]
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1 or n_experts % size:
        raise ConfigError(f"shard_experts: {n_experts} experts do not split evenly over {size!r} ranks; expert "
                          f"parallelism needs a number of ranks that divides the number of experts")
    if not 0 <= rank < size:
        raise ConfigError(f"shard_experts: rank must be in 0..{size - 1}, got {rank!r}")
    n = n_experts // size
    keys = expert_keys(params)
    return {k: (v[rank * n:(rank + 1) * n].copy() if k in keys else v) for k, v in params.items()}
