"""A pipeline executor on ``torch.distributed`` point to point: the loop of
``emulator.parallel.pipeline.run_actions``, call for call, for the course GPT.

* :class:`GPTStage` is a ``torch.nn.Module`` holding a run of the GPT's layers (names as in
  ``emulator.nn.GPT.layers``: ``embed``, ``blocks.i``, ``head``) with the emulator's
  parameters; ``torch.distributed.pipelining.PipelineStage`` can wrap it too.
* :class:`Executor` runs this rank's program (``emulator.parallel.pipeline.program`` of a
  schedule: steps of ``Action(kind, microbatch, chunk)`` with kinds F and B, each step
  followed by one ``batch_isend_irecv`` of its sends and of the receives of what arrives
  then) on this rank's chunks: before an action it waits for the works of the batch that
  brought its input (on NCCL one ``Work`` for the whole batch, on gloo one per operation:
  it waits for every work the call returned), computes, and waits for every batch at the
  end of the step. It records when each action ran on a :class:`Clock` (so the bubble can
  be measured, without stalling the host between actions), and every call through a
  ``trace.Recorder``.
"""

import time

import torch
import torch.nn.functional as F

from emulator.nn import torch_reference as R


def layer_of(key):
    """``"blocks.3.attn.q.w"`` -> ``"blocks.3"``; ``"embed.tok.w"`` -> ``"embed"``."""
    parts = key.split(".")
    return ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]


class GPTStage(torch.nn.Module):
    """The layers ``names`` of the course GPT, parameters from ``params`` (numpy)."""

    def __init__(self, params, names, n_heads, device, dtype):
        super().__init__()
        self.names, self.n_heads = list(names), n_heads
        self.weights = torch.nn.ParameterDict({
            k.replace(".", "__"): torch.nn.Parameter(torch.tensor(v, device=device, dtype=dtype))
            for k, v in params.items() if layer_of(k) in self.names})

    def p(self):
        return {k.replace("__", "."): v for k, v in self.weights.items()}

    def forward(self, x):
        p = self.p()
        for name in self.names:
            if name == "embed":
                x = p["embed.tok.w"][x] + p["embed.pos.w"][: x.shape[1]]
            elif name == "head":
                x = R.layer_norm(p, x, "head.ln.") @ p["head.proj.w"]
            else:
                x = R.block(p, x, name + ".", self.n_heads)
        return x

    def grads(self):
        """{"layer.key": gradient} for every weight of the stage, None where backward
        produced none (a check must see a missing gradient, not skip it)."""
        return {k.replace("__", "."): None if v.grad is None else v.grad.detach() for k, v in self.weights.items()}


def loss_fn(logits, targets):
    """Mean cross-entropy over the tokens of a micro-batch (``emulator.nn.cross_entropy``)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


class Executor:
    """Rank ``rank`` of a ``p``-rank pipeline holding ``chunks`` (chunk index -> GPTStage);
    ``boundary`` is the shape of a micro-batch's activations between stages."""

    def __init__(self, chunks, p, rank, rec, boundary, device, dtype):
        self.chunks, self.p, self.rank, self.rec = chunks, p, rank, rec
        self.boundary, self.device, self.dtype = boundary, device, dtype
        self.last = p * len(chunks) - 1
        self.events = []  # (kind, start, end) of each action, as Clock marks

    def _peer(self, a, towards):
        s = a.chunk * self.p + self.rank + towards
        return s % self.p if 0 <= s <= self.last else None

    def step(self, steps, micro_x, micro_y, clock=None):
        """Run this rank's program ``steps``; returns the losses of the micro-batches (last
        stage), as tensors: reading them would make the host wait for the device."""
        m = len(micro_x)
        arriving, works, saved, losses = {}, [], {}, {}
        clock = clock or Clock(self.device)
        for step in steps:
            out = {}
            for a in step.actions:
                s = a.chunk * self.p + self.rank
                buf = None
                if a in arriving:
                    buf, batch = arriving.pop(a)
                    _settle(batch)  # the batch that brought it
                start = clock.mark()
                if a.kind == "F":
                    inp = micro_x[a.microbatch] if s == 0 else buf.requires_grad_(True)
                    res = self.chunks[a.chunk](inp)
                    if s == self.last:
                        res = loss_fn(res, micro_y[a.microbatch])
                        losses[a.microbatch] = res.detach()
                        res = res / m
                    saved[(a.microbatch, a.chunk)] = (inp, res)
                    out[a] = res.detach() if s != self.last else None
                elif a.kind == "B":
                    inp, res = saved.pop((a.microbatch, a.chunk))
                    res.backward(None if s == self.last else buf)
                    out[a] = inp.grad if s > 0 else None
                else:
                    raise ValueError(f"this executor runs F and B actions (the backward whole), got {a}")
                self.events.append((a.kind, start, clock.mark()))
            bufs = {a: torch.empty(self.boundary, device=self.device, dtype=self.dtype) for a in step.receives}
            ops = [("send", out[a], self._peer(a, 1 if a.kind == "F" else -1)) for a in step.sends]
            ops += [("recv", bufs[a], self._peer(a, -1 if a.kind == "F" else 1)) for a in step.receives]
            if ops:
                batch = self.rec.batch_isend_irecv(ops)
                works.append(batch)
                arriving.update({a: (bufs[a], batch) for a in step.receives})
        for batch in works:
            _settle(batch)
        return losses


def _settle(batch):
    """Wait for every work of a batch, once: the list is emptied (waiting twice for a gloo
    receive blocks until its timeout)."""
    while batch:
        batch.pop(0).wait()


class Clock:
    """Timestamps of actions: wall time on a CPU; CUDA events on a GPU, read only by
    :meth:`resolve`, after the step (so timing never synchronises the GPU between
    actions). The zero is the moment the clock is made."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.zero = torch.cuda.Event(enable_timing=True)
            self.zero.record()
        else:
            self.zero = time.perf_counter()

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter() - self.zero

    def resolve(self, events):
        """``(kind, start, end)`` marks -> seconds since the zero."""
        if not self.cuda:
            return events
        torch.cuda.synchronize()
        return [(k, self.zero.elapsed_time(s) / 1e3, self.zero.elapsed_time(e) / 1e3) for k, s, e in events]
