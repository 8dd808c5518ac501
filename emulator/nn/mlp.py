"""The transformer's feed-forward block, two ways side by side:

* :class:`MLP` (GPT-2, Megatron): y = GELU(x A + a) B + b;
* :class:`SwiGLU` (PaLM, Llama; Shazeer, "GLU Variants Improve Transformer", 2020):
  y = (SiLU(x W_gate) * (x W_up)) W_down, no biases. Three matrices instead of two, so
  models that use it pick d_ff about 2/3 of the GELU MLP's for the same parameters.

Tensor parallelism splits both the same way: the matrices that widen (A; W_gate and W_up)
by columns, the one that narrows (B; W_down) by rows.
"""

import numpy as np

from .activations import GELU, silu, silu_backward
from .linear import Linear
from .module import Composite, add_flops, sub

MLP_KINDS = ("gelu", "swiglu")


class MLP(Composite):
    """y = GELU(x @ A + a) @ B + b, A = fc1.w (d, d_ff), B = fc2.w (d_ff, d).

    Megatron's split: A by columns, B by rows, so GELU stays local and the block needs one
    all-reduce (see the tensor-parallel lesson)."""

    def __init__(self, d_model, d_ff, dtype=np.float32):
        self.d_model, self.d_ff, self.dtype = d_model, d_ff, dtype
        self.fc1, self.act, self.fc2 = Linear(d_model, d_ff, dtype=dtype), GELU(), Linear(d_ff, d_model, dtype=dtype)

    def children(self):
        return [("fc1", self.fc1), ("act", self.act), ("fc2", self.fc2)]

    def forward(self, params, x):
        cache = {}
        h, cache["fc1"] = self.fc1.forward(sub(params, "fc1"), x)
        a, cache["act"] = self.act.forward({}, h)
        y, cache["fc2"] = self.fc2.forward(sub(params, "fc2"), a)
        return y, cache

    def backward_input(self, params, cache, dy):
        self._remember(cache, "fc2", dy)
        da = self.fc2.backward_input(sub(params, "fc2"), cache["fc2"], dy)
        dh = self.act.backward_input({}, cache["act"], da)
        self._remember(cache, "fc1", dh)
        return self.fc1.backward_input(sub(params, "fc1"), cache["fc1"], dh)

    def flops(self, x_shape):
        return add_flops(self.fc1.flops(x_shape), self.fc2.flops(tuple(x_shape[:-1]) + (self.d_ff,)))


class SwiGLU(Composite):
    """y = (SiLU(x @ Wg) * (x @ Wu)) @ Wd; Wg = gate.w, Wu = up.w (d, d_ff), Wd = down.w (d_ff, d).

    backward: with g = x Wg, u = x Wu, a = SiLU(g) * u: da = dy Wd^T; dg = SiLU'(g) u da,
    du = SiLU(g) da; dx = dg Wg^T + du Wu^T."""

    def __init__(self, d_model, d_ff, dtype=np.float32):
        self.d_model, self.d_ff, self.dtype = d_model, d_ff, dtype
        self.gate, self.up = Linear(d_model, d_ff, bias=False, dtype=dtype), Linear(d_model, d_ff, bias=False,
                                                                                   dtype=dtype)
        self.down = Linear(d_ff, d_model, bias=False, dtype=dtype)

    def children(self):
        return [("gate", self.gate), ("up", self.up), ("down", self.down)]

    def forward(self, params, x):
        cache = {}
        g, cache["gate"] = self.gate.forward(sub(params, "gate"), x)
        u, cache["up"] = self.up.forward(sub(params, "up"), x)
        sg = silu(g)
        y, cache["down"] = self.down.forward(sub(params, "down"), sg * u)
        cache["g"], cache["u"] = g, u
        return y, cache

    def backward_input(self, params, cache, dy):
        self._remember(cache, "down", dy)
        da = self.down.backward_input(sub(params, "down"), cache["down"], dy)
        g, u = cache["g"], cache["u"]
        dg, du = silu_backward(g, da * u), silu(g) * da
        self._remember(cache, "gate", dg)
        self._remember(cache, "up", du)
        return self.gate.backward_input(sub(params, "gate"), cache["gate"], dg) + \
            self.up.backward_input(sub(params, "up"), cache["up"], du)

    def flops(self, x_shape):
        return add_flops(self.gate.flops(x_shape), self.up.flops(x_shape),
                         self.down.flops(tuple(x_shape[:-1]) + (self.d_ff,)))
