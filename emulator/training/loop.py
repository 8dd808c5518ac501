"""The training step every data-parallel strategy plugs into.

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
"""

from dataclasses import dataclass

import numpy as np

from ..parallel.batches import local_batch, split_batch
from ..parallel.pipeline import PipelineStage, program, schedule, train_step


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
