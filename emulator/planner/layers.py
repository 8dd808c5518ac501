"""One rank's layers as the planner sees them: what each holds, and the work each does.

For a plan (a :class:`~emulator.parallel.ParallelDims`), a micro-batch of ``b`` sequences
and a :class:`~emulator.machine.stack.Context` (stack and precision), :func:`rank_layers`
describes every layer one rank of a pipeline stage runs:

* ``ops``: per pass (``F``, ``B`` the input gradient, ``W`` the weight gradients, ``F0``
  the forward run again under full recomputation) the items of the modules' own
  declarations (:func:`emulator.parallel.tensor_parallel.block_work.block_work`,
  :func:`~emulator.parallel.mesh_model.embedding_work`, ``head_work``, ``loss_work``): the
  same kernels and collectives the emulator charges as the modules run. Nothing here
  restates a module's work;
* ``params``: this rank's parameter elements, by the group their gradients reduce over
  (``dense``: ``dp x cp``; ``experts``: ``edp``), after tensor and expert parallelism;
  ``partial``: elements whose gradients are partial sums over ``tp`` (sequence parallelism);
* ``kept``: bytes its forward keeps for backward per micro-batch (``input``: its input
  only, what full recomputation keeps), ``grad_out``: the output gradient a split
  backward keeps from ``B`` to ``W``, ``for_w``: what else that ``B`` leaves for ``W``
  (the output gradients of the weight GEMMs, and the cache it built again under
  recomputation); ``loss``: what the loss after the output layer keeps
  from its forward to its backward (the vocabulary-parallel cross-entropy's gradient of
  the logits, computed in the forward as Megatron's is); ``transient``: buffers held only
  while its forward, its backward, runs (ring attention's K/V).

The emulator computes in fp32 (or the arrays' dtype) what a bf16 model computes and keeps
activations in the model's dtype: the kept bytes below follow what its modules cache.
"""

from dataclasses import dataclass, field, replace
from functools import lru_cache

from ..machine.work import RingAttention, dtype_bytes, flops_of
from ..parallel.attention_cores import causal_share
from ..parallel.dims import ParallelDims
from ..parallel.layer_shape import of_plan
from ..parallel.mesh_model import embedding_work, head_work, loss_work
from ..parallel.pipeline.actions import stage_of
from ..parallel.pipeline.partition import split_layers
from ..parallel.tensor_parallel.block_work import declared_block
from ..parallel.tensor_parallel.op_checkpoint import cached_bytes, saved_bytes, split_forward
from .precision_of import plan_context

INT = 8  # int64 token ids and indices


@dataclass
class Layer:
    name: str
    params: dict  # group -> elements this rank holds
    partial: int
    kept: float
    input: float
    grad_out: float
    ops: dict = field(default_factory=dict)  # "F", "B", "W", "F0" -> items of the modules' declarations
    transient: tuple = (0, 0)  # buffers held only while its forward, its backward, runs (ring attention's K/V)
    loss: float = 0.0  # what the loss after it keeps from the forward to the backward (the logits' gradient)
    for_w: float = 0.0  # what a split backward's B adds for its W, held until then (output gradients; rebuilt cache)
    # seconds of its passes, by the groups that time them (a cache: two layers alike compare equal)
    times: dict = field(default_factory=dict, repr=False, compare=False)


def _ops(work, extra_f=(), extra_b=()):
    return {"F": work.forward + extra_f, "B": extra_b + work.backward_input, "W": work.backward_weight,
            "F0": work.recompute}


def _embedding(m, s, ctx, a, comp):
    d, rows, rows_sp = m.d_model, s.rows, s.rows_sp
    learned = m.positions == "learned"
    params = m.vocab // s.tp * d + (m.max_seq * d if learned else 0)
    partial = m.max_seq * d if (learned and s.sequence_parallel) else 0
    kept = rows * INT + rows + rows_sp * INT  # ids, which ids are mine, positions
    return Layer("embed", {"dense": params}, partial, kept, rows * INT, rows_sp * d * a,
                 _ops(embedding_work(s, ctx, learned)))


def _head(m, s, ctx, a, comp):
    d, v = m.d_model, m.vocab // s.tp
    loss = loss_work(s, ctx)
    work = head_work(s, ctx)
    kept = s.rows_sp * d * a + (s.rows if s.keep_gathered else s.rows_sp) * d * comp  # its input, the norm's output
    ops = _ops(work, loss.forward, loss.backward_input)
    ops["F0"] = work.recompute  # the stage runs the head again, not the loss
    return Layer("head", {"dense": 2 * d + d * v}, 2 * d if s.sequence_parallel else 0, kept, s.rows_sp * d * a,
                 s.rows * v * comp, ops, loss=s.rows * v * dtype_bytes(ctx.dtype("loss")),
                 for_w=2 * d * comp)  # the final norm's gradients (the logits' gradient is the output gradient)


def _core_kept(m, s, dims, ctx, a, comp):
    """Bytes the attention core keeps, as :mod:`emulator.parallel.attention_cores` caches them."""
    h, kv, dh, b, n = s.h, s.kv, s.head_dim, s.b, s.n
    if dims.cp == 1:
        kept = a * b * dh * n * (h + 2 * kv)  # Q, K (its heads) and V
        if ctx.stack.attention == "flash":
            return kept + 4 * b * h * n  # the softmax's statistics
        return kept + (a * b * h * n * n if dims.recompute == "none" else 0)
    if dims.cp_attention == "ring":
        return comp * b * n * dh * (2 * h + 2 * kv) + comp * b * h * n  # q, k, v (K/V heads), out; lse
    c, S = dims.cp, n * dims.cp  # Ulysses: every position of h / cp heads, and their scores
    hc = h // c
    return comp * b * hc * S * dh * 3 + comp * b * hc * S * S


def _block(m, s, dims, ctx, a, comp):
    d, rows, h, kv, dh = m.d_model, s.rows, s.h, s.kv, s.head_dim
    qkv = (h + 2 * kv) * dh
    attn_params = d * qkv + qkv + h * dh * d + d
    inputs = s.rows if s.keep_gathered else s.rows_sp  # what the column-parallel layers keep of their input
    attn_kept = a * (inputs * d + rows * h * dh) + _core_kept(m, s, dims, ctx, a, comp)
    held = s.rows_sp * d  # one (b, n_sp, d) tensor between the layers
    f, w = s.ff, s.widen
    if m.n_experts:
        T, E = rows, m.n_experts
        local = E // dims.ep
        R = T * m.top_k
        mlp_params = {"dense": d * E, "experts": local * ((w + 1) * d * f + (f + d if m.mlp == "gelu" else 0))}
        mlp_partial = 0
        # route: x, p (T x E), ids, chosen p, weights; order, tokens; outputs back home; the rows and hidden
        # units each local expert computed; where rows go, expert boundaries and counts
        mlp_kept = comp * (T * d + T * E + 2 * T * m.top_k + 2 * R * d + w * R * f) + \
            INT * (3 * T * m.top_k + R + 2 * local + 1)
    else:
        mlp_params = {"dense": (w + 1) * d * f + (f + d if m.mlp == "gelu" else 0)}
        mlp_partial = d if (s.sequence_parallel and m.mlp == "gelu") else 0
        mlp_kept = a * (inputs * d + (w + 1) * rows * f)  # its input; GELU input or gate and up; fc2's input
    params = dict(mlp_params)
    params["dense"] = params.get("dense", 0) + 4 * d + attn_params
    partial = (4 * d + d + mlp_partial) if s.sequence_parallel else 0  # norms, o's bias (and fc2's): a slice
    kept = a * 2 * held + attn_kept + mlp_kept  # the two norms' inputs
    # what B leaves for W (each part's output gradient, all-gathered under SP, and its local rows; the
    # gradients of q, k, v and of the MLP's widening outputs; an MoE's expert gradients, computed in B),
    # kept in the activations' dtype, and the norms' gradients
    gathered_grad = rows * d if s.sequence_parallel else 0
    for_w = a * (gathered_grad + held + rows * qkv) + comp * 4 * d
    if m.n_experts:
        for_w += comp * (w * R * f + mlp_params["experts"] + mlp_params["dense"])
    else:
        for_w += a * (gathered_grad + w * rows * f)
    work = declared_block(s, ctx, _busiest_cp_rank(dims))
    if dims.recompute == "full":  # B builds the whole cache again, and W reads it: held until W
        for_w += kept - a * held
        kept = a * held
    elif dims.recompute == "op":  # torchtitan's per-op checkpoint: its input and the kept ops' outputs
        ops_kept = split_forward(work.forward)[0]
        for_w += kept - a * held - cached_bytes(ops_kept, a, m.positions == "rope")  # the rest, rebuilt in B
        kept = a * held + saved_bytes(ops_kept, a)
    ring = [x for x in work.forward if isinstance(x, RingAttention)]
    transient = (2 * ring[0].kv_bytes, 4 * ring[0].kv_bytes) if ring else (0, 0)  # K/V and the arriving block
    return Layer("block", params, partial, kept, a * held, a * held, _ops(work), transient=transient, for_w=for_w)


def _busiest_cp_rank(dims):
    """The context-parallel rank whose ring steps set the pace: the last one computes a block
    at every step of a contiguous causal ring (zigzag balances every rank)."""
    return dims.cp - 1 if dims.cp > 1 else 0


def rank_layers(model, dims, b, seq_len, ctx, names):
    """The :class:`Layer` of each of ``names`` (``embed``, ``blocks.i``, ``head``) on one
    rank for a micro-batch of ``b`` sequences of ``seq_len``, as ``ctx`` runs them."""
    kinds = _kinds(model, dims.tp, dims.cp, dims.ep, dims.sequence_parallel, dims.recompute, dims.cp_attention,
                   dims.cp_layout, b, seq_len, ctx)
    return [kinds[n if n in ("embed", "head") else "block"] for n in names]


@lru_cache(maxsize=1024)
def _kinds(model, tp, cp, ep, sp, recompute, cp_attention, cp_layout, b, seq_len, ctx):
    dims = ParallelDims(tp=tp, cp=cp, dp=ep, ep=ep, sequence_parallel=sp, recompute=recompute,
                        cp_attention=cp_attention, cp_layout=cp_layout)
    s = of_plan(model, dims, b, seq_len, ctx.stack.keep_gathered_input)
    a, comp = dtype_bytes(ctx.dtype("activations")), _computed_bytes(ctx)
    out = {"embed": _embedding(model, s, ctx, a, comp), "block": _block(model, s, dims, ctx, a, comp),
           "head": _head(model, s, ctx, a, comp)}
    if recompute == "full":  # the stage runs the embedding and the head again too: W reads their caches
        for k in ("embed", "head"):
            x = out[k]
            out[k] = replace(x, for_w=x.for_w + x.kept - x.input)
    return out


def _computed_bytes(ctx):
    """Bytes of a value the emulator computes and caches as computed (fp32 for a 16-bit
    model, whose arrays compute in fp32; else the arrays')."""
    return max(4, dtype_bytes(ctx.dtype("params")))


@lru_cache(maxsize=1024)
def split_names(n_layers, stages):
    """The layer names of each virtual stage, as :func:`emulator.parallel.pipeline.split_layers` cuts them."""
    class _Names:
        layers = [("embed", None)] + [(f"blocks.{i}", None) for i in range(n_layers)] + [("head", None)]

    return split_layers(_Names, stages)


def ops_flops(ops):
    """FLOPs the kernels of ``ops`` compute (ring attention's steps included)."""
    return flops_of(ops)


def inventory(model, dims, batch, seq_len, rank, param_bytes=None, precision=None, stack=None):
    """Pipeline rank ``rank``'s layers (every chunk) as plain numbers, for a global batch of
    ``batch`` sequences: ``[{"name", "params": {"dense"/"experts": elements}, "kept": bytes
    one micro-batch's forward keeps}]`` (the output layer's with the loss's, which its
    backward frees)."""
    ctx = plan_context(stack, precision, param_bytes)
    model = model.with_seq(seq_len)
    b = batch // (dims.dp * dims.micro_batches)
    names = split_names(model.n_layers, dims.pp * dims.v)
    mine = [n for c in range(dims.v) for n in names[stage_of(dims.pp, rank, c)]]
    return [{"name": n, "params": dict(x.params), "kept": (x.input if dims.recompute == "full" else x.kept) + x.loss}
            for n, x in zip(mine, rank_layers(model, dims, b, seq_len, ctx, mine))]


__all__ = ["Layer", "rank_layers", "split_names", "ops_flops", "inventory", "causal_share"]
