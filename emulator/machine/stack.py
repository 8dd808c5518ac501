"""A software stack as data: which kernels a training step runs, which collectives it hides
behind compute, and what each kernel costs the host.

:class:`Stack` fields:

* ``precision``: the :class:`~emulator.machine.precision.Precision` policy;
* ``attention``: ``"flash"`` (one fused kernel per pass: FlashAttention or cuDNN's) or
  ``"unfused"`` (the scores as batched GEMMs, written to HBM, with separate softmax and
  dropout kernels, as Megatron-LM ran before FlashAttention);
* ``flash_kernel``: which fused kernel: ``"flash"``, the device's fastest (on H100,
  FlashAttention-3's rates); ``"cudnn"``, cuDNN's fused attention, which Transformer
  Engine prefers on Hopper (FA3's Fig. 5 and 6 put it 1% to 23% below FA3 at 2k to 16k
  tokens); or ``"flash2"``, FlashAttention-2 (PyTorch's SDPA flash backend; on H100 about
  half FA3's rate). A device without rows of its own for a kernel (A100) times it as its
  fastest;
* ``fused``: the elementwise fusions it has (:data:`FUSIONS`); without one, each op of the
  chain is its own kernel with its own HBM traffic (:mod:`emulator.machine.elementwise`);
* ``grad_overlap``: ``"backward"``: data-parallel gradients reduced in buckets while
  backward still runs; ``"after_flush"``: once, after the pipeline flush;
  ``bucket``: how the buckets are cut (:class:`Bucket`);
* ``param_gather_overlap``: ZeRO-1's (Megatron's distributed optimizer's) all-gather of
  the updated weights issued bucket by bucket during the next forward;
* ``fsdp_prefetch``: ZeRO-3/FSDP gathers the next unit while the current one computes;
* ``fsdp_unsharded_in_pipeline``: under pipeline parallelism ZeRO-3 keeps each stage's
  layers gathered from their first forward to the step's end and their gradients whole,
  summed in the reduction's dtype, and reduce-scatters them once, after the last micro-batch
  (FSDP2 inside ``torch.distributed.pipelining``, as torchtitan runs it); else each pass
  gathers and each backward reduce-scatters;
* ``tp_comm_overlap``: Transformer Engine's userbuffers: tensor-parallel all-gathers and
  reduce-scatters pipelined with the GEMMs beside them, ``tp_overlap_sms`` SMs taken from
  the GEMM for the pipelined ones;
* ``p2p_overlap``: pipeline sends and receives overlapped with the next chunk's compute;
* ``keep_gathered_input``: under sequence parallelism, whether a column-parallel layer keeps
  its all-gathered input for its weight gradient (PyTorch: autograd saves the tensor the
  matrix multiply read, the input DTensor redistributed to whole), or keeps its slice and
  all-gathers it again in backward (Megatron);
* ``op_checkpoint``: whether the stack offers torchtitan's per-op selective activation
  checkpointing (``recompute="op"``, :mod:`emulator.parallel.tensor_parallel.op_checkpoint`);
* ``launch``: the GPU's gap between two kernels; ``dispatch``: the host's time to issue one
  kernel (a kernel cannot start before the host has issued it: a step of many small kernels
  is bound by the host).

Every setting of a preset carries a :class:`~emulator.machine.stack_sources.Source` (the
framework's file and line at a commit, or a published measurement): ``stack.sources``.
The presets are :data:`PRESETS`, their sources in :mod:`emulator.machine.stack_sources`;
:func:`stack_preset` returns one.
"""

from dataclasses import dataclass, field, replace

from ..errors import ConfigError
from .precision import PRESETS as POLICIES
from .precision import Precision, precision_preset
from .stack_sources import MEGATRON_2021, MEGATRON_CORE, PYTORCH_COMPILE, PYTORCH_EAGER
from .frozen import hash_once
from .device import ATTENTION_IMPLS

FUSIONS = {
    "norm": "a norm's forward (and its backward) as one kernel, its output cast to the compute dtype",
    "bias_act": "bias, GeLU or SwiGLU as one kernel (forward and backward)",
    "bias_dropout_add": "bias, dropout and the residual add as one kernel",
    "rope": "rotary embeddings of q and k as one kernel",
    "softmax": "attention's scale, mask and softmax as one kernel (unfused attention)",
    "cross_entropy": "the vocabulary-parallel cross-entropy as one kernel per pass",
    "adam": "the optimizer's update of every parameter as one multi-tensor kernel",
    "grad_accumulation": "weight-gradient GEMMs accumulate into the fp32 main gradients",
    "elementwise": "every chain of pointwise ops between two GEMMs as one generated kernel",
}
GRAD_OVERLAP = ("backward", "after_flush")


@dataclass(frozen=True)
class Bucket:
    """How gradient buckets are cut: at least ``minimum`` of ``unit`` (``"params"``: elements;
    ``"bytes"``), or ``per_rank`` times the data-parallel size if larger (Megatron's rule);
    ``first``: a smaller first bucket (torch DDP's); ``first_stage_only``: only pipeline
    rank 0 cuts buckets, the others reduce their gradients as one (Megatron)."""

    unit: str
    minimum: float
    per_rank: float = 0.0
    first: float = None
    first_stage_only: bool = False

    def size(self, dp):
        return max(self.minimum, self.per_rank * dp)


@dataclass(frozen=True)
class Stack:
    __hash__ = hash_once  # its tables hashed once

    name: str
    title: str
    precision: Precision
    attention: str
    fused: frozenset
    grad_overlap: str
    bucket: Bucket
    param_gather_overlap: bool
    fsdp_prefetch: bool
    tp_comm_overlap: bool
    tp_overlap_sms: int
    p2p_overlap: bool
    launch: float
    dispatch: float
    sources: dict = field(default_factory=dict, compare=False, repr=False)
    flash_kernel: str = "flash"
    op_checkpoint: bool = False
    keep_gathered_input: bool = False
    fsdp_unsharded_in_pipeline: bool = False

    def __post_init__(self):
        bad = []
        if self.attention not in ("flash", "unfused"):
            bad.append(f"attention={self.attention!r} (use 'flash' or 'unfused')")
        if self.flash_kernel not in ATTENTION_IMPLS:
            bad.append(f"flash_kernel={self.flash_kernel!r} (use {' or '.join(map(repr, ATTENTION_IMPLS))})")
        unknown = set(self.fused) - set(FUSIONS)
        if unknown:
            bad.append(f"fused={sorted(unknown)} (known: {', '.join(FUSIONS)})")
        if self.grad_overlap not in GRAD_OVERLAP:
            bad.append(f"grad_overlap={self.grad_overlap!r} (use {' or '.join(GRAD_OVERLAP)})")
        if not isinstance(self.precision, Precision):
            bad.append(f"precision={self.precision!r} (a Precision)")
        for what in ("launch", "dispatch"):
            v = getattr(self, what)
            if not (isinstance(v, (int, float)) and 0 <= v < 1e-2):
                bad.append(f"{what}={v!r} (seconds per kernel, 0 to 10 ms)")
        if bad:
            raise ConfigError(f"Stack {self.name!r}: " + "; ".join(bad))

    def has(self, fusion):
        return fusion in self.fused

    @property
    def fuses_projections(self):
        """Whether q, k and v (and a SwiGLU's gate and up) run as one GEMM each, as
        Megatron's ``linear_qkv`` and ``linear_fc1`` do; else one GEMM per projection, as
        eager PyTorch runs a model written as torchtitan writes it."""
        return self.name.startswith("megatron")

    def replace(self, **changes):
        return replace(self, **changes)

    def describe(self):
        """A few lines a person reads: each setting and its source."""
        lines = [f"{self.name}: {self.title}", f"  precision: {self.precision.describe()}",
                 f"  attention: {self.attention}" + (f" ({self.flash_kernel})" if self.attention == "flash" else ""),
                 f"  fused: {', '.join(sorted(self.fused)) or 'nothing'}",
                 f"  gradient reduction: {self.grad_overlap}, buckets {self.bucket}",
                 f"  overlaps: param gather {self.param_gather_overlap}, FSDP prefetch {self.fsdp_prefetch}, "
                 f"TP comm {self.tp_comm_overlap} ({self.tp_overlap_sms} SMs), p2p {self.p2p_overlap}",
                 f"  per-op activation checkpointing (recompute='op'): {self.op_checkpoint}; "
                 f"gathered input kept for the weight gradient: {self.keep_gathered_input}",
                 f"  ZeRO-3 in a pipeline: layers kept gathered and gradients whole until one reduce-scatter "
                 f"after the stage's last backward: {self.fsdp_unsharded_in_pipeline}",
                 f"  per kernel: launch {self.launch * 1e6:.1f} us, host dispatch {self.dispatch * 1e6:.1f} us"]
        for key, src in sorted(self.sources.items()):
            lines.append(f"  [{key}] {src.cite()}")
        return "\n".join(lines)


# The presets, each setting's source in :mod:`emulator.machine.stack_sources`.
PRESETS = {
    "megatron-core": Stack(
        "megatron-core", "Megatron-Core with Transformer Engine (the Megatron-LM README's H100 runs)",
        POLICIES["megatron-bf16"], "flash",
        frozenset({"norm", "bias_act", "bias_dropout_add", "rope", "grad_accumulation", "adam"}), "backward",
        Bucket("params", 40_000_000, 1_000_000, first_stage_only=True), True, False, True, 16, True,
        1.1e-6, 7e-6, MEGATRON_CORE, flash_kernel="cudnn"),
    "megatron-2021": Stack(
        "megatron-2021", "Megatron-LM as Narayanan et al. 2021 and Korthikanti et al. 2022 ran it",
        POLICIES["megatron-fp16"], "unfused",
        frozenset({"norm", "bias_act", "bias_dropout_add", "softmax", "adam"}), "after_flush",
        Bucket("params", float("inf")), False, False, False, 0, False, 1.1e-6, 7e-6, MEGATRON_2021),
    "pytorch-eager": Stack(
        "pytorch-eager", "PyTorch eager with torch.distributed (DDP, FSDP2, DTensor TP), as torchtitan writes a model",
        POLICIES["fsdp2-bf16"], "flash", frozenset({"norm", "adam"}), "backward",
        Bucket("bytes", 25 * 2**20, first=2**20), False, True, False, 0, False, 1.1e-6, 7e-6, PYTORCH_EAGER,
        flash_kernel="flash2", op_checkpoint=True, keep_gathered_input=True, fsdp_unsharded_in_pipeline=True),
    "pytorch-compile": Stack(
        "pytorch-compile", "PyTorch with torch.compile (Inductor's fused elementwise kernels)",
        POLICIES["fsdp2-bf16"], "flash", frozenset({"norm", "adam", "elementwise"}), "backward",
        Bucket("bytes", 25 * 2**20, first=2**20), False, True, False, 0, False, 1.1e-6, 6.8e-6, PYTORCH_COMPILE,
        flash_kernel="flash2", op_checkpoint=True, keep_gathered_input=True, fsdp_unsharded_in_pipeline=True),
}


def stack_preset(name=None):
    """The :class:`Stack` called ``name`` (None: ``"megatron-core"``), or the Stack itself."""
    if name is None:
        name = "megatron-core"
    if isinstance(name, Stack):
        return name
    key = str(name).lower()
    if key not in PRESETS:
        raise ConfigError(f"unknown software stack {name!r}; known: {', '.join(PRESETS)}")
    return PRESETS[key]


@dataclass(frozen=True)
class Context:
    """What a module's declaration needs of a run: its stack, its precision policy, and the
    dtype its arrays hold (which a field left None in the policy means).

    ``dtype(what)``: the dtype name of ``what`` (a :class:`Precision` field): ``compute``,
    ``params`` and ``activations`` default to the arrays'; payloads to ``compute``;
    ``grads`` to ``params``, ``grad_reduce`` to ``grads``; ``loss`` to fp32 or the arrays'
    if wider."""

    __hash__ = hash_once  # its tables hashed once

    stack: Stack
    precision: Precision
    array: str = "bf16"

    def dtype(self, what):
        p = self.precision
        if what in ("compute", "params"):
            return p.of(what, self.array)
        if what == "activations":
            return p.of(what, self.dtype("compute"))
        if what in ("tp", "cp", "pp", "ep"):
            return p.of(what, self.dtype("compute"))
        if what == "param_gather":
            return p.of(what, self.dtype("params"))
        if what == "grads":
            return p.of(what, self.dtype("params"))
        if what == "grad_reduce":
            return p.of(what, self.dtype("grads"))
        if what == "optimizer":
            return p.of(what, self.dtype("params"))
        if what == "loss":
            return p.of(what, "fp64" if self.array == "fp64" else "fp32")
        if what == "master":
            return p.master
        raise ConfigError(f"Context.dtype: unknown field {what!r}")


def context(stack=None, precision=None, array="bf16"):
    """A :class:`Context`: ``stack`` (a name or Stack; None: ``"megatron-core"``), its policy
    unless ``precision`` (a name or Precision) is given, the arrays' dtype name."""
    s = stack_preset(stack)
    return Context(s, s.precision if precision is None else precision_preset(precision), array)
