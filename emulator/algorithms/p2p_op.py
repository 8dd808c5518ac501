"""One entry of ``comm.batch_isend_irecv``: a send or a receive to post in one NCCL group,
named and ordered as torch's ``torch.distributed.P2POp``. It sits below the engine, so the
algorithms that post point-to-point batches (``p2p_ring``) need no engine to describe them."""

import numpy as np

from ..errors import ConfigError


class P2POp:
    """One entry of :meth:`batch_isend_irecv`: ``P2POp(comm.isend, x, peer)`` or
    ``P2POp(comm.irecv, buffer, peer)`` (torch's names and order of arguments)."""

    def __init__(self, op, tensor, peer):
        comm, name = getattr(op, "__self__", None), getattr(op, "__name__", None)
        if name not in ("isend", "irecv") or not callable(getattr(comm, "batch_isend_irecv", None)):
            raise ConfigError(f"P2POp takes comm.isend or comm.irecv as its op, got {op!r}")
        self.op, self.tensor, self.peer, self.comm = op, tensor, peer, comm

    def __repr__(self):
        return f"P2POp({self.op.__name__}, shape={np.shape(self.tensor)}, peer={self.peer})"
