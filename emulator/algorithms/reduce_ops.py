"""The reduce ops of the collectives, by torch's names, and the NumPy ufunc of each."""

import numpy as np

# torch.distributed.ReduceOp's names; "avg" adds, then divides by the group size
REDUCE_OPS = ("sum", "avg", "max", "min", "product")
UFUNC = {"sum": np.add, "avg": np.add, "max": np.maximum, "min": np.minimum, "product": np.multiply}


class ReduceOp:
    """The reduce ops by torch's names: ``comm.all_reduce(x, op=ReduceOp.MAX)`` is
    ``op="max"``."""

    SUM, AVG, MAX, MIN, PRODUCT = REDUCE_OPS
