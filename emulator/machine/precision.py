"""A precision policy: the dtype of every kind of number a training step holds or sends.

=================  ==========================================================================
field              what it is the dtype of
=================  ==========================================================================
``params``         the weights the model holds and multiplies with
``compute``        activations, the inputs of every GEMM and attention kernel
``master``         the optimizer's copy of the weights (None: the weights themselves)
``grads``          gradients as they accumulate over micro-batches and wait for the update
``grad_reduce``    the data-parallel reduction's payload (all-reduce or reduce-scatter)
``optimizer``      Adam's two moments
``activations``    what forward keeps for backward
``tp``, ``cp``,    the payloads of tensor-, context-, pipeline- and expert-parallel
``pp``, ``ep``     communication
``param_gather``   ZeRO's and FSDP's all-gather of the weights
``loss``           the cross-entropy's reductions (max, sum of exponentials, target logit)
=================  ==========================================================================

A field set to None means "as the arrays are": a data run in float64 keeps every number in
float64 and sends it so (:func:`native`), which is what lets runs prove equality with one
device. The presets (:func:`precision_preset`):

* ``"megatron-bf16"``: Megatron-Core under ``--bf16``: bf16 weights and activations,
  fp32 master weights and moments in the (distributed) optimizer, fp32 gradients
  (``main_grad``), reduced over the data-parallel ranks in fp32 (``--bf16`` forces
  ``accumulate_allreduce_grads_in_fp32``), every model-parallel payload in bf16, the loss's
  reductions in fp32: 2 + 4 + 4 + 8 = 18 bytes per parameter (:mod:`.stack_sources`);
* ``"zero-mixed"``: the ZeRO paper's mixed-precision Adam (Rajbhandari et al. 2020,
  section 3.1): 16-bit weights and gradients, fp32 master and moments: 2 + 2 + 12 = 16
  bytes per parameter (lesson 01);
* ``"fsdp2-bf16"``: FSDP2 with ``MixedPrecisionPolicy(param_dtype=bfloat16,
  reduce_dtype=float32)``: fp32 sharded weights (their own master), gathered in bf16 for
  compute, gradients reduce-scattered and kept in fp32;
* ``"fp32"``: everything in fp32 (16 bytes per parameter with Adam).
"""

from dataclasses import dataclass, fields, replace

from ..errors import ConfigError
from .work import DTYPE_BYTES, dtype_bytes, dtype_name

FIELDS = ("params", "compute", "master", "grads", "grad_reduce", "optimizer", "activations", "tp", "cp", "pp", "ep",
          "param_gather", "loss")


@dataclass(frozen=True)
class Precision:
    name: str
    params: str = None
    compute: str = None
    master: str = None
    grads: str = None
    grad_reduce: str = None
    optimizer: str = None
    activations: str = None
    tp: str = None
    cp: str = None
    pp: str = None
    ep: str = None
    param_gather: str = None
    loss: str = None

    def __post_init__(self):
        bad = [f"{f}={getattr(self, f)!r}" for f in FIELDS if getattr(self, f) is not None
               and getattr(self, f) not in DTYPE_BYTES]
        if bad:
            raise ConfigError(f"Precision {self.name!r}: unknown dtype(s) {', '.join(bad)}; known: "
                              f"{', '.join(d for d in DTYPE_BYTES if d.startswith(('fp', 'bf')))}")
        if self.params is not None and self.params in ("fp8",):
            raise ConfigError(f"Precision {self.name!r}: fp8 weights cannot be trained here (no master copy "
                              f"scaling is modelled); use bf16 weights with an fp32 master")
        if self.master is not None and self.params is not None and self.master == self.params:
            raise ConfigError(f"Precision {self.name!r}: master={self.master!r} equals params; leave master=None "
                              f"when the optimizer updates the weights themselves")

    def of(self, what, default):
        """The dtype name of ``what`` (a field), or ``default`` (the arrays' own) where it is None."""
        v = getattr(self, what)
        return default if v is None else v

    def bytes_per_param(self, optimizer_moments=2, default="fp32"):
        """Bytes one parameter costs by kind (unsharded): weights, gradients, the optimizer
        (master copy and ``optimizer_moments`` moments)."""
        p = dtype_bytes(self.of("params", default))
        g = dtype_bytes(self.of("grads", self.of("params", default)))
        master = dtype_bytes(self.master) if self.master else 0
        opt = master + optimizer_moments * dtype_bytes(self.of("optimizer", self.of("params", default)))
        return {"params": p, "grads": g, "optimizer": opt}

    def replace(self, **changes):
        return replace(self, **changes)

    def describe(self):
        return f"{self.name}: " + ", ".join(f"{f} {getattr(self, f)}" for f in FIELDS if getattr(self, f))


def native(np_dtype):
    """Every number in the arrays' own dtype (``np_dtype``), nothing cast: a float64 run stays exact."""
    name = dtype_name(np_dtype)
    return Precision(f"native {name}")


def _mixed(name, params, grads, grad_reduce, master="fp32", param_gather=None):
    return Precision(name, params=params, compute="bf16", master=master, grads=grads, grad_reduce=grad_reduce,
                     optimizer="fp32", activations="bf16", tp="bf16", cp="bf16", pp="bf16", ep="bf16",
                     param_gather=param_gather or "bf16", loss="fp32")


PRESETS = {
    "megatron-bf16": _mixed("megatron-bf16", "bf16", "fp32", "fp32"),
    "megatron-fp16": _mixed("megatron-fp16", "fp16", "fp32", "fp32").replace(compute="fp16", activations="fp16",
                                                                              tp="fp16", cp="fp16", pp="fp16",
                                                                              ep="fp16", param_gather="fp16"),
    "zero-mixed": _mixed("zero-mixed", "bf16", "bf16", "bf16"),
    "fsdp2-bf16": _mixed("fsdp2-bf16", "fp32", "fp32", "fp32", master=None),
    "fp32": Precision("fp32", *(["fp32"] * 2), None, *(["fp32"] * 10)),
}


def precision_preset(name):
    """A :class:`Precision` by name (the module docstring lists them), or the object itself."""
    if isinstance(name, Precision):
        return name
    key = str(name).lower()
    if key not in PRESETS:
        raise ConfigError(f"precision_preset: no policy {name!r}; known: {', '.join(PRESETS)}, or build a "
                          f"Precision(name, params=..., ...)")
    return PRESETS[key]


def shorthand(param_bytes=None, mixed=None):
    """The policy the old ``param_bytes`` / ``mixed`` arguments stood for: (2, True) the ZeRO
    paper's 16 bytes per parameter, (4, False) fp32 throughout; None when neither is given."""
    if param_bytes is None and mixed is None:
        return None
    param_bytes = 2 if param_bytes is None else param_bytes
    mixed = (param_bytes == 2) if mixed is None else mixed
    if (param_bytes, bool(mixed)) == (2, True):
        return PRESETS["zero-mixed"]
    if (param_bytes, bool(mixed)) == (4, False):
        return PRESETS["fp32"]
    if (param_bytes, bool(mixed)) == (2, False):
        return Precision("bf16", *(["bf16"] * 2), None, *(["bf16"] * 10)).replace(loss="fp32")
    raise ConfigError(f"param_bytes={param_bytes!r}, mixed={mixed!r}: use param_bytes=2 with mixed=True (bf16 "
                      f"weights, fp32 master and moments), 4 with mixed=False (fp32), or pass precision=")


__all__ = ["Precision", "precision_preset", "native", "shorthand", "PRESETS", "fields"]
