"""A transformer block split by Megatron's tensor parallelism (and sequence parallelism),
an ``nn`` module: forward, backward_input (B), backward_weight (W), backward (both, in
Megatron's order), FLOPs, what it caches, and where each parameter lives.

h = x + drop(attn(LN1(x))); y = h + drop(MLP(LN2(h))), pre-norm, as ``emulator.nn``'s
block (same parameter names), on the ranks of a tp group (``comm``; size 1 is one device):

* attention (:mod:`.attention`): q, k, v column-parallel (whole heads per rank), o
  row-parallel; its core swappable (:mod:`~emulator.parallel.attention_cores`: dense, ring or Ulysses over a
  context-parallel group);
* the MLP (:mod:`.mlp`): GELU or SwiGLU, column then row parallel; or a mixture of
  experts (:class:`~emulator.parallel.expert_parallel.ParallelMoE`, experts over ``ep``);
* the norms are replicated. Forward: two all-reduces (after o, after the MLP); backward:
  two more (the input gradients of q/k/v and of the MLP's first matrices);
* ``sequence_parallel=True``: x and y are this rank's slice of the sequence (b, s/t, d);
  norms, dropouts and residuals work on the slice; each all-reduce becomes an all-gather
  before the column-parallel layers and a reduce-scatter after the row-parallel ones. The
  norms' weights and the row-parallel biases then see only a slice of the sequence, so
  their gradients are partial sums over the group (their placements say ``partial=tp``):
  the block all-reduces them (``reduce_partial_grads=True``), or leaves it to whoever
  reduces gradients by placement (the mesh runtime). In backward the projections' input
  is all-gathered again for the weight gradients, as Megatron does;
  ``keep_gathered_input=True`` keeps the gathered copy instead (memory for bytes), as a
  stack with ``keep_gathered_input`` does always (PyTorch's autograd saves what the
  matrix multiply read);
* activations are kept in ``act_dtype`` (bf16 for the accounting), dropout masks as one
  byte per element, under the names of :func:`emulator.accounting.activation_terms`:
  :func:`cached_terms` of a forward's cache equals the formula term by term.
  ``recompute="selective"`` recomputes the softmax and its dropout in backward; ``"full"``
  keeps only the input; ``"op"`` keeps the input and the outputs of the ops torchtitan's
  per-op checkpointing keeps (:mod:`.op_checkpoint`), and in backward runs its forward
  again with those ops' outputs replayed: not computed, not charged, not sent again.
"""

import numpy as np

from ...accounting.activations import TERMS
from ...engine.charging import WorkMismatch
from ...engine.comm import Comm
from ...engine.world import World
from ...errors import ConfigError
from ...machine.work import np_dtype
from ...nn.dropout import apply as drop, dropout_mask
from ...nn.layernorm import layer_norm, layer_norm_backward
from ...nn.module import cache_bytes, sub
from ..attention_cores import DenseCore, UlyssesCore
from ..layer_shape import LayerShape
from ..placement import Placement, shard
from .attention import ParallelAttention
from .block_work import declared_block
from .mlp import ParallelMLP
from .op_checkpoint import SavedOps, check as check_op_checkpoint, passthrough, split_forward
from .overlap import TERegions
from .regions import TPRegions, all_reduce_together
from .regions_work import PIPELINE_SPLITS

RECOMPUTE = ("none", "selective", "op", "full")
NORMS = ("ln1.g", "ln1.b", "ln2.g", "ln2.b")


class TensorParallelBlock:
    charges_itself = True  # its compute is charged between its messages, not by the caller

    def __init__(self, comm, d_model, n_heads, d_ff, causal=True, sequence_parallel=False, dropout=0.0, seed=0,
                 act_dtype=np.float32, recompute="none", n_kv_heads=None, mlp="gelu", core=None,
                 keep_gathered_input=False, reduce_partial_grads=True):
        t = comm.size
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        dense = isinstance(mlp, str)
        if d_model % n_heads or n_heads % t or n_heads % n_kv_heads or n_kv_heads % t or (dense and d_ff % t):
            raise ConfigError(f"tensor parallelism over {t} ranks needs heads ({n_heads}), K/V heads ({n_kv_heads}) "
                              f"and d_ff ({d_ff}) divisible by {t}, and d_model ({d_model}) by the heads")
        if recompute not in RECOMPUTE:
            raise ConfigError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
        if dropout and core is not None:
            raise ConfigError("dropout is supported with the dense attention core only")
        if recompute == "op":
            cp = getattr(core, "cp", None)
            check_op_checkpoint(comm.stack, cp.size if cp is not None else 1, 0 if dense else 1)
        self.comm, self.d_model, self.n_heads, self.d_ff = comm, d_model, n_heads, d_ff
        self.sp, self.p, self.seed, self.act, self.recompute = sequence_parallel, dropout, seed, act_dtype, recompute
        self.reduce_partial_grads = reduce_partial_grads
        keep_gathered_input = keep_gathered_input or comm.stack.keep_gathered_input  # PyTorch's autograd keeps it
        payload = np_dtype(comm.work_context(act_dtype).dtype("tp"))
        self.regions = TPRegions(comm, sequence_parallel, payload)
        te = comm.stack.tp_comm_overlap and sequence_parallel and t > 1  # TE pipelines them with the GEMMs
        layer_regions = TERegions(comm, payload, PIPELINE_SPLITS, comm.stack.tp_overlap_sms) if te else self.regions
        keep = self._keep
        core = core or DenseCore(comm, causal, dropout, seed, recompute, keep,
                                 heads=(comm.rank * n_heads // t, n_heads))
        self.attn = ParallelAttention(layer_regions, d_model, n_heads, n_kv_heads, core, keep, keep_gathered_input,
                                      dtype=act_dtype)
        self.mlp = ParallelMLP(layer_regions, d_model, d_ff, mlp, keep, keep_gathered_input, dtype=act_dtype) \
            if dense else mlp

    # ----------------------------------------------------------------- where parameters live
    def placements(self):
        """{parameter: Placement} over the ``tp`` axis (and ``ep`` for experts)."""
        norm = Placement(partial=("tp",) if self.sp else ())
        out = {k: norm for k in NORMS}
        out.update({f"attn.{k}": v for k, v in self.attn.placements(self.sp).items()})
        out.update({f"mlp.{k}": v for k, v in self.mlp.placements(self.sp).items()})
        return out

    def coords(self):
        return {"tp": self.comm.rank, **getattr(self.mlp, "coords", lambda: {})()}

    def sizes(self):
        return {"tp": self.comm.size, **getattr(self.mlp, "sizes", lambda: {})()}

    def shard(self, full):
        """This rank's parameters, cut from the single-device block's by their placements."""
        return shard(full, self.placements(), self.coords(), self.sizes())

    @classmethod
    def shard_for(cls, full, rank, size, d_model, n_heads, d_ff, **options):
        """Rank ``rank``'s parameters of a block over ``size`` tensor-parallel ranks, cut as
        :meth:`shard` cuts them, without running a world (for code outside the emulator, such
        as a torch lab that loads the same shards)."""
        if not 0 <= rank < size:
            raise ConfigError(f"rank {rank} is not one of the {size} tensor-parallel ranks")
        comm = Comm(World(size), rank, tuple(range(size)), "tp")
        options = {k: v for k, v in options.items() if k != "recompute"}  # what a block recomputes cuts no shard
        return cls(comm, d_model, n_heads, d_ff, **options).shard(full)

    # ----------------------------------------------------------------- helpers
    def _keep(self, x):
        return x.astype(self.act, copy=False)

    def _mask(self, which, x):
        """The dropout mask of ``x`` (b, s_local, d) at this rank's global positions."""
        if not self.p:
            return None
        b, s_loc, d = x.shape
        s = s_loc * self.comm.size if self.sp else s_loc
        seq = self.regions.sequence_slice(s) if self.sp else slice(None)
        return dropout_mask(self.seed * 7919 + {"drop1": 2, "drop2": 3}[which], (b, s, d),
                            (slice(None), seq, slice(None)), self.p)

    def _norm(self, x, g, b, name):
        self.comm.charge(name)
        return layer_norm(x, g, b)

    # ----------------------------------------------------------------- its declared work
    def shape(self, x_shape):
        """The :class:`~emulator.parallel.layer_shape.LayerShape` of a micro-batch whose input is ``x_shape``."""
        b, s_loc = x_shape[0], x_shape[1]
        core, mlp = self.attn.core, self.mlp
        cp = getattr(core, "cp", None)
        moe = getattr(mlp, "moe", None)
        return LayerShape(b, s_loc * self.comm.size if self.sp else s_loc, self.d_model, self.n_heads,
                          self.attn.kv_heads * self.comm.size, self.d_ff, mlp=moe.mlp if moe else mlp.kind,
                          bias=True, dropout=self.p, causal=getattr(core, "causal", True), tp=self.comm.size,
                          sp=self.sp, cp=cp.size if cp is not None else 1,
                          cp_attention="ulysses" if isinstance(core, UlyssesCore) else "ring",
                          cp_layout=getattr(core, "layout", "zigzag"), recompute=self.recompute,
                          keep_gathered=self.attn.keep_gathered, n_experts=moe.n_experts if moe else 0,
                          top_k=moe.top_k if moe else 1, ep=mlp.ep.size if moe else 1,
                          stats=mlp._shape_of(x_shape).stats if moe else None,
                          partial_grads=self.sp and self.reduce_partial_grads and self.comm.size > 1)

    def work(self, x_shape, params_dtype=None):
        """This block's :class:`~emulator.machine.work.Work` for an input of ``x_shape``
        (``params_dtype``: its parameters' dtype, where it is not the activations')."""
        cp = getattr(self.attn.core, "cp", None)
        return declared_block(self.shape(x_shape), self.comm.work_context(self.act, params_dtype),
                              cp.rank if cp else 0)

    def _declared(self, params, x_shape, passes, what):
        dtype = np.result_type(*(v.dtype for v in params.values())) if params else None  # its grads
        return self.comm.declared(lambda: sum((getattr(self.work(x_shape, dtype), p) for p in passes), ()), what)

    # ----------------------------------------------------------------- forward
    def forward(self, params, x):
        """y and the cache; x is (b, s, d), or (b, s/t, d) with sequence parallelism."""
        with self._declared(params, np.shape(x), ("forward",), "block forward"):
            if self.recompute == "full":
                y, _ = self._forward(params, x)
                return y, {"layer input": self._keep(x)}
            if self.recompute == "op":
                return self._forward_keeping_ops(params, x)
            return self._forward(params, x)

    def _forward_keeping_ops(self, params, x):
        """torchtitan's per-op checkpoint: the input and the kept ops' outputs, by name."""
        kept = SavedOps([k.name for k in split_forward(self.work(np.shape(x)).forward)[0]], self._keep)
        y, _ = self._with(kept, lambda: self._forward(params, x))
        missing = sorted(kept.names - set(kept.values))
        if missing:
            raise WorkMismatch(f"rank {self.comm.global_rank}: the block declares {missing} kept, "
                               f"but its forward never ran them")
        return y, {"layer input": self._keep(x), "kept ops": kept.values}

    def _with(self, saved, run):
        self.attn.saved = self.mlp.saved = saved
        try:
            return run()
        finally:
            self.attn.saved = self.mlp.saved = passthrough

    def _forward(self, P, x):
        c = {"LayerNorm 1 input": self._keep(x)}
        o, c["attention"] = self.attn.forward(sub(P, "attn"), self._norm(x, P["ln1.g"], P["ln1.b"], "ln1"))
        m1 = self._mask("drop1", o)
        if m1 is not None:
            c["attention dropout mask"] = m1
        h = x + drop(o, m1, self.p)
        self.comm.charge("bias-dropout-add 1")
        c["LayerNorm 2 input"] = self._keep(h)
        z, c["mlp"] = self.mlp.forward(sub(P, "mlp"), self._norm(h, P["ln2.g"], P["ln2.b"], "ln2"))
        m2 = self._mask("drop2", z)
        if m2 is not None:
            c["MLP dropout mask"] = m2
        out = h + drop(z, m2, self.p)
        self.comm.charge("bias-dropout-add 2")
        return out, c

    # ----------------------------------------------------------------- backward
    def _cache(self, P, c, dy):
        if "kept ops" in c:  # per-op checkpoint: the forward again, the kept ops replayed
            kept = SavedOps(c["kept ops"], self._keep, c["kept ops"], dy.dtype, self.comm.replayed)
            _, again = self._with(kept, lambda: self._forward(P, c["layer input"].astype(dy.dtype, copy=False)))
        elif "layer input" in c:  # full recomputation: run the forward again first
            _, again = self._forward(P, c["layer input"].astype(dy.dtype, copy=False))
        else:
            return c
        c.clear()
        c.update(again)
        return c

    def _norm_back(self, c, name, P, d):
        x = c[{"ln1": "LayerNorm 1 input", "ln2": "LayerNorm 2 input"}[name]].astype(d.dtype, copy=False)
        dx, dg, db = layer_norm_backward(x, P[f"{name}.g"], d)
        self.comm.charge(f"{name} backward")
        c.setdefault("norm grads", {}).update({f"{name}.g": dg, f"{name}.b": db})
        return dx

    def _backward(self, P, c, dy, split):
        """The input gradient; the MLP's and attention's weight gradients too unless ``split``."""
        c = self._cache(P, c, dy)
        grads = {}

        def through(part, name, cached, d):  # B only, or B and W together
            if split:
                return part.backward_input(sub(P, name), c[cached], d)
            dx, g = part.backward(sub(P, name), c[cached], d)
            grads.update({f"{name}.{k}": v for k, v in g.items()})
            return dx

        dz = drop(dy, c.get("MLP dropout mask"), self.p)
        self.comm.charge("bias-dropout-add 2 backward")
        dh = dy + self._norm_back(c, "ln2", P, through(self.mlp, "mlp", "mlp", dz))
        self.comm.charge("residual 2 grad")
        do = drop(dh, c.get("attention dropout mask"), self.p)
        self.comm.charge("bias-dropout-add 1 backward")
        dx = dh + self._norm_back(c, "ln1", P, through(self.attn, "attn", "attention", do))
        self.comm.charge("residual 1 grad")
        c["B done"] = True  # the MLP and attention keep what their W needs (ColumnThenRow._kept_for_w)
        return dx, grads

    def backward_input(self, params, cache, dy):
        with self._declared(params, self._in_shape(cache, dy), ("backward_input",), "block backward (B)"):
            return self._backward(params, cache, dy, split=True)[0]

    def _in_shape(self, cache, dy):
        return np.shape(dy)

    def backward_weight(self, params, cache, dy):
        if "B done" not in cache:
            self.backward_input(params, cache, dy)
        with self._declared(params, self._in_shape(cache, dy), ("backward_weight",), "block backward (W)"):
            return self._weight(params, cache)

    def _weight(self, params, cache):
        cache.pop("B done")
        grads = {f"mlp.{k}": v for k, v in self.mlp.backward_weight(sub(params, "mlp"), cache["mlp"], None).items()}
        grads.update({f"attn.{k}": v for k, v in self.attn.backward_weight(sub(params, "attn"), cache["attention"],
                                                                           None).items()})
        return self._finish(grads, cache)

    def backward(self, params, cache, dy):
        """(dx, grads of this rank's parameters), the partial ones all-reduced if the block
        reduces them itself."""
        with self._declared(params, np.shape(dy), ("backward_input", "backward_weight"), "block backward"):
            dx, grads = self._backward(params, cache, dy, split=False)
            cache.pop("B done")
            return dx, self._finish(grads, cache)

    def _finish(self, grads, cache):
        grads.update(cache.pop("norm grads"))
        if self.sp and self.reduce_partial_grads:
            grads = self.sync_sequence_parallel_grads(grads)
        return grads

    def sync_sequence_parallel_grads(self, grads):
        """Under SP the norms and the row-parallel biases saw only this rank's slice of the
        sequence: their gradients are partial sums. One all-reduce of them all."""
        return all_reduce_together(self.comm, grads, [k for k, pl in self.placements().items() if "tp" in pl.partial])

    def flops(self, x_shape):
        """Matrix FLOPs of this rank's share, for a (local) input of ``x_shape``."""
        b, s, d = x_shape[-3:]
        rows = b * s * (self.comm.size if self.sp else 1)
        t = self.comm.size
        attn = 2 * rows * d * (d + 2 * self.attn.kv_heads * t * self.attn.dh) / t + 2 * rows * d * d / t
        core = 4 * b * (self.n_heads // t) * (s * (t if self.sp else 1)) ** 2 * (d // self.n_heads)
        mlp = self.mlp.flops((b, s * (t if self.sp else 1), d)) if hasattr(self.mlp, "flops") else \
            2 * rows * d * self.mlp.ff * (len(self.mlp.widen) + 1)
        fwd = attn + core + (mlp if not isinstance(mlp, dict) else mlp["forward"])
        return {"forward": fwd, "backward_input": fwd + core, "backward_weight": fwd - core}


def cached_terms(cache):
    """Bytes kept, by the accounting's term (a term may hold several tensors)."""
    out = {}
    for path, nbytes in cache_bytes(cache).items():
        parts = path.split(".")
        term = next((p for p in parts if p in TERMS), path)
        out[term] = out.get(term, 0) + nbytes
    return out
