"""One description of a parallel run: ``ParallelDims``, its mesh and its groups.

``ParallelDims(dp=2, tp=2, pp=2, cp=1, ep=1, zero_stage=1, sequence_parallel=True,
schedule="1f1b", micro_batches=4)`` says how a model's training is split over
``dp * tp * pp * cp`` GPUs, as torchtitan's ``ParallelDims`` and Megatron's arguments do:

* the mesh's axes are ``pp, dp, cp, tp``, the last innermost (torchtitan's order): the
  ``tp`` ranks of a group are consecutive, so they share a node (NVLink), ``cp`` next,
  then ``dp``, and ``pp`` outermost, so the stages of a pipeline sit on different nodes;
* ``ep`` borrows its ranks from ``dp x cp`` (as Megatron's expert parallelism and
  torchtitan's do): the ``dp * cp`` ranks of one ``(pp, tp)`` coordinate, numbered with
  ``cp`` fastest, form ``dp * cp / ep`` expert groups of ``ep`` consecutive ranks. Each
  expert group holds every expert once; the ranks that hold the same experts (one per
  expert group) are the *expert-data-parallel* group (``edp``), over which the experts'
  gradients are reduced, while attention and dense weights reduce over ``dp x cp``;
* ``zero_stage`` 0 (DDP) to 3 (FSDP) applies along those data-parallel groups;
* ``sequence_parallel`` splits the norms' and dropouts' activations over ``tp``;
* ``schedule`` (``gpipe``, ``1f1b``, ``interleaved_1f1b``, ``zb_h1``), ``micro_batches``
  per data-parallel replica and ``v`` chunks per pipeline rank describe the pipeline;
  ``pp=1`` is a one-stage pipeline;
* ``recompute``: ``"none"``, ``"selective"`` (the attention scores), ``"op"`` (torchtitan's
  per-op checkpointing: every second GEMM, norms and activations again; a PyTorch stack's,
  :mod:`~emulator.parallel.tensor_parallel.op_checkpoint`) or ``"full"`` (keep a layer's
  input only);
* ``cp_layout`` (``"zigzag"`` or ``"contiguous"``) and ``cp_attention`` (``"ring"`` or
  ``"ulysses"``) say how context parallelism cuts the sequence and runs attention.

``validate(model, seq_len, batch)`` raises a :class:`~emulator.errors.ConfigError` that
names every constraint the description breaks, not just the first.
"""

from dataclasses import dataclass, fields, replace

import numpy as np

from ..accounting.pipeline import interleaved_rounds
from ..errors import ConfigError
from ..mesh import DP_CP, EDP, EP, Mesh

AXES = ("pp", "dp", "cp", "tp")  # outermost first
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")
RECOMPUTE = ("none", "selective", "op", "full")
CP_LAYOUTS = ("contiguous", "zigzag")
CP_ATTENTION = ("ring", "ulysses")


def _positive(v):
    return not isinstance(v, bool) and isinstance(v, (int, np.integer)) and v >= 1


@dataclass(frozen=True)
class ParallelDims:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero_stage: int = 0
    sequence_parallel: bool = False
    schedule: str = "1f1b"
    micro_batches: int = 1
    v: int = 1
    recompute: str = "none"
    cp_layout: str = "zigzag"
    cp_attention: str = "ring"

    def __post_init__(self):
        bad = [f"{a}={getattr(self, a)!r} must be a positive int" for a in ("dp", "tp", "pp", "cp", "ep",
                                                                                "micro_batches", "v")
               if not _positive(getattr(self, a))]
        if self.zero_stage not in (0, 1, 2, 3):
            bad.append(f"zero_stage={self.zero_stage!r} must be 0 (DDP), 1, 2 or 3")
        for name, allowed in (("schedule", SCHEDULES), ("recompute", RECOMPUTE), ("cp_layout", CP_LAYOUTS),
                              ("cp_attention", CP_ATTENTION)):
            if getattr(self, name) not in allowed:
                bad.append(f"{name}={getattr(self, name)!r} must be one of {allowed}")
        if not isinstance(self.sequence_parallel, bool):
            bad.append(f"sequence_parallel must be True or False, got {self.sequence_parallel!r}")
        if bad:
            raise ConfigError("ParallelDims: " + "; ".join(bad))

    def __str__(self):
        parts = [f"{a}={getattr(self, a)}" for a in ("dp", "tp", "pp", "cp", "ep") if getattr(self, a) > 1] or ["dp=1"]
        extra = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.name not in ("dp", "tp", "pp", "cp", "ep") and getattr(self, f.name) != f.default]
        return "ParallelDims(" + ", ".join(parts + extra) + ")"

    # ----------------------------------------------------------------- sizes
    @property
    def world_size(self):
        return self.dp * self.tp * self.pp * self.cp

    @property
    def edp(self):
        """The expert-data-parallel size: replicas of each expert, dp * cp / ep."""
        return self.dp * self.cp // self.ep

    @property
    def stages(self):
        """Virtual pipeline stages: pp * v."""
        return self.pp * self.v

    def mesh_shape(self):
        return {a: getattr(self, a) for a in AXES}

    def mesh(self, gpus_per_node=8):
        return Mesh(self.mesh_shape(), gpus_per_node=gpus_per_node)

    def replace(self, **changes):
        return replace(self, **changes)

    # ----------------------------------------------------------------- groups
    def groups_of(self, rank, gpus_per_node=8):
        """The global ranks of every group ``rank`` belongs to: ``tp``, ``cp``, ``dp``,
        ``pp`` (mesh axes), ``dp,cp`` (where dense gradients reduce), ``ep`` (this rank's
        expert group) and ``edp`` (the ranks holding the same experts)."""
        mesh = self.mesh(gpus_per_node)
        out = {a: mesh.group_ranks(a, rank) for a in AXES}
        for group in (DP_CP, EP, EDP):  # cp fastest in dp x cp: flat index dp * cp + cp
            out[group] = group.ranks(mesh, rank, self.ep)
        return out

    # ----------------------------------------------------------------- validation
    def problems(self, model, seq_len=None, batch=None):
        """Every constraint this description breaks for ``model`` (an ``nn.GPT``, a planner's
        ``ModelSpec``, or anything with their attributes; a ``max_seq`` of None is not
        checked), a sequence of ``seq_len`` positions and a global batch of ``batch``
        sequences (None: not checked). A list of sentences; empty if valid."""
        out = []
        t = self.tp
        n_heads, n_kv = model.n_heads, getattr(model, "n_kv_heads", model.n_heads)
        experts = getattr(model, "n_experts", 0)
        if n_heads % t:
            out.append(f"tp={t} must divide the {n_heads} attention heads (each rank computes whole heads)")
        if n_kv % t:
            out.append(f"tp={t} must divide the {n_kv} K/V heads (grouped-query attention splits them too)")
        if model.d_ff % t:
            out.append(f"tp={t} must divide d_ff={model.d_ff} (the MLP's columns and rows)")
        if model.vocab % t:
            out.append(f"tp={t} must divide the vocabulary ({model.vocab}): the embedding and the output layer are "
                       f"split by vocabulary")
        if model.n_layers < self.stages:
            out.append(f"pp x v = {self.stages} stages need at least as many layers; the model has {model.n_layers}")
        if self.pp == 1 and self.v > 1:
            out.append(f"v={self.v} chunks need a pipeline (pp > 1)")
        if self.schedule == "interleaved_1f1b":
            if self.v < 2:
                out.append("the interleaved schedule needs v >= 2 chunks per pipeline rank")
            try:  # the micro-batch counts torch's ScheduleInterleaved1F1B builds (m < pp included)
                interleaved_rounds(self.pp, self.micro_batches)
            except ConfigError as exc:
                out.append(str(exc))
        elif self.v > 1:
            out.append(f"v={self.v} chunks need the interleaved schedule, not {self.schedule!r}")
        if experts:
            if experts % self.ep:
                out.append(f"ep={self.ep} must divide the {experts} experts")
        elif self.ep > 1:
            out.append(f"ep={self.ep} needs a mixture-of-experts model (n_experts > 0)")
        if (self.dp * self.cp) % self.ep:
            out.append(f"ep={self.ep} must divide dp x cp = {self.dp * self.cp}: expert parallelism borrows its ranks "
                       f"from the data- and context-parallel ranks")
        if self.cp > 1 and self.cp_attention == "ulysses" and (n_heads // max(t, 1)) % self.cp:
            out.append(f"Ulysses gives each of the cp={self.cp} ranks whole heads: it must divide the "
                       f"{n_heads // t} heads per tensor-parallel rank")
        if self.cp > 1 and self.cp_attention == "ulysses" and n_kv != n_heads:
            out.append("Ulysses here needs n_kv_heads == n_heads")
        if seq_len is not None:
            pieces = self.cp * (2 if self.cp > 1 and self.cp_layout == "zigzag" else 1)
            if seq_len % pieces:
                out.append(f"the sequence ({seq_len}) must divide into {pieces} equal pieces "
                           f"({self.cp_layout} over cp={self.cp})")
            elif self.sequence_parallel and (seq_len // self.cp) % t:
                out.append(f"sequence parallelism splits each rank's {seq_len // self.cp} positions over tp={t}: "
                           f"they must divide")
            max_seq = getattr(model, "max_seq", None)  # a planner's ModelSpec may leave it open (None)
            if max_seq is not None and seq_len > max_seq:
                out.append(f"the sequence ({seq_len}) is longer than the model's max_seq ({max_seq})")
        if batch is not None:
            per = self.dp * self.micro_batches
            if batch % per:
                out.append(f"the global batch ({batch} sequences) must split into dp x micro_batches = {per} equal "
                           f"micro-batches")
        return out

    def validate(self, model, seq_len=None, batch=None):
        """Raise a ConfigError naming every problem (see :meth:`problems`); return self."""
        found = self.problems(model, seq_len, batch)
        if found:
            raise ConfigError(f"{self} does not fit this model:\n" + "\n".join(f"  - {p}" for p in found))
        return self
