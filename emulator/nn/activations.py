"""GELU (tanh approximation, as GPT-2 and ``torch.nn.GELU(approximate="tanh")``)."""

import numpy as np

from .module import Module

_C = float(np.sqrt(2.0 / np.pi))  # a Python float keeps float32 inputs float32


def gelu(x):
    """The tanh approximation, functional form."""
    return 0.5 * x * (1 + np.tanh(_C * x * (1 + 0.044715 * x * x)))


def gelu_backward(x, dy):
    """dy * GELU'(x), from the input alone (tanh recomputed)."""
    t = np.tanh(_C * x * (1 + 0.044715 * x * x))
    return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * _C * (1 + 3 * 0.044715 * x * x))


class GELU(Module):
    """y = x/2 * (1 + tanh(c (x + 0.044715 x^3))), c = sqrt(2/pi). No parameters."""

    def forward(self, params, x):
        t = np.tanh(_C * x * (1 + 0.044715 * x * x))  # x*x, not x**3: pow is slow
        return 0.5 * x * (1 + t), {"x": x, "t": t}

    def backward_input(self, params, cache, dy):
        # dy * (0.5 (1 + t) + 0.5 x (1 - t^2) c (1 + 3 a x^2)), in place: two temporaries
        x, t = cache["x"], cache["t"]
        d = t * t
        np.subtract(1, d, out=d)
        d *= x
        q = x * x
        q *= 3 * 0.044715 * 0.5 * _C
        q += 0.5 * _C
        d *= q
        d += 0.5
        q[...] = t
        q *= 0.5
        d += q
        d *= dy
        return d


def silu(x):
    """x * sigmoid(x) (SiLU, the "swish" of SwiGLU)."""
    return x / (1 + np.exp(-x))


def silu_backward(x, dy):
    """dy * SiLU'(x) = dy * sigmoid(x) * (1 + x (1 - sigmoid(x)))."""
    sig = 1 / (1 + np.exp(-x))
    return dy * sig * (1 + x * (1 - sig))
