"""Moved: :mod:`emulator.parallel.expert_parallel.alternatives` holds these."""

from .expert_parallel.alternatives import (flat_dispatch, hierarchical_all_to_all, shard_experts_tp,  # noqa: F401
                                           tp_moe_forward, two_hop_dispatch)
