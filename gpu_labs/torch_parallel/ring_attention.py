"""Ring attention on ``torch.distributed`` point to point, forward and backward: the
algorithm of ``emulator.parallel.context_parallel.ring``, call for call.

``ring_attention(q, k, v, causal, layout, group, rec)`` takes this rank's shards (b, h,
s/c, d) of a sequence split with ``emulator.parallel.context_parallel.split_sequence``
and returns its rows of softmax attention; autograd runs the ring backward (dQ stays,
dK/dV travel with their block and come home). K and V travel as one stacked tensor; each
step posts the next block's send and receive with ``batch_isend_irecv`` before computing
on the current one. Which blocks to compute and their causal masks come from the
emulator (``ring.blocks``), so both skip the same blocks.
"""

import math

import torch

from emulator.parallel.context_parallel.ring import blocks


def _shift(x, rank, size, group, rec):
    right, left = (rank + 1) % size, (rank - 1) % size
    buf = torch.empty_like(x)
    return rec.batch_isend_irecv([("send", x.contiguous(), _global(right, group)),
                                  ("recv", buf, _global(left, group))], group=group), buf


def _global(r, group):
    return r if group is None else torch.distributed.get_global_rank(group, r)


def _plan(rank, src, size, n, causal, layout, device):
    return [(rows, cols, None if mask is None else torch.as_tensor(mask, device=device))
            for rows, cols, mask in blocks(rank, src, size, n, causal, layout)]


def _fold(state, q, kv, plan, scale):
    """Fold the blocks ``plan`` of one K/V block into the running (max, sum, output)."""
    m, lsum, acc = state
    for rows, cols, mask in plan:
        s = (q[..., rows, :] @ kv[0][..., cols, :].transpose(-1, -2) * scale).to(acc.dtype)
        if mask is not None:
            s = s.masked_fill(~mask, -math.inf)
        m_new = torch.maximum(m[..., rows], s.amax(-1))
        safe = torch.where(torch.isfinite(m_new), m_new, torch.zeros_like(m_new))
        p = torch.exp(s - safe[..., None])
        alpha = torch.exp(m[..., rows] - safe)
        lsum[..., rows] = alpha * lsum[..., rows] + p.sum(-1)
        acc[..., rows, :] = alpha[..., None] * acc[..., rows, :] + p @ kv[1][..., cols, :].to(acc.dtype)
        m[..., rows] = m_new


def _state(q):
    acc_dtype = torch.promote_types(q.dtype, torch.float32)
    return (torch.full(q.shape[:-1], -math.inf, dtype=acc_dtype, device=q.device),
            torch.zeros(q.shape[:-1], dtype=acc_dtype, device=q.device),
            torch.zeros(q.shape, dtype=acc_dtype, device=q.device))


def compute_only(q, k, v, steps):
    """The ring's compute without its transfers: ``steps`` folds of the local K/V block
    (for timing how much of the transfer the compute hides)."""
    state, kv = _state(q), torch.stack([k, v])
    plan = [(slice(None), slice(None), None)]
    for _ in range(steps):
        _fold(state, q, kv, plan, 1.0 / math.sqrt(q.shape[-1]))
    return state[2] / state[1][..., None]


class RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, layout, group, rec):
        rank, size = torch.distributed.get_rank(group), torch.distributed.get_world_size(group)
        n, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
        state = _state(q)
        kv = torch.stack([k, v])
        for t in range(size):
            src = (rank - t) % size
            works, nxt = _shift(kv, rank, size, group, rec) if t < size - 1 else (None, None)
            _fold(state, q, kv, _plan(rank, src, size, n, causal, layout, q.device), scale)
            if works:
                for w in works:
                    w.wait()
                kv = nxt
        m, lsum, acc = state
        out = (acc / lsum[..., None]).to(q.dtype)
        lse = m + torch.log(lsum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.meta = (causal, layout, group, rec, rank, size)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        causal, layout, group, rec, rank, size = ctx.meta
        n, scale = q.shape[-2], 1.0 / math.sqrt(q.shape[-1])
        dout = dout.contiguous()
        delta = (dout * out).sum(-1)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v])
        dkv = torch.zeros_like(kv)
        for t in range(size):
            src = (rank - t) % size
            works, nxt = _shift(kv, rank, size, group, rec) if t < size - 1 else (None, None)
            for rows, cols, mask in _plan(rank, src, size, n, causal, layout, q.device):
                kb, vb, do = kv[0][..., cols, :], kv[1][..., cols, :], dout[..., rows, :]
                p = torch.exp(q[..., rows, :] @ kb.transpose(-1, -2) * scale - lse[..., rows, None].to(q.dtype))
                if mask is not None:
                    p = p.masked_fill(~mask, 0.0)
                ds = p * (do @ vb.transpose(-1, -2) - delta[..., rows, None])
                dq[..., rows, :] += scale * ds @ kb
                dkv[0][..., cols, :] += scale * ds.transpose(-1, -2) @ q[..., rows, :]
                dkv[1][..., cols, :] += p.transpose(-1, -2) @ do
            if size > 1:  # dK/dV go on with their block; after the last step, home
                back, dkv_next = _shift(dkv, rank, size, group, rec)
                for w in back:
                    w.wait()
                dkv = dkv_next
            if works:
                for w in works:
                    w.wait()
                kv = nxt
        return dq, dkv[0], dkv[1], None, None, None, None


def ring_attention(q, k, v, causal=False, layout="contiguous", group=None, rec=None):
    """This rank's rows of attention over the whole sequence (see the module docstring)."""
    return RingAttention.apply(q, k, v, causal, layout, group, rec)
