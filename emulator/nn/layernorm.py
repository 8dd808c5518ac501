"""Layer normalisation over the last dim."""

import numpy as np

from .module import Module, check_last_dim


def layer_norm(x, g, b, eps=1e-5):
    """y = (x - mean) / sqrt(var + eps) * g + b over the last dim (functional form)."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    r = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    return xc * r * g + b


def layer_norm_backward(x, g, dy, eps=1e-5):
    """(dx, dg, db) from the layer's *input* (the statistics are recomputed, as fused
    kernels do, so only the input is kept for backward)."""
    mu = x.mean(axis=-1, keepdims=True)
    xc = x - mu
    r = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + eps)
    xhat = xc * r
    dxhat = dy * g
    dx = r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))
    axes = tuple(range(dy.ndim - 1))
    return dx, (dy * xhat).sum(axis=axes), dy.sum(axis=axes)


class LayerNorm(Module):
    """y = (x - mean) / sqrt(var + eps) * g + b, statistics over the last dim.

    backward: with xhat the normalised input and r = 1/sqrt(var + eps),
    dx = r * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dy * g (B);
    dg = sum(dy * xhat), db = sum(dy) (W).
    """

    def __init__(self, d, eps=1e-5, dtype=np.float32):
        self.d, self.eps, self.dtype = d, eps, dtype

    def init(self, rng):
        return {"g": np.ones(self.d, self.dtype), "b": np.zeros(self.d, self.dtype)}

    def forward(self, params, x):
        check_last_dim("LayerNorm", x, self.d)
        mu = x.mean(axis=-1, keepdims=True)
        xc = x - mu
        r = 1.0 / np.sqrt((xc * xc).mean(axis=-1, keepdims=True) + self.eps)
        xhat = xc * r
        return xhat * params["g"] + params["b"], {"xhat": xhat, "r": r}

    def backward_input(self, params, cache, dy):
        xhat, r = cache["xhat"], cache["r"]
        dxhat = dy * params["g"]
        return r * (dxhat - dxhat.mean(-1, keepdims=True) - xhat * (dxhat * xhat).mean(-1, keepdims=True))

    def backward_weight(self, params, cache, dy):
        xhat = cache["xhat"]
        axes = tuple(range(dy.ndim - 1))
        return {"g": (dy * xhat).sum(axis=axes), "b": dy.sum(axis=axes)}
