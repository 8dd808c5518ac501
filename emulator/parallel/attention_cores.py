"""The core of attention, o = softmax(q k^T / sqrt(dh) + mask) v, three ways a block can
run it, each with a forward and a backward (input gradients only: the core has no
weights). Shapes: q (b, heads, s, dh); k, v (b, kv_heads, s, dh) (grouped-query attention:
each K/V head serves ``heads / kv_heads`` query heads; see :func:`emulator.nn.attention.repeat_kv`).

* :class:`DenseCore`: this rank's heads over its whole sequence (tensor parallelism gives a
  rank whole heads; nothing to send). It can drop attention probabilities (the mask drawn
  by global position, so a rank's heads draw what one device draws) and, with
  ``recompute="selective"``, keep Q, K and V only and recompute the softmax in backward.
* :class:`RingCore`: context parallelism; the sequence is split over the ``cp`` group and
  K/V travel around the ring (:mod:`emulator.parallel.context_parallel.ring`).
* :class:`UlyssesCore`: context parallelism by all-to-all (DeepSpeed-Ulysses): "my
  positions, every head" becomes "every position, my heads", ordinary attention runs on
  ``heads / cp`` heads, a second all-to-all turns the output back (the swap of
  :mod:`emulator.parallel.context_parallel.ulysses`, as ``ulysses_attention`` runs it).

Each charges its compute on the rank's clock itself (between its messages), as a fused
attention kernel (:func:`emulator.machine.kernels.attention`).
"""

import math

import numpy as np

from ..arrays.shape_only import is_shape_only
from ..machine.work import AllToAll, Attention, Gemm, Memory, RingAttention, Work, dtype_bytes, np_dtype
from ..nn.attention import repeat_kv, sum_kv
from ..nn.attention_core import softmax
from ..nn.dropout import apply as drop, dropout_mask
from .context_parallel.ring import ring_attention, step_blocks, ring_attention_backward
from .context_parallel.ulysses import causal_allowed, to_head_shards, to_sequence_shards


def causal_fraction(s_q_positions, s_k_positions):
    """Share of (query, key) pairs a causal mask keeps."""
    return float(np.mean(np.asarray(s_k_positions)[None, :] <= np.asarray(s_q_positions)[:, None]))


def _scores(q, k):
    return q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])


def _softmax_backward(p, dp, scale):
    return p * (dp - (dp * p).sum(-1, keepdims=True)) * scale


class DenseCore:
    """Attention over the whole (local) sequence. ``keep`` casts what is cached (the
    block's activation dtype); ``heads`` is (this rank's first head, all heads) for the
    dropout mask's global position."""

    def __init__(self, comm, causal=True, dropout=0.0, seed=0, recompute="none", keep=None, heads=(0, None)):
        self.comm, self.causal, self.p, self.seed, self.recompute = comm, causal, dropout, seed, recompute
        self.keep = keep or (lambda a: a)
        self.first_head, self.n_heads = heads

    def _probs(self, q, k):
        b, h, s, _ = q.shape
        scores = _scores(q, repeat_kv(k, h // k.shape[1]))
        if self.causal and not is_shape_only(scores):  # (a shape-only mask changes nothing)
            scores = np.where(np.tri(s, dtype=bool), scores, -np.inf)
        p = softmax(scores)
        mask = None
        if self.p:
            heads = slice(self.first_head, self.first_head + h)
            mask = dropout_mask(self.seed * 7919 + 1, (b, self.n_heads or h, s, s),
                                (slice(None), heads, slice(None), slice(None)), self.p)
        return p, mask

    @property
    def fused(self):
        """Whether the stack runs attention as one fused kernel (FlashAttention): then the
        scores are never kept, only the softmax's statistics, and backward recomputes them."""
        return self.comm.stack.attention == "flash"

    def forward(self, q, k, v):
        p, mask = self._probs(q, k)
        pd = drop(p, mask, self.p)
        o = pd @ repeat_kv(v, q.shape[1] // v.shape[1])
        fused = self.fused
        if fused:
            self.comm.charge("attention: core")
        else:
            for what in ("attention: scores Q K^T", "attention: scale-mask-softmax", "attention: dropout",
                         "attention: probs @ V"):
                self.comm.charge(what, optional=what == "attention: dropout")
        if fused:  # FlashAttention keeps the log-sum-exp of each row of scores (fp32)
            return o, self.kept(q, k, v, np.zeros_like(p, shape=p.shape[:-1], dtype=np.float32))
        c = {"Q and K": {"Q": self.keep(q), "K": self.keep(k)}, "V": self.keep(v)}
        if self.recompute == "none":
            c["softmax output"] = self.keep(p)
            if self.p:
                c["softmax dropout mask"] = mask
                c["dropout output (times V)"] = self.keep(pd)
        return o, c

    def kept(self, q, k, v, statistics):
        """What a fused kernel's backward reads: Q, K, V and the softmax's statistics (per-op
        checkpointing rebuilds it from Q, K and V computed again and the statistics kept)."""
        return {"Q and K": {"Q": self.keep(q), "K": self.keep(k)}, "V": self.keep(v), "softmax statistics": statistics}

    def backward(self, c, do):
        w = do.dtype
        q, k, v = (a.astype(w, copy=False) for a in (c["Q and K"]["Q"], c["Q and K"]["K"], c["V"]))
        g = q.shape[1] // k.shape[1]
        if "softmax output" in c:
            p = c["softmax output"].astype(w, copy=False)
            mask = c.get("softmax dropout mask")
            pd = c["dropout output (times V)"].astype(w, copy=False) if self.p else p
        else:  # selective recomputation: the s^2 terms again, from Q and K
            p, mask = self._probs(q, k)
            pd = drop(p, mask, self.p)
        dv = sum_kv(pd.swapaxes(-1, -2) @ do, g)
        dp = drop(do @ repeat_kv(v, g).swapaxes(-1, -2), mask, self.p)
        ds = _softmax_backward(p, dp, 1.0 / math.sqrt(q.shape[-1]))
        if "softmax statistics" in c:
            self.comm.charge("attention: core backward")
        else:
            for what in ("attention: scores again", "attention: again", "attention: dV = P^T dO",
                         "attention: dP = dO V^T", "attention: dropout backward", "attention: softmax backward",
                         "attention: dQ = dS K", "attention: dK = dS^T Q"):
                self.comm.charge(what, optional=what in ("attention: scores again", "attention: again",
                                                         "attention: dropout backward"))
        return ds @ repeat_kv(k, g), sum_kv(ds.swapaxes(-1, -2) @ q, g), dv


class RingCore:
    """Ring attention over the ``cp`` group, this rank's shard of the sequence in
    ``layout`` (``"contiguous"`` or ``"zigzag"``)."""

    def __init__(self, cp, causal=True, layout="zigzag"):
        self.cp, self.causal, self.layout = cp, causal, layout

    def forward(self, q, k, v):
        payload = np_dtype(self.cp.work_context(q.dtype).dtype("cp")) if self.cp.precision else None
        o, cache = ring_attention(self.cp, q, k, v, self.causal, self.layout, payload=payload, declared=True)
        return o, {"ring": cache}

    def backward(self, c, do):
        return ring_attention_backward(self.cp, c["ring"], do, declared=True)


class UlyssesCore:
    """All-to-all over the ``cp`` group to "every position, my heads" and back."""

    def __init__(self, cp, causal=True, layout="zigzag"):
        self.cp, self.causal, self.layout = cp, causal, layout

    def _payload(self, t):
        """The dtype its messages travel in: the precision policy's ``cp`` (else as they are)."""
        return np_dtype(self.cp.work_context(t.dtype).dtype("cp")) if self.cp.precision else t.dtype

    def _to_heads(self, t):
        """(b, h, n, dh), my positions, every head -> (b, h/c, s, dh), every position (in
        rank order of the shards), my heads."""
        return to_head_shards(self.cp, t, send=self._payload(t))

    def _to_positions(self, t, n):
        """The inverse: (b, h/c, s, dh) -> (b, h, n, dh)."""
        return to_sequence_shards(self.cp, t, n, send=self._payload(t))

    def _allowed(self, n):
        return causal_allowed(self.cp.size, n, self.layout)

    def forward(self, q, k, v):
        n, g = q.shape[2], q.shape[1] // k.shape[1]
        qh, kh, vh = (self._to_heads(t) for t in (q, repeat_kv(k, g), repeat_kv(v, g)))
        scores = _scores(qh, kh)
        if self.causal:
            allowed, pos = self._allowed(n)
            scores = np.where(allowed, scores, -np.inf)
        p = softmax(scores)
        frac = causal_fraction(pos, pos) if self.causal else 1.0
        self.cp.charge("attention: core")
        o = self._to_positions(p @ vh, n)
        return o, {"q": qh, "k": kh, "v": vh, "p": p, "n": n, "group": g, "fraction": frac}

    def backward(self, c, do):
        qh, kh, vh, p = c["q"], c["k"], c["v"], c["p"]
        doh = self._to_heads(do)
        dv = p.swapaxes(-1, -2) @ doh
        ds = _softmax_backward(p, doh @ vh.swapaxes(-1, -2), 1.0 / math.sqrt(qh.shape[-1]))
        self.cp.charge("attention: core backward")
        n, g = c["n"], c["group"]
        dq, dk, dv = (self._to_positions(t, n) for t in (ds @ kh, ds.swapaxes(-1, -2) @ qh, dv))
        return dq, sum_kv(dk, g), sum_kv(dv, g)


# ----------------------------------------------------------------- the declaration of its work
def causal_share(n):
    """Share of an n x n causal mask a fused kernel computes (the diagonal's half blocks included)."""
    return (n + 1) / (2 * n)


def _unfused(s, ctx, b, h, n, dh):
    """Attention as Megatron ran it before FlashAttention: Q K^T as a batched GEMM whose
    scores go to HBM, the fused scale-mask-softmax (or the ops apart), dropout, then P V;
    backward the four products, the dropout's and the softmax's backward; selective
    recomputation first recomputes the scores and the softmax."""
    c = ctx.dtype("compute")
    cb, scores = dtype_bytes(c), b * h * n * n
    mask = scores if s.dropout else 0
    if ctx.stack.has("softmax"):
        soft = (Memory("attention: scale-mask-softmax", "softmax", scores * cb, scores * cb),)
        soft_b = (Memory("attention: softmax backward", "softmax", 2 * scores * cb, scores * cb),)
    else:
        soft = (Memory("attention: scale-mask-softmax: scale", "softmax", scores * cb, scores * cb),
                Memory("attention: scale-mask-softmax: mask", "softmax", scores * cb, scores * cb),
                Memory("attention: scale-mask-softmax: softmax", "softmax", 2 * scores * cb, scores * cb))
        soft_b = (Memory("attention: softmax backward", "softmax", 2 * scores * cb, scores * cb),
                  Memory("attention: softmax backward: scale", "softmax", scores * cb, scores * cb))
    drop = (Memory("attention: dropout", "dropout", scores * cb, scores * cb + mask),) if s.dropout else ()
    drop_b = (Memory("attention: dropout backward", "dropout", scores * cb + mask, scores * cb),) if s.dropout else ()
    qk = Gemm("attention: scores Q K^T", n, n, dh, c, count=b * h)
    F = (qk,) + soft + drop + (Gemm("attention: probs @ V", n, dh, n, c, count=b * h),)
    again = ((Gemm("attention: scores again", n, n, dh, c, count=b * h),) + tuple(
        Memory(x.name.replace("attention:", "attention: again:"), x.op, x.read, x.written) for x in soft + drop)) \
        if s.recompute == "selective" else ()
    B = again + (Gemm("attention: dV = P^T dO", n, dh, n, c, count=b * h),
                 Gemm("attention: dP = dO V^T", n, n, dh, c, count=b * h)) + drop_b + soft_b + \
        (Gemm("attention: dQ = dS K", n, dh, n, c, count=b * h), Gemm("attention: dK = dS^T Q", n, dh, n, c, count=b * h))
    return F, B


def _ring(name, s, ctx, rank, forward):
    """Ring attention's declared work on ``rank``: each step's blocks (:func:`step_blocks`), K and
    V travelling with their own heads in the policy's ``cp`` dtype."""
    dt = ctx.dtype("cp")
    kv = 2 * s.b * s.kv * s.n * s.head_dim * dtype_bytes(dt)
    return RingAttention(name, "cp", s.cp, forward, step_blocks(rank, s.cp, s.n, s.causal, s.cp_layout), kv, dt,
                         s.b * s.h, s.head_dim, 2 if forward else 5, ctx.dtype("compute"), ctx.stack.flash_kernel)


def core_work(s, ctx, cp_rank=0):
    """The core's :class:`~emulator.machine.work.Work` on this rank (``cp_rank`` along cp):
    one fused kernel each way (``stack.attention == "flash"``; its backward recomputes the
    scores, five products), the unfused kernels of :func:`_unfused`, ring attention's steps,
    or Ulysses' all-to-alls around a fused kernel over every position of ``h / cp`` heads."""
    b, h, dh, n = s.b, s.h, s.head_dim, s.n
    c, fa = ctx.dtype("compute"), ctx.stack.flash_kernel
    if s.cp == 1:
        if ctx.stack.attention == "unfused":
            F, B = _unfused(s, ctx, b, h, n, dh)
            return Work("attention core", F, B, (), F)
        frac = causal_share(n) if s.causal else 1.0
        F = (Attention("attention: core", b, h, n, n, dh, 2, frac, c, fa),)
        return Work("attention core", F, (Attention("attention: core backward", b, h, n, n, dh, 5, frac, c, fa),), (), F)
    if s.cp_attention == "ring":
        F = (_ring("attention: ring", s, ctx, cp_rank, True),)
        B = (_ring("attention: ring backward", s, ctx, cp_rank, False),)
        return Work("ring attention", F, B, (), F)
    hc, S = h // s.cp, n * s.cp  # Ulysses: every position of h / cp heads
    dt = ctx.dtype("cp")
    piece = b * hc * n * dh * dtype_bytes(dt)  # one peer's share of one tensor
    a2a = [AllToAll(f"attention: all-to-all {what}", "cp", s.cp, piece, dt) for what in ("q", "k", "v", "out")]
    frac = causal_share(S) if s.causal else 1.0
    F = tuple(a2a[:3]) + (Attention("attention: core", b, hc, S, S, dh, 2, frac, c, fa), a2a[3])
    back = [AllToAll(f"attention: all-to-all d{what}", "cp", s.cp, piece, dt) for what in ("out", "q", "k", "v")]
    B = (back[0], Attention("attention: core backward", b, hc, S, S, dh, 4, frac, c, fa)) + tuple(back[1:])
    return Work("Ulysses attention", F, B, (), F)
