"""An expert-parallel MoE layer on ``torch.distributed.all_to_all_single``: the algorithm of
``emulator.parallel.expert_parallel``, call for call (dropless).

Each rank holds the router and ``E / n`` experts (the emulator's ``shard_experts``) and
routes its tokens; an all-to-all of per-expert counts tells every rank what it will
receive; ``all_to_all_single`` with split sizes dispatches the rows to their experts and
brings the outputs back. Both all-to-alls are an autograd function whose backward is the
same all-to-all the other way, so autograd's backward makes exactly two more calls (output
gradients out to the experts, input gradients home), as the emulator's backward does.
"""

import torch
import torch.nn.functional as F


class AllToAll(torch.autograd.Function):
    """Rows of ``x`` split by ``send`` to every rank; returns the rows received (``recv``)."""

    @staticmethod
    def forward(ctx, x, send, recv, group, rec, clock):
        ctx.meta = (send, recv, group, rec, clock)
        out = x.new_empty((sum(recv),) + tuple(x.shape[1:]))
        with clock("all-to-all"):
            rec.all_to_all_single(out, x.contiguous(), recv, send, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send, recv, group, rec, clock = ctx.meta
        out = grad.new_empty((sum(send),) + tuple(grad.shape[1:]))
        with clock("all-to-all"):
            rec.all_to_all_single(out, grad.contiguous(), send, recv, group=group)
        return out, None, None, None, None, None


def _no_clock(name):
    import contextlib

    return contextlib.nullcontext()


def ep_moe(p, x, n_experts, top_k, rec, group=None, clock=_no_clock):
    """This rank's output for its tokens ``x`` (T, d); ``p`` holds the router and this rank's
    experts (tensors, stacked along dim 0). Differentiable end to end."""
    n = torch.distributed.get_world_size(group)
    local = n_experts // n
    probs = torch.softmax(x @ p["router.w"], -1)
    idx = torch.argsort(-probs.detach(), dim=1, stable=True)[:, :top_k]
    sel = probs.gather(1, idx)
    weights = (sel / sel.sum(1, keepdim=True)).reshape(-1)
    ids = idx.reshape(-1)
    tokens = torch.arange(x.shape[0], device=x.device).repeat_interleave(top_k)
    order = torch.argsort(ids, stable=True)
    counts = torch.bincount(ids, minlength=n_experts)
    incoming = torch.empty_like(counts)
    rec.all_to_all_single(incoming, counts, group=group)  # the count exchange
    incoming = incoming.reshape(n, local)
    send, recv = counts.reshape(n, local).sum(1).tolist(), incoming.sum(1).tolist()
    rows = AllToAll.apply(x[tokens[order]], send, recv, group, rec, clock)
    # regroup the arrived rows by local expert (sources in rank order), run each expert
    starts = torch.cat([incoming.new_zeros(1), incoming.reshape(-1).cumsum(0)])[:-1].reshape(n, local)
    out_rows = torch.zeros_like(rows)
    for j in range(local):
        sel_rows = torch.cat([torch.arange(int(starts[i, j]), int(starts[i, j] + incoming[i, j]), device=x.device)
                              for i in range(n)])
        if len(sel_rows):
            h = F.gelu(rows[sel_rows] @ p["experts.fc1.w"][j] + p["experts.fc1.b"][j], approximate="tanh")
            out_rows = out_rows.index_put((sel_rows,), h @ p["experts.fc2.w"][j] + p["experts.fc2.b"][j])
    back = AllToAll.apply(out_rows, recv, send, group, rec, clock)
    return torch.zeros_like(x).index_add(0, tokens[order], weights[order, None] * back)
