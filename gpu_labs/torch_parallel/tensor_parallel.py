"""Megatron tensor parallelism by hand in torch: the f/g operators as autograd functions,
and the transformer block of ``emulator.parallel.tensor_parallel.block`` (same parameters, same calls).

* ``_Column``: column-parallel layers sharing one input; their backward holds the f
  operator (all-reduce of the input gradient) or, under sequence parallelism, the
  all-gather of the input (kept as this rank's slice only, gathered again in backward)
  and the reduce-scatter of its gradient.
* ``_G`` (g): all-reduce forward, identity backward; ``_ScatterSP``: reduce-scatter along
  the sequence forward, all-gather backward.
* :class:`TPBlock`: pre-norm block with q/k/v and fc1 column-parallel (by heads and
  columns), o and fc2 row-parallel (biases added once, after the reduction), norms
  replicated (or split along the sequence with ``sequence_parallel``, their gradients
  then all-reduced by :meth:`TPBlock.sync_sequence_parallel_grads`).

Every collective goes through a ``trace.Recorder`` so a lab can compare its calls with the
emulator's.
"""

import math

import torch
import torch.nn.functional as F


class _G(torch.autograd.Function):
    """g: all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, y, rec, group):
        y = y.contiguous()
        rec.all_reduce(y, group=group)
        return y

    @staticmethod
    def backward(ctx, dy):
        return dy, None, None


def _all_gather_seq(x, rec, group, size):
    x = x.transpose(0, 1).contiguous()
    out = torch.empty((x.shape[0] * size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    rec.all_gather(out, x, group=group)
    return out.transpose(0, 1)


def _reduce_scatter_seq(y, rec, group, size):
    y = y.transpose(0, 1).contiguous()
    out = torch.empty((y.shape[0] // size,) + tuple(y.shape[1:]), dtype=y.dtype, device=y.device)
    rec.reduce_scatter(out, y, group=group)
    return out.transpose(0, 1)


class _ScatterSP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y, rec, group, size):
        ctx.args = (rec, group, size)
        return _reduce_scatter_seq(y, rec, group, size)

    @staticmethod
    def backward(ctx, dy):
        return _all_gather_seq(dy, *ctx.args), None, None, None


class _Column(torch.autograd.Function):
    """Column-parallel layers sharing one input ``x``: forward returns ``x W_i + b_i`` for
    each pair; with sequence parallelism ``x`` is this rank's slice of the sequence, which
    is all that is kept for backward: backward gathers it again for the weight gradients,
    as Megatron does, and reduce-scatters the input gradient. Without it the input
    gradient is all-reduced (the f operator's backward)."""

    @staticmethod
    def forward(ctx, x, rec, group, size, sp, *wb):
        ctx.meta = (rec, group, size, sp)
        ctx.save_for_backward(x, *wb)
        total = _all_gather_seq(x, rec, group, size) if sp else x
        return tuple(total @ wb[i] + wb[i + 1] for i in range(0, len(wb), 2))

    @staticmethod
    def backward(ctx, *douts):
        rec, group, size, sp = ctx.meta
        x, *wb = ctx.saved_tensors
        total = _all_gather_seq(x, rec, group, size) if sp else x
        grads, dx = [], 0
        for i, dy in enumerate(douts):
            w = wb[2 * i]
            grads += [total.reshape(-1, total.shape[-1]).T @ dy.reshape(-1, dy.shape[-1]), dy.sum((0, 1))]
            dx = dx + dy @ w.T
        if sp:
            dx = _reduce_scatter_seq(dx, rec, group, size)
        else:
            dx = dx.contiguous()
            rec.all_reduce(dx, group=group)
        return (dx, None, None, None, None, *grads)


class TPBlock(torch.nn.Module):
    """This rank's part of the block. ``shard`` holds this rank's parameters, keyed as
    ``emulator.nn.TransformerBlock`` (cut by ``TensorParallelBlock.shard``)."""

    PARTIAL_UNDER_SP = ("ln1.g", "ln1.b", "ln2.g", "ln2.b", "attn.o.b", "mlp.fc2.b")

    def __init__(self, shard, n_heads, rec, group, size, sequence_parallel=False):
        super().__init__()
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(v) for k, v in shard.items()})
        self.local_heads, self.rec, self.group, self.size, self.sp = n_heads // size, rec, group, size, sequence_parallel

    def w(self, key):
        return self.p[key.replace(".", "__")]

    def _columns(self, a, *names):
        wb = [self.w(f"{n}.{k}") for n in names for k in ("w", "b")]
        return _Column.apply(a, self.rec, self.group, self.size, self.sp, *wb)

    def _out(self, y):  # after a row-parallel layer: g's all-reduce, or a reduce-scatter under SP
        return _ScatterSP.apply(y, self.rec, self.group, self.size) if self.sp else _G.apply(y, self.rec, self.group)

    def forward(self, x):
        d = x.shape[-1]
        a = F.layer_norm(x, (d,), self.w("ln1.g"), self.w("ln1.b"), eps=1e-5)
        q, k, v = self._columns(a, "attn.q", "attn.k", "attn.v")
        b, s, _ = q.shape
        q, k, v = (t.reshape(b, s, self.local_heads, -1).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool, device=x.device).tril(), float("-inf"))
        heads = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(b, s, -1)
        h = x + self._out(heads @ self.w("attn.o.w")) + self.w("attn.o.b")
        (u,) = self._columns(F.layer_norm(h, (d,), self.w("ln2.g"), self.w("ln2.b"), eps=1e-5), "mlp.fc1")
        g = F.gelu(u, approximate="tanh")
        return h + self._out(g @ self.w("mlp.fc2.w")) + self.w("mlp.fc2.b")

    def sync_sequence_parallel_grads(self):
        """Under SP the norms and the row-parallel biases saw a slice of the sequence:
        all-reduce their gradients (one bucket)."""
        if not self.sp:
            return
        params = [self.w(k) for k in self.PARTIAL_UNDER_SP]
        flat = torch.cat([p.grad.reshape(-1) for p in params])
        self.rec.all_reduce(flat, group=self.group)
        offset = 0
        for p in params:
            p.grad.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
