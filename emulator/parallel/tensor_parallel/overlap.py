"""Transformer Engine's overlap of the tensor-parallel collectives with the GEMMs beside
them (``--tp-comm-overlap``, userbuffers; Megatron requires sequence parallelism for it):
:class:`TERegions`, the operators of :class:`~.regions.TPRegions` as TE runs them, and
:func:`te_pending` for the collectives of its bulk overlap in backward."""

from ...machine.comm_overlap import pipelined
from .regions import TPRegions, from_front, ready, to_front


class TERegions(TPRegions):
    """The same operators as Transformer Engine's userbuffers overlap them with the GEMM
    beside them (``--tp-comm-overlap``, sequence parallelism): the all-gathers before a
    column-parallel GEMM and before a row-parallel one's input gradient as ring exchanges
    (the GEMM's chunks computed as their rows arrive), the reduce-scatter after a
    row-parallel GEMM pipelined behind its chunks; in backward the bulk overlaps take SMs
    from the GEMMs beside them (:mod:`emulator.machine.comm_overlap`, the times; the open
    declared pass, :mod:`emulator.engine.charging`, pairs each collective with its GEMM)."""

    def __init__(self, comm, payload=None, splits=4, sms=16):
        super().__init__(comm, True, payload)
        self.splits, self.sms = splits, sms

    def _charges(self):
        return self.comm._world._charges[self.comm.global_rank][-1]

    def _ring(self, x, async_op):
        x, back = self._send(x)
        handle = self.comm.all_gather(to_front(x), async_op=True)
        self._charges().ring = (handle, self.comm.size)  # the next GEMM computes as its rows arrive
        return ready(back(from_front(handle.span()[2])), async_op)

    def gather(self, x, async_op=False):
        return self._ring(x, async_op)

    def reduce_back(self, dy, async_op=False):
        return self._ring(dy, async_op)

    def reduce(self, y, async_op=False):
        """Pipelined behind the GEMM just charged: its chunks' reduce-scatters start after its
        first chunk, and the last one ends a chunk's share after the GEMM."""
        charges = self._charges()
        start, end, gemm = charges.last_kernel
        charges.ready_at = start + gemm / self.splits
        y, back = self._send(y)
        handle = self.comm.reduce_scatter(to_front(y), async_op=True)
        c0, c1, out = handle.span()
        clock, me = self.comm._world.clock, self.comm.global_rank
        finish = start + pipelined(gemm, c1 - c0, self.splits) if c1 > c0 else end
        clock.join(me, max(finish, c1), "the pipelined reduce-scatter")
        return ready(back(from_front(out)), async_op)

    def bulk(self, on):
        """Take (or give back) the bulk overlap's SMs from the GEMMs charged meanwhile."""
        self._charges().bulk_sms = self.sms if on else 0


def te_pending(pending, bulk):
    """A pending collective of TE's bulk overlap: it takes its SMs from the GEMMs explicitly
    (``bulk``), so the compute beside it is not slowed again as beside an NCCL kernel."""
    handle = getattr(pending, "handle", None)
    if bulk and handle is not None:
        handle.contended = False
    return pending
