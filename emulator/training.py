"""The training step every data-parallel strategy plugs into, and the runs it is checked against.

``train(comm, model, strategy, batches)`` runs, for every global batch, this rank's slice
(by its rank in the strategy's data-parallel group), cut into ``micro_batches``. The step
is a one-stage pipeline (:class:`~emulator.parallel.pipeline.PipelineStage`, the same loop
every pipeline schedule runs on): each micro-batch goes forward layer by layer and
backward in reverse, and the strategy's hooks decide where parameters come from and where
gradients go:

==========================================  =============================================
``strategy.params_for_forward(name, nxt)``  before a layer's forward: its parameters
                                            (``nxt``: the layer that runs next, to prefetch)
``strategy.after_forward(name)``            after it (ZeRO-3 frees the gathered copy)
``strategy.params_for_backward(name, nxt)`` before the layer's backward
``strategy.grads_ready(name, grads, last)``  its gradients; ``last``: the step's last
                                            micro-batch (DDP reduces only then)
``strategy.step()``                         after the whole batch: reduce, then update
==========================================  =============================================

A layer's activations (every array its forward cached for backward) are held in the
rank's ledger, kind ``activations``, from its forward to its backward. With
``recompute=True`` only each layer's input is kept, and backward runs the layer's forward
again first (activation recomputation: memory for compute). Compute is charged on the
simulated clock from each layer's FLOPs (``layer.flops``: its matrix multiplications,
attention's s^2 term included).

``train_single`` is the reference every parallel run must match: one device, the whole
global batch (as ``micro_batches`` contiguous groups, whose gradients add up; each
group's loss, auxiliary losses included, scaled by ``1/micro_batches``), optionally
clipped to a global gradient norm as ``torch.nn.utils.clip_grad_norm_`` does.
``synthetic_batches`` makes a task a small GPT learns in a few steps.
"""

from dataclasses import dataclass

import numpy as np

from . import nn
from .nn.clip import clip_coefficient, global_norm
from .nn.module import sub
from .nn.precision import upcast  # noqa: F401 -- part of this module's interface
from .parallel.batches import local_batch, split_batch  # noqa: F401 -- part of this module's interface
from .parallel.pipeline import PipelineStage, program, schedule, train_step


@dataclass
class TrainResult:
    """What one rank ends with: its local ``losses`` (one per step), the full ``params``
    where it holds them (else None), its ``shards`` {layer: flat slice} where sharded."""

    losses: list
    params: dict
    shards: dict


def _layer_label(action, layer, what):
    return f"{what} {layer}"  # "F blocks.0", "B blocks.0", "F' blocks.0" (recomputed)


def train(comm, model, strategy, batches, micro_batches=1, recompute=False):
    """Train with ``strategy`` (see :mod:`emulator.parallel`) on ``batches`` (global (x, y)
    pairs), on this rank. Returns a :class:`TrainResult`."""
    solo = comm.new_group([comm.global_rank])  # a pipeline of one stage: no messages
    stage = PipelineStage(solo, model, hooks=strategy, recompute="full" if recompute else "none",
                          label=_layer_label, release="layer")
    steps = program(schedule("1f1b", 1, micro_batches))[0]
    losses = []
    for x, y in batches:
        xl, yl = local_batch(strategy.comm, x, y)
        parts = split_batch(xl, yl, micro_batches, "micro-batches")
        step_losses = train_step(solo, stage, steps, [p[0] for p in parts], [p[1] for p in parts])
        losses.append(float(np.mean([step_losses[i] for i in sorted(step_losses)])))
    return TrainResult(losses, strategy.params(), strategy.shards())


def train_single(model, params, batches, opt, clip_grad_norm=None, micro_batches=1):
    """The reference: one device, the whole global batch, as ``micro_batches`` groups of
    contiguous sequences (MoE capacity and load-balancing statistics are per group).
    Returns (params, losses): the losses are each step's mean cross-entropy."""
    state = opt.init(params)
    losses = []
    for x, y in batches:
        groups = split_batch(x, y, micro_batches, "micro-batches")
        total, step_losses = None, []
        for xg, yg in groups:
            logits, cache = model.forward(upcast(params), xg)
            loss, lc = nn.cross_entropy(logits, yg)
            nn.scale_aux_loss(cache, 1.0 / micro_batches)
            _, grads = model.backward(upcast(params), cache, nn.cross_entropy_backward(lc, 1.0 / micro_batches))
            total = grads if total is None else {k: total[k] + g for k, g in grads.items()}
            step_losses.append(loss)
        if clip_grad_norm is not None:
            c = clip_coefficient(global_norm(total), clip_grad_norm)
            total = {k: g * c for k, g in total.items()}
        params, state = opt.step(params, {k: g.astype(params[k].dtype) for k, g in total.items()}, state)
        losses.append(float(np.mean(step_losses)))
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
