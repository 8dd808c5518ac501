"""GELU (tanh approximation, as GPT-2 and ``torch.nn.GELU(approximate="tanh")``)."""

import numpy as np

from .module import Module

_C = np.sqrt(2.0 / np.pi)


class GELU(Module):
    """y = x/2 * (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi). No parameters."""

    def forward(self, params, x):
        t = np.tanh(_C * (x + 0.044715 * x**3))
        return 0.5 * x * (1 + t), {"x": x, "t": t}

    def backward_input(self, params, cache, dy):
        x, t = cache["x"], cache["t"]
        dt = _C * (1 + 3 * 0.044715 * x**2)
        return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * dt)
