"""Gradient clipping by the global norm, as ``torch.nn.utils.clip_grad_norm_`` computes it."""

import numpy as np

from ..errors import ConfigError


def global_norm(grads):
    """sqrt of the sum of squares of every gradient (one vector of all of them)."""
    return float(np.sqrt(sum(float(np.sum(np.square(np.asarray(g, dtype=np.float64)))) for g in grads.values())))


def clip_coefficient(norm, max_norm):
    """The factor ``torch.nn.utils.clip_grad_norm_`` multiplies the gradients by:
    max_norm / (norm + 1e-6), at most 1."""
    if not max_norm > 0:
        raise ConfigError(f"clip_grad_norm must be a positive norm, got {max_norm!r}")
    return min(1.0, max_norm / (norm + 1e-6))
