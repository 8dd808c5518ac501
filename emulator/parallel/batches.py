"""A global batch cut into equal, contiguous parts: over the data-parallel ranks, and a
rank's share into micro-batches (as every step loop here and torchtitan's do)."""

import numpy as np

from ..errors import ConfigError


def split_batch(x, y, parts, what="parts"):
    """``parts`` equal, contiguous slices of the batch ``(x, y)`` along dim 0, as a list of
    ``(x_i, y_i)``: a batch over data-parallel ranks, or a rank's batch into micro-batches."""
    n = len(x)
    if isinstance(parts, bool) or not isinstance(parts, (int, np.integer)) or parts < 1 or n % parts:
        raise ConfigError(f"a batch of {n} sequences does not split into {parts} equal {what}; use a batch that is "
                          f"a multiple of {parts}")
    b = n // parts
    return [(x[i * b:(i + 1) * b], y[i * b:(i + 1) * b]) for i in range(parts)]


def local_batch(comm, x, y):
    """This rank's equal slice of a global batch (data parallelism)."""
    if len(x) % comm.size:
        raise ConfigError(f"a global batch of {len(x)} examples does not split over {comm.size} ranks; data "
                          f"parallelism needs a multiple of {comm.size} (and at least {comm.size})")
    return split_batch(x, y, comm.size)[comm.rank]
