"""AdamW, on a whole parameter dict or on any shard of it (ZeRO shards it by rank).

Update, as torch.optim.AdamW: p <- p - lr*wd*p; m <- b1 m + (1-b1) g; v <- b2 v + (1-b2) g^2;
p <- p - lr * (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).

``mixed_precision=True``: parameters and gradients are bf16 (``ml_dtypes.bfloat16``); the
state keeps fp32 master weights and fp32 moments (12 bytes per parameter). ``step``
upcasts the bf16 gradient to fp32, updates the fp32 master copy, and returns the master
rounded to bf16. So a parameter costs 2 (param) + 2 (grad) + 4 + 4 + 4 = 16 bytes.
"""

import numpy as np

from ..errors import ConfigError
from ml_dtypes import bfloat16


class AdamW:
    def __init__(self, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, mixed_precision=False):
        if lr < 0 or not (0 <= betas[0] < 1 and 0 <= betas[1] < 1) or eps <= 0 or weight_decay < 0:
            raise ConfigError(f"AdamW: need lr >= 0, 0 <= betas < 1, eps > 0, weight_decay >= 0; "
                             f"got lr={lr}, betas={betas}, eps={eps}, weight_decay={weight_decay}")
        self.lr, self.betas, self.eps, self.wd = lr, betas, eps, weight_decay
        self.mixed_precision = mixed_precision

    def init(self, params):
        state = {"t": 0,
                 "m": {k: np.zeros_like(v, dtype=self._state_dtype(v)) for k, v in params.items()},
                 "v": {k: np.zeros_like(v, dtype=self._state_dtype(v)) for k, v in params.items()}}
        if self.mixed_precision:
            for k, v in params.items():
                if v.dtype not in (np.dtype(bfloat16), np.dtype(np.float16)):
                    raise ConfigError(f"AdamW(mixed_precision=True): parameter {k!r} is {v.dtype}; "
                                     f"pass 16-bit parameters (ml_dtypes.bfloat16, or float16)")
            state["master"] = {k: v.astype(np.float32) for k, v in params.items()}
        return state

    def _state_dtype(self, v):
        return np.float32 if self.mixed_precision else v.dtype

    def step(self, params, grads, state):
        """One update. Returns (new params, state); the state's arrays update in place."""
        missing = set(params) - set(grads)
        if missing:
            raise ConfigError(f"AdamW.step: no gradient for {sorted(missing)}")
        t = state["t"] + 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1**t, 1 - b2**t
        new = {}
        for k in params:
            g = grads[k]
            if self.mixed_precision:
                g = g.astype(np.float32)  # upcast here: all arithmetic below is fp32
                p = state["master"][k]
            else:
                p = params[k].copy()
            m, v = state["m"][k], state["v"][k]
            p *= 1 - self.lr * self.wd
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * g * g
            p -= self.lr * (m / c1) / (np.sqrt(v / c2) + self.eps)
            new[k] = p.astype(params[k].dtype) if self.mixed_precision else p
        state["t"] = t
        return new, state
