"""The training step every parallel strategy plugs into, and the runs it is checked against.

``train(comm, model, strategy, batches)`` runs, for every global batch, this rank's slice
(by its rank in the strategy's data-parallel group), cut into ``micro_batches``; each
micro-batch goes forward layer by layer and backward in reverse, and the strategy's hooks
decide where parameters come from and where gradients go:

==========================================  =============================================
``strategy.params_for_forward(name, nxt)``  before a layer's forward: its parameters
                                            (``nxt``: the layer that runs next, to prefetch)
``strategy.after_forward(name)``            after it (ZeRO-3 frees the gathered copy)
``strategy.params_for_backward(name, nxt)`` before the layer's backward
``strategy.grads_ready(name, grads, last)``  its gradients; ``last``: the step's last
                                            micro-batch (DDP reduces only then)
``strategy.step()``                         after the whole batch: finish and update
==========================================  =============================================

A layer's activations (every array its forward cached for backward) are held in the
rank's ledger, kind ``activations``, from its forward to its backward. With
``recompute=True`` only each layer's input is kept, and backward runs the layer's forward
again first (activation recomputation: memory for compute). Compute is charged on the
simulated clock from each layer's FLOPs (``layer.flops``: its matrix multiplications,
attention's s^2 term included).

``train_single`` is the reference every parallel run must match: one device, the whole
global batch. ``synthetic_batches`` makes a task a small GPT learns in a few steps.
"""

from dataclasses import dataclass

import numpy as np
from ml_dtypes import bfloat16

from . import nn
from .errors import ConfigError
from .nn.module import sub


@dataclass
class TrainResult:
    """What one rank ends with: its local ``losses`` (one per step), the full ``params``
    where it holds them (else None), its ``shards`` {layer: flat slice} where sharded."""

    losses: list
    params: dict
    shards: dict


def upcast(params):
    """Mixed precision: bf16 parameters are used in fp32 (forward and backward run in
    fp32; only storage and communication are bf16)."""
    return {k: v.astype(np.float32) if v.dtype == bfloat16 else v for k, v in params.items()}


def local_batch(comm, x, y):
    """This rank's equal slice of a global batch (data parallelism)."""
    n, r = comm.size, comm.rank
    if len(x) % n:
        raise ConfigError(f"a global batch of {len(x)} examples does not split over {n} ranks; data "
                          f"parallelism needs a multiple of {n} (and at least {n})")
    b = len(x) // n
    return x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]


def _micro(x, y, m):
    if m < 1 or len(x) % m:
        raise ConfigError(f"micro_batches={m} must divide the local batch of {len(x)} examples")
    b = len(x) // m
    return [(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]) for i in range(m)]


def forward_backward(comm, model, strategy, x, y, dloss=1.0, last=True, recompute=False):
    """One micro-batch through every layer and back. Returns its loss."""
    mem = comm.memory
    names = [n for n, _ in model.layers]
    caches, inputs, flops, h = {}, {}, {}, x
    for i, (name, layer) in enumerate(model.layers):
        p = strategy.params_for_forward(name, names[i + 1] if i + 1 < len(names) else None)
        inputs[name] = h
        flops[name] = layer.flops(np.shape(h))
        h, caches[name] = layer.forward(upcast(p), h)
        comm.compute(flops=flops[name]["forward"], name=f"F {name}")
        strategy.after_forward(name)
        if recompute:
            caches[name] = None
            mem.hold(f"act:{name}", inputs[name], "activations")  # only the layer's input
        else:
            mem.hold(f"act:{name}", caches[name], "activations")  # every array in the cache
    loss, lcache = nn.cross_entropy(h, y)
    dy = nn.cross_entropy_backward(lcache, dloss)
    for i in reversed(range(len(names))):
        name, layer = model.layers[i]
        p = strategy.params_for_backward(name, names[i - 1] if i > 0 else None)
        up = upcast(p)
        if recompute:
            _, caches[name] = layer.forward(up, inputs[name])
            comm.compute(flops=flops[name]["forward"], name=f"F' {name}")
        dx = layer.backward_input(up, caches[name], dy)
        grads = layer.backward_weight(up, caches[name], dy)
        comm.compute(flops=flops[name]["backward_input"] + flops[name]["backward_weight"], name=f"B {name}")
        mem.release(f"act:{name}")
        del caches[name], inputs[name], flops[name]
        strategy.grads_ready(name, {k: g.astype(p[k].dtype) for k, g in grads.items()}, last)
        dy = dx
    return loss


def train(comm, model, strategy, batches, micro_batches=1, recompute=False):
    """Train with ``strategy`` (see :mod:`emulator.parallel`) on ``batches`` (global (x, y)
    pairs), on this rank. Returns a :class:`TrainResult`."""
    losses = []
    for x, y in batches:
        xl, yl = local_batch(strategy.comm, x, y)
        parts = _micro(xl, yl, micro_batches)
        step_losses = [forward_backward(comm, model, strategy, xm, ym, 1.0 / len(parts), i == len(parts) - 1,
                                        recompute) for i, (xm, ym) in enumerate(parts)]
        strategy.step()
        losses.append(float(np.mean(step_losses)))
    return TrainResult(losses, strategy.params(), strategy.shards())


def train_single(model, params, batches, opt):
    """The reference: one device, the whole global batch. Returns (params, losses)."""
    state = opt.init(params)
    losses = []
    for x, y in batches:
        logits, cache = model.forward(upcast(params), x)
        loss, lc = nn.cross_entropy(logits, y)
        _, grads = model.backward(upcast(params), cache, nn.cross_entropy_backward(lc))
        params, state = opt.step(params, {k: g.astype(params[k].dtype) for k, g in grads.items()}, state)
        losses.append(loss)
    return params, losses


def synthetic_batches(steps, batch, seq, vocab, seed=0):
    """Token sequences with a learnable rule (each next token = previous + 1 mod vocab,
    from a random start, with a little noise), as a list of global (x, y) batches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        start = rng.integers(0, vocab, (batch, 1))
        seqs = (start + np.arange(seq + 1)) % vocab
        noise = rng.random(seqs.shape) < 0.05
        seqs = np.where(noise, rng.integers(0, vocab, seqs.shape), seqs)
        out.append((seqs[:, :-1], seqs[:, 1:]))
    return out


def layer_params(params, model):
    """{layer name: its parameters} for ``model.layers``."""
    return {name: sub(params, name) for name, _ in model.layers}
