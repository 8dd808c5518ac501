"""One rank's layers as the planner sees them: what each holds and what each does.

For a plan (a :class:`~emulator.parallel.ParallelDims`) and a micro-batch of ``b``
sequences, :func:`rank_layers` describes every layer one rank of a pipeline stage runs, in
the terms the emulator's modules use (:mod:`emulator.parallel.mesh_model`,
:mod:`emulator.parallel.tp_block`, :mod:`emulator.parallel.expert_parallel`):

* ``params``: this rank's parameter elements, by the group their gradients reduce over
  (``dense``: ``dp x cp``; ``experts``: ``edp``), after tensor and expert parallelism;
  ``partial``: elements whose gradients are partial sums over ``tp`` (sequence parallelism);
* ``kept``: bytes its forward keeps for backward per micro-batch (``input``: its input
  only, what full recomputation keeps), ``grad_out``: the output gradient a split
  backward keeps from ``B`` to ``W``;
* ``ops``: per pass (``F``, ``B`` the input gradient, ``W`` the weight gradients) the
  kernels and the blocking collectives, in the order the modules issue them.

An op is ``("k", Kernel)`` (timed by the device), ``("flops", n)`` (at the device's peak,
as ``comm.compute(flops=...)``), ``("c", op, nbytes, group)`` (a collective the rank waits
for; ``nbytes`` as nccl-tests counts them), ``("a2a", bytes per peer, group)``, or
``("ring", forward?, [(kernels, kv bytes) per step], group)`` (ring attention over ``cp``).

The emulator runs in fp32 what a bf16 model computes (parameters upcast; activations kept
and handed between layers in bf16), so collectives of computed values are 4 bytes per
element and those of kept or received ones 2: the sizes below follow that.
"""

from dataclasses import dataclass, field
from functools import lru_cache

from ..machine.kernels import attention, gemm, memory_bound

INT = 8  # int64 token ids and indices


@dataclass
class Layer:
    name: str
    params: dict  # group -> elements this rank holds
    partial: int
    kept: float
    input: float
    grad_out: float
    ops: dict = field(default_factory=dict)  # "F", "B", "W" -> [op]
    transient: tuple = (0, 0)  # buffers held only while its forward, its backward, runs (ring attention's K/V)
    times: dict = field(default_factory=dict, repr=False)  # seconds of its passes, by the groups that time them


@dataclass(frozen=True)
class Shape:
    """A micro-batch on one rank: ``b`` sequences, ``n`` positions (this cp rank's), ``n_sp``
    of them held between layers (``n / tp`` under sequence parallelism); element bytes of
    parameters, kept activations and computed values."""

    b: int
    n: int
    n_sp: int
    tp: int
    cp: int
    ep: int
    sp: bool
    param: int
    act: int
    comp: int


def shape_of(dims, b, seq_len, param_bytes):
    n = seq_len // dims.cp
    sp = dims.sequence_parallel and dims.tp > 1
    comp = max(4, param_bytes)
    return Shape(b, n, n // dims.tp if dims.sequence_parallel else n, dims.tp, dims.cp, dims.ep,
                 dims.sequence_parallel, param_bytes, param_bytes, comp)


# ----------------------------------------------------------------- tensor-parallel regions
def _gather(s, nbytes_each):
    """Before a column-parallel layer: an all-gather along the sequence under SP."""
    return [("c", "all_gather", s.b * s.n * nbytes_each, "tp")] if s.sp else []


def _reduce(s, nbytes_each):
    """After a row-parallel layer: reduce-scatter (SP) or all-reduce (plain TP)."""
    if s.tp == 1:
        return []
    return [("c", "reduce_scatter" if s.sp else "all_reduce", s.b * s.n * nbytes_each, "tp")]


def _embedding(m, s):
    d, rows = m.d_model, s.b * s.n
    params = m.vocab // s.tp * d + (m.max_seq * d if m.positions == "learned" else 0)
    partial = m.max_seq * d if (m.positions == "learned" and s.sp) else 0
    kept = rows * INT + rows + s.n_sp * INT  # ids, which ids are mine, positions
    F = [("k", memory_bound(2 * rows * d * s.comp))] + _reduce(s, d * s.comp)
    W = _gather(s, d * s.act)  # the output gradient gathered back along the sequence
    return Layer("embed", {"dense": params}, partial, kept, rows * INT, s.b * s.n_sp * d * s.act,
                 {"F": F, "B": [], "W": W})


def _head(m, s):
    d, rows, v = m.d_model, s.b * s.n, m.vocab // s.tp
    F0 = [("k", memory_bound(2 * s.b * s.n_sp * d * s.act))] + _gather(s, d * s.comp) + [("k", gemm(rows, v, d))]
    F = F0 + ([("c", "all_reduce", rows * s.comp, "tp")] * 3 if s.tp > 1 else [])  # the vocab-parallel loss
    B = [("k", gemm(rows, d, v, count=2))] + _reduce(s, d * s.comp)
    W = _gather(s, d * s.comp)  # the norm's output gathered again for the weight gradient
    kept = s.b * s.n_sp * d * (s.act + s.comp)  # its input, and the norm's output
    return Layer("head", {"dense": 2 * d + d * v}, 2 * d if s.sp else 0, kept, s.b * s.n_sp * d * s.act,
                 rows * v * s.comp, {"F": F, "F0": F0, "B": B, "W": W})


def _attention_core(m, s, dims):
    """(kept bytes, forward ops, backward ops) of this rank's heads' core."""
    h, kv, dh = m.n_heads // s.tp, m.n_kv_heads // s.tp, m.head_dim
    b, n = s.b, s.n
    if dims.cp == 1:
        frac = (n + 1) / (2 * n)
        kept = s.act * b * dh * n * (h + 2 * kv) + (s.act * b * h * n * n if dims.recompute == "none" else 0)
        return kept, [("k", attention(b, h, n, n, dh, 2, frac))], \
            [("k", attention(b, h, n, n, dh, 5 if dims.recompute == "selective" else 4, frac))]
    if dims.cp_attention == "ring":
        kept = s.comp * b * n * dh * (2 * h + 2 * kv) + s.comp * b * h * n  # q, k, v (K/V heads), out; lse
        kv_bytes = 2 * b * kv * n * dh * s.comp  # K and V travel with their own heads
        fwd, bwd = (_ring_steps(b * h, dh, dims.cp, dims.cp_layout, n, kv_bytes, passes) for passes in (2, 5))
        return kept, [("ring", True, fwd, "cp")], [("ring", False, bwd, "cp")]
    c, S = dims.cp, n * dims.cp  # Ulysses: every position, h / cp heads
    hc = h // c
    piece = b * hc * n * dh * s.comp  # one peer's share of one tensor
    kept = s.comp * b * hc * S * dh * 3 + s.comp * b * hc * S * S
    frac = (S + 1) / (2 * S)
    fwd = [("a2a", piece, "cp")] * 3 + [("k", attention(b, hc, S, S, dh, 2, frac))] + [("a2a", piece, "cp")]
    bwd = [("a2a", piece, "cp")] + [("k", attention(b, hc, S, S, dh, 4, frac))] + [("a2a", piece, "cp")] * 3
    return kept, fwd, bwd


@lru_cache(maxsize=1024)
def _ring_steps(bh, dh, c, layout, n, kv_bytes, passes):
    """Each ring step's attention kernels (``bh`` = batch x heads) and the K/V bytes it passes on."""
    return tuple((tuple(attention(bh, 1, q, k, dh, passes) for q, k in step), kv_bytes)
                 for step in _ring_blocks(c, layout, n))


def _ring_blocks(c, layout, n):
    """Per ring step, the (query rows, key rows) blocks the busiest rank computes (the ring
    moves at its pace), every block of
    :func:`emulator.parallel.context_parallel.ring.blocks` whose keys start before its
    queries end, computed whole. Zigzag (chunks i and 2c-1-i of n/2): three half-blocks at
    step 0 (its own keys), two at every other step, on every rank. Contiguous: one n x n
    block at every step on the ranks whose source comes earlier, and the last rank's
    always does."""
    if layout == "contiguous":
        return (((n, n),),) * c
    half = n // 2
    return (((half, half),) * 3,) + (((half, half),) * 2,) * (c - 1)


def _dense_mlp(m, s):
    d, rows, f, w = m.d_model, s.b * s.n, m.d_ff // s.tp, m.widen
    params = (w + 1) * d * f + (f + d if m.mlp == "gelu" else 0)
    kept = s.act * (s.b * s.n_sp * d + (w + 1) * rows * f)  # its input; GELU input or gate and up; fc2's input
    F = _gather(s, d * s.comp) + [("k", gemm(rows, f, d, count=w)), ("k", memory_bound(3 * rows * f * s.comp)),
                                  ("k", gemm(rows, d, f))] + _reduce(s, d * s.comp)
    B = _gather(s, d * s.act) + [("k", gemm(rows, f, d)), ("k", gemm(rows, d, f, count=w))] + _reduce(s, d * s.comp)
    W = _gather(s, d * s.act) + [("k", gemm(f, d, rows, count=1 + w))]
    return {"dense": params}, (d if (s.sp and m.mlp == "gelu") else 0), kept, F, B, W


def _moe_mlp(m, s):
    """ParallelMoE with balanced routing (each expert gets its share), dropless."""
    d, T, f, w, E = m.d_model, s.b * s.n, m.d_ff // s.tp, m.widen, m.n_experts
    local = E // s.ep
    R = T * m.top_k  # rows this rank sends, and receives when the router is balanced
    per = R // local if local else 0
    experts = local * ((w + 1) * d * f + (f + d if m.mlp == "gelu" else 0))
    # route: x, p (T x E), ids, chosen p, weights; order, tokens; outputs back home; the rows and
    # hidden units each local expert computed; where rows go, expert boundaries and counts
    kept = s.comp * (T * d + T * E + 2 * T * m.top_k + 2 * R * d + w * R * f) + \
        INT * (3 * T * m.top_k + R + 2 * local + 1)
    piece = R // s.ep  # rows per peer
    route = ("k", gemm(T, E, d))
    experts_f = ("ke", (gemm(per, f, d, count=w + 1),) * local)
    F = _gather(s, d * s.comp) + [route, ("a2a", E // s.ep * INT, "ep"), ("a2a", piece * d * s.comp, "ep"), experts_f,
                                  ("a2a", piece * d * s.comp, "ep")] + _reduce(s, d * s.comp)
    B = _gather(s, d * s.act) + ([("c", "all_reduce", R * s.act, "tp")] if s.tp > 1 else []) + \
        [("a2a", piece * d * s.comp, "ep"), ("ke", (gemm(per, f, d, count=2 * (w + 1)),) * local),
         ("a2a", piece * d * s.act, "ep"), ("k", gemm(T, E, d, count=2))] + _reduce(s, d * s.comp)
    return {"dense": d * E, "experts": experts}, 0, kept, F, B, []


def _block(m, s, dims):
    d, rows = m.d_model, s.b * s.n
    h, kv, dh = m.n_heads // s.tp, m.n_kv_heads // s.tp, m.head_dim
    qkv = (h + 2 * kv) * dh
    attn_params = d * qkv + qkv + h * dh * d + d
    core_kept, core_f, core_b = _attention_core(m, s, dims)
    attn_kept = s.act * (s.b * s.n_sp * d + rows * h * dh) + core_kept  # its input, o's input; the core's
    held = s.b * s.n_sp * d  # one (b, n_sp, d) tensor between the layers
    attn_F = _gather(s, d * s.comp) + [("k", gemm(rows, qkv, d))] + core_f + [("k", gemm(rows, d, h * dh))] + \
        _reduce(s, d * s.comp)
    attn_B = _gather(s, d * s.comp) + [("k", gemm(rows, h * dh, d))] + core_b + [("k", gemm(rows, d, qkv))] + \
        _reduce(s, d * s.comp)
    attn_W = _gather(s, d * s.comp) + [("k", gemm(d, h * dh, rows)), ("k", gemm(d, qkv, rows))]
    mlp_params, mlp_partial, mlp_kept, mlp_F, mlp_B, mlp_W = _moe_mlp(m, s) if m.n_experts else _dense_mlp(m, s)
    F = [("k", memory_bound(2 * held * s.act))] + attn_F + [("k", memory_bound(2 * held * s.comp))] + mlp_F
    params = dict(mlp_params)
    params["dense"] = params.get("dense", 0) + 4 * d + attn_params
    partial = (4 * d + d + mlp_partial) if s.sp else 0  # norms, o's bias (and fc2's) see a slice of the sequence
    kept = s.act * 2 * held + attn_kept + mlp_kept  # the two norms' inputs
    if dims.recompute == "full":
        kept = s.act * held
    ring = [op[2][0][1] for op in core_f if op[0] == "ring"] if dims.cp > 1 else []
    transient = (2 * ring[0], 4 * ring[0]) if ring else (0, 0)  # K/V and the arriving block; and dK/dV's two
    return Layer("block", params, partial, kept, s.act * held, s.act * held,
                 {"F": F, "B": mlp_B + attn_B, "W": mlp_W + attn_W}, transient=transient)


def rank_layers(model, dims, b, seq_len, param_bytes, names):
    """The :class:`Layer` of each of ``names`` (``embed``, ``blocks.i``, ``head``) on one
    rank for a micro-batch of ``b`` sequences of ``seq_len``."""
    kinds = _kinds(model, dims.tp, dims.cp, dims.ep, dims.sequence_parallel, dims.recompute, dims.cp_attention,
                   dims.cp_layout, b, seq_len, param_bytes)
    return [kinds[n if n in ("embed", "head") else "block"] for n in names]


@lru_cache(maxsize=1024)
def _kinds(model, tp, cp, ep, sp, recompute, cp_attention, cp_layout, b, seq_len, param_bytes):
    from ..parallel.dims import ParallelDims

    dims = ParallelDims(tp=tp, cp=cp, dp=ep, ep=ep, sequence_parallel=sp, recompute=recompute,
                        cp_attention=cp_attention, cp_layout=cp_layout)
    s = shape_of(dims, b, seq_len, param_bytes)
    return {"embed": _embedding(model, s), "block": _block(model, s, dims), "head": _head(model, s)}


@lru_cache(maxsize=1024)
def split_names(n_layers, stages):
    """The layer names of each virtual stage, as :func:`emulator.parallel.pipeline.split_layers` cuts them."""
    from ..parallel.pipeline.stage import split_layers

    class _Names:
        layers = [("embed", None)] + [(f"blocks.{i}", None) for i in range(n_layers)] + [("head", None)]

    return split_layers(_Names, stages)


def ops_flops(ops):
    """FLOPs the kernels of ``ops`` compute (ring attention's steps included)."""
    total = 0.0
    for op in ops:
        if op[0] == "k":
            total += op[1].flops
        elif op[0] == "ke":
            total += sum(k.flops for k in op[1])
        elif op[0] == "flops":
            total += op[1]
        elif op[0] == "ring":
            total += sum(k.flops for kernels, _ in op[2] for k in kernels)
    return total


def inventory(model, dims, batch, seq_len, rank, param_bytes=2):
    """Pipeline rank ``rank``'s layers (every chunk) as plain numbers, for a global batch of
    ``batch`` sequences: ``[{"name", "params": {"dense"/"experts": elements}, "kept": bytes
    one micro-batch's forward keeps}]``."""
    from ..parallel.pipeline.actions import stage_of

    model = model.with_seq(seq_len)
    b = batch // (dims.dp * dims.micro_batches)
    names = split_names(model.n_layers, dims.pp * dims.v)
    mine = [n for c in range(dims.v) for n in names[stage_of(dims.pp, rank, c)]]
    return [{"name": n, "params": dict(x.params), "kept": x.input if dims.recompute == "full" else x.kept}
            for n, x in zip(mine, rank_layers(model, dims, b, seq_len, param_bytes, mine))]
