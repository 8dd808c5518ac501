"""The data-parallel strategies by ZeRO stage, side by side: ``STRATEGIES`` (0: DDP, 1:
ZeRO-1, 2: ZeRO-2, 3: ZeRO-3), ``data_parallel`` to pick one, and ``assemble`` to put full
parameters back together from every rank's shards."""

import numpy as np

from ..errors import ConfigError
from .flat_layout import layouts
from .ddp import DDP
from .zero1 import ZeRO1
from .zero2 import ZeRO2
from .zero3 import ZeRO3

STRATEGIES = {0: DDP, 1: ZeRO1, 2: ZeRO2, 3: ZeRO3}
NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def data_parallel(zero_stage, comm, model, params, opt, **options):
    """The strategy for ``zero_stage`` 0 (DDP), 1, 2 or 3, on the data-parallel group ``comm``."""
    if zero_stage not in STRATEGIES:
        raise ConfigError(f"zero_stage must be 0 (DDP), 1, 2 or 3, got {zero_stage!r}")
    return STRATEGIES[zero_stage](comm, model, params, opt, **options)


def assemble(model, params0, shards_by_rank):
    """Full parameters from every rank's shards ({layer: flat slice} per rank), in the
    global view (no messages): to check a sharded run against a single device."""
    n = len(shards_by_rank)
    out = {}
    for name, layout in layouts(model, params0, n).items():
        flat = np.concatenate([s[name] for s in shards_by_rank])
        out.update({f"{name}.{k}": v for k, v in layout.unflatten(flat).items()})
    return out
