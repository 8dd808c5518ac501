"""Data parallelism, one idea per file: the ZeRO ladder side by side (each readable alone),
the flat layout that cuts a layer into shards, and the stage's gradient finalization on a
mesh.

* :class:`DataParallelStrategy` (``strategy.py``): what every strategy shares, the hooks of
  :mod:`emulator.training` and the optimizer's step on a slice.
* :class:`DDP` (``ddp.py``): replicate everything; bucketed all-reduce overlapped with backward.
* :class:`ZeRO1` (``zero1.py``): shard the optimizer state.
* :class:`ZeRO2` (``zero2.py``): shard the gradients too.
* :class:`ZeRO3` (``zero3.py``): shard the parameters too (FSDP), optionally prefetching.
* :class:`DistributedOptimizer` (``distributed_optimizer.py``): Megatron's ZeRO-1, both
  collectives overlapped, in buckets.
* ``ladder.py``: ``STRATEGIES`` and ``NAMES`` by ``zero_stage``; ``data_parallel`` picks one,
  ``strategy_for`` the one a software stack runs, ``assemble`` puts full parameters back
  together from every rank's shards.
* :class:`FlatLayout`, ``layouts`` and ``reduce_flat`` (``flat_layout.py``): a layer's
  parameters as one padded flat vector; the library's one flatten, all-reduce, unflatten.
* ``bucket_limit``, ``bucket_layers`` (``buckets.py``): gradient buckets as the stack sizes them.
* :class:`MeshHooks` (``finalize.py``): Megatron's ``finalize_model_grads`` on a mesh, one
  strategy per gradient group (dense over ``dp x cp``, experts over ``edp``).

The package, called, is ``data_parallel``: ``from emulator.parallel import data_parallel``
gives this package, and ``data_parallel(zero_stage, comm, model, params, opt)`` picks a
strategy as the lessons call it, while ``emulator.parallel.data_parallel.ddp`` and the other
module paths stay importable (a function of that name would hide them).
"""

import inspect
import sys
import types

from .buckets import bucket_layers, bucket_limit
from .ddp import DDP
from .distributed_optimizer import DistributedOptimizer
from .finalize import MeshHooks
from .flat_layout import FlatLayout, layouts, reduce_flat
from .ladder import NAMES, STRATEGIES, assemble, data_parallel, strategy_for, uses_distributed_optimizer
from .strategy import DataParallelStrategy
from .zero1 import ZeRO1
from .zero2 import ZeRO2
from .zero3 import ZeRO3

__all__ = ["DataParallelStrategy", "DDP", "ZeRO1", "ZeRO2", "ZeRO3", "DistributedOptimizer", "STRATEGIES", "NAMES",
           "data_parallel", "strategy_for", "uses_distributed_optimizer", "assemble", "FlatLayout", "layouts",
           "reduce_flat", "bucket_layers", "bucket_limit", "MeshHooks"]


class _CallablePackage(types.ModuleType):
    """This package, which ``data_parallel(...)`` calls as :func:`.ladder.data_parallel`."""

    def __call__(self, *args, **kwargs):
        return data_parallel(*args, **kwargs)


__signature__ = inspect.signature(data_parallel)  # help() and a notebook's completion show the function's
sys.modules[__name__].__class__ = _CallablePackage
