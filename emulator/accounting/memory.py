"""Training memory per GPU for parameters, gradients and optimizer state, by ZeRO stage.

``zero_bytes_per_gpu`` is the ZeRO paper's table: bf16 parameters and gradients (2 bytes
each per parameter) and K bytes of optimizer state per parameter (K = 12 for
mixed-precision Adam: fp32 master weights and two fp32 moments), on N_d data-parallel GPUs:

============  =================================
zero_stage 0  (2 + 2 + K) Psi           (plain data parallelism: everything replicated)
zero_stage 1  2 Psi + 2 Psi + K Psi / N_d (optimizer state sharded)
zero_stage 2  2 Psi + (2 + K) Psi / N_d   (gradients sharded too)
zero_stage 3  (2 + 2 + K) Psi / N_d       (parameters sharded too: FSDP)
============  =================================
"""

from ..errors import ConfigError

GB = 1e9


class ZeroBytes(float):
    """Bytes per GPU (the float's value), with the parts: ``params``, ``grads``,
    ``optimizer`` (attributes, or keys: ``b["grads"]``)."""

    def __new__(cls, params, grads, optimizer):
        self = super().__new__(cls, params + grads + optimizer)
        self.params, self.grads, self.optimizer = params, grads, optimizer
        return self

    @property
    def total(self):
        return float(self)

    def __getitem__(self, key):
        if key not in ("params", "grads", "optimizer", "total"):
            raise KeyError(f"{key!r}: the parts are 'params', 'grads', 'optimizer', 'total'")
        return getattr(self, key)

    def as_dict(self):
        return {"params": self.params, "grads": self.grads, "optimizer": self.optimizer, "total": self.total}

    def __repr__(self):
        return (f"ZeroBytes(total={self.total / GB:.4g} GB: params {self.params / GB:.4g}, "
                f"grads {self.grads / GB:.4g}, optimizer {self.optimizer / GB:.4g})")


def check_zero_stage(zero_stage):
    if zero_stage not in (0, 1, 2, 3):
        raise ConfigError(f"zero_stage must be 0 (plain data parallel), 1, 2 or 3 (ZeRO), got {zero_stage!r}")


def zero_bytes_per_gpu(n_params, dp_size, zero_stage, optimizer_bytes_per_param=12, param_bytes=2, grad_bytes=2):
    """Bytes of parameters, gradients and optimizer state on each of ``dp_size`` GPUs.

    ``zero_stage`` 0 is plain data parallelism; 1, 2, 3 are the ZeRO stages. Returns a float
    (the total) that also carries ``.params``, ``.grads`` and ``.optimizer``. The defaults
    are mixed-precision Adam (2 + 2 + 12 bytes); plain fp32 Adam is
    ``param_bytes=4, grad_bytes=4, optimizer_bytes_per_param=8``."""
    if not n_params > 0:
        raise ConfigError(f"n_params must be positive, got {n_params!r}")
    if not (isinstance(dp_size, int) and dp_size >= 1):
        raise ConfigError(f"dp_size must be a positive number of GPUs, got {dp_size!r}")
    check_zero_stage(zero_stage)
    if not optimizer_bytes_per_param >= 0:
        raise ConfigError(f"optimizer_bytes_per_param must be >= 0, got {optimizer_bytes_per_param!r}")
    p, g, k = float(param_bytes) * n_params, float(grad_bytes) * n_params, float(optimizer_bytes_per_param) * n_params
    n, z = dp_size, zero_stage
    return ZeroBytes(p / n if z >= 3 else p, g / n if z >= 2 else g, k / n if z >= 1 else k)


def zero1_state_gb(n_params, dp, tp, pp):
    """(GB per GPU of bf16 parameters and gradients, GB of mixed-precision Adam's state)
    under ZeRO-1 on a TP x PP x DP mesh: 4 bytes per parameter over TP x PP, and 12 bytes
    per parameter over TP x PP x DP."""
    return 4 * n_params / (tp * pp) / 1e9, 12 * n_params / (tp * pp * dp) / 1e9
