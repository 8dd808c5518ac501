"""The shape of one rank's share of a transformer layer for one micro-batch: what a module's
declaration of work (:mod:`emulator.machine.work`) is a function of, with the context
(:class:`~emulator.machine.stack.Context`: stack, precision).

Built by the modules from their configuration and their input (a data or shape-only run),
and by the planner from a :class:`~emulator.planner.ModelSpec` and a
:class:`~emulator.parallel.ParallelDims` (:func:`of_plan`): the two read one declaration.
"""

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class LayerShape:
    b: int  # sequences in the micro-batch
    n: int  # positions on this rank (its context-parallel shard)
    d: int
    heads: int
    kv_heads: int
    d_ff: int
    vocab: int = 0
    head_dim: int = None
    mlp: str = "gelu"
    bias: bool = True
    norm: str = "layernorm"
    rope: bool = False
    dropout: float = 0.0
    causal: bool = True
    tp: int = 1
    sp: bool = False
    cp: int = 1
    cp_attention: str = "ring"
    cp_layout: str = "zigzag"
    recompute: str = "none"
    keep_gathered: bool = False
    n_experts: int = 0
    top_k: int = 1
    ep: int = 1
    counts: tuple = None  # rows routed to each of this rank's experts (None: an even router)
    stats: tuple = None  # (ranks, runs) of the MoE token group whose statistics are all-gathered, or None
    partial_grads: bool = False  # the block all-reduces its partial (sequence-parallel) gradients itself

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.d // self.heads)

    @property
    def rows(self):
        """Tokens a column-parallel layer sees (the whole local sequence)."""
        return self.b * self.n

    @property
    def rows_sp(self):
        """Tokens held between layers: a 1/tp slice of the sequence under sequence parallelism."""
        return self.rows // self.tp if (self.sp and self.tp > 1) else self.rows

    @property
    def sequence_parallel(self):
        return self.sp and self.tp > 1

    @property
    def h(self):
        return self.heads // self.tp

    @property
    def kv(self):
        return self.kv_heads // self.tp

    @property
    def ff(self):
        return self.d_ff // self.tp

    @property
    def widen(self):
        return 1 if self.mlp == "gelu" else 2

    @property
    def qkv(self):
        """Columns of this rank's q, k and v projections."""
        return (self.h + 2 * self.kv) * self.head_dim

    def replace(self, **changes):
        return replace(self, **changes)


def of_plan(model, dims, b, seq_len, keep_gathered=False):
    """The shape of one block on a rank of ``dims`` for ``model`` (a ModelSpec). Full
    recomputation is the pipeline stage's (it runs a layer's forward again), not the block's.
    ``keep_gathered``: the stack keeps the column-parallel layers' gathered input under SP."""
    return LayerShape(b, seq_len // dims.cp, model.d_model, model.n_heads, model.n_kv_heads, model.d_ff,
                      model.vocab, model.head_dim, model.mlp, getattr(model, "bias", True),
                      getattr(model, "norm", "layernorm"), model.positions == "rope", getattr(model, "dropout", 0.0),
                      True, dims.tp, dims.sequence_parallel, dims.cp, dims.cp_attention, dims.cp_layout,
                      "none" if dims.recompute == "full" else dims.recompute,
                      keep_gathered and dims.sequence_parallel, model.n_experts, model.top_k,
                      dims.ep)
