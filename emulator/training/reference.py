"""``train_single`` is the reference every parallel run must match: one device, the whole
global batch (as ``micro_batches`` contiguous groups, whose gradients add up; each
group's loss, auxiliary losses included, scaled by ``1/micro_batches``), optionally
clipped to a global gradient norm as ``torch.nn.utils.clip_grad_norm_`` does.
"""

import numpy as np

from .. import nn
from ..nn.clip import clip_coefficient, global_norm
from ..nn.precision import upcast
from ..parallel.batches import split_batch


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
