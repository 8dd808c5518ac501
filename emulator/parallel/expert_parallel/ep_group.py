"""One MoE layer run on an ep group with each rank's tokens in rank order, no tensor
parallelism: :func:`forward` and :func:`backward`, as lesson 05 calls them."""

import numpy as np

from ...errors import ConfigError
from ..tensor_parallel.regions import TPRegions
from .layer import ParallelMoE
from .token_groups import TokenGroup


def _no_tensor_parallelism(comm):
    """One rank per expert slice: the regions of a tp group of one, which send nothing."""
    return TPRegions(comm.new_group([comm.global_rank]), False)


def forward(comm, moe, params_local, x_local):
    """This rank's output for its tokens ``x_local`` (tokens, d), the experts over the group
    ``comm``, every rank's tokens one group in rank order; and the cache for :func:`backward`."""
    x = np.asarray(x_local)
    if x.shape[-1] != moe.d_model:
        raise ConfigError(f"rank {comm.global_rank}: tokens of width {x.shape[-1]}, the layer's is {moe.d_model}")
    layer = ParallelMoE(moe, comm, _no_tensor_parallelism(comm), lambda b, s: TokenGroup.rank_order(comm, b * s))
    x2 = x.reshape(1, -1, moe.d_model)
    y, cache = layer.forward(params_local, x2)
    cache["shape"] = x.shape
    return y.reshape(x.shape), cache


def backward(comm, moe, params, cache, dy):
    """(dx for this rank's tokens, gradients of this rank's parameters)."""
    layer = ParallelMoE(moe, comm, _no_tensor_parallelism(comm))
    dy = np.asarray(dy)
    shape = cache["shape"]
    cache = dict(cache, shape=(1,) + (int(np.prod(shape[:-1])), moe.d_model))
    dx, grads = layer.backward(params, cache, dy.reshape(1, -1, moe.d_model))
    return dx.reshape(shape), grads
