"""The transformer's feed-forward block."""

import numpy as np

from .activations import GELU
from .linear import Linear
from .module import Composite, add_flops, sub


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
