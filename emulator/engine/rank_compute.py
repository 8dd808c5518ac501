"""A rank's compute on the simulated clock: ``compute`` by FLOPs, seconds or kernels, the
declared work of a module charged kernel by kernel (:mod:`emulator.engine.charging`; a
GEMM fed by a ring exchange, :mod:`emulator.machine.comm_overlap`), and time on storage.
"""

import numpy as np

from ..errors import ConfigError
from ..machine.comm_overlap import ring_exchange
from ..machine.dtypes import dtype_name
from ..machine.precision import native
from ..machine.stack import Context
from .charging import Declared, WorkMismatch


class RankCompute:
    """The compute half of :class:`~emulator.engine.comm.Comm`."""

    def compute(self, flops=None, seconds=None, name="compute", kernel=None, kernels=None):
        """Advance this rank's compute clock: by ``flops`` at the device's peak, by
        ``seconds``, or by the time the topology's device takes for a ``kernel`` (or a list
        of ``kernels``; see :mod:`emulator.machine.kernels`)."""
        if kernel is not None:
            kernels = [kernel]
        if sum(v is not None for v in (flops, seconds, kernels)) != 1:
            raise ConfigError(f"rank {self.global_rank}: compute() takes flops=, seconds= or kernel(s)=, exactly one")
        if kernels is not None:
            device = self._world.topology.device
            dur = sum(device.time(k) for k in kernels)
        else:
            dur = seconds if seconds is not None else flops / self._world.topology.flops
        if not dur >= 0:
            raise ConfigError(f"rank {self.global_rank}: compute() got a negative duration ({dur})")
        dur *= self._world.faults.slowdown[self.global_rank]  # a straggler (emulator.engine.faults)
        self._world.clock.advance(self.global_rank, dur, name)

    # ----------------------------------------------------------------- declared work
    @property
    def stack(self):
        """The software stack this run's declared work is charged as (:mod:`emulator.machine.stack`)."""
        return self._world.stack

    @property
    def precision(self):
        """The run's precision policy (None: every number as the arrays hold it)."""
        return self._world.precision

    def work_context(self, array_dtype, params_dtype=None):
        """The :class:`~emulator.machine.stack.Context` of a module whose arrays are ``array_dtype``
        (``params_dtype``: its parameters', where they differ and the world has no policy)."""
        if self._world.precision is not None:
            return Context(self._world.stack, self._world.precision, dtype_name(array_dtype))
        policy = native(array_dtype)
        if params_dtype is not None and np.dtype(params_dtype) != np.dtype(array_dtype):
            policy = policy.replace(params=dtype_name(params_dtype))
        return Context(self._world.stack, policy, dtype_name(array_dtype))

    def declared(self, build, what):
        """``with comm.declared(lambda: work.forward, "block forward"):`` opens a declared pass
        (:mod:`emulator.engine.charging`) unless one is open on this rank already."""
        return Declared(self, build, what)

    def charge(self, name, optional=False):
        """Advance this rank's clock by the declared kernels called ``name`` of the open pass
        (``optional``: nothing if the declaration has none of that name)."""
        open_ = self._world._charges[self.global_rank]
        if not open_:
            raise WorkMismatch(f"rank {self.global_rank}: charge({name!r}) outside a declared pass")
        charges = open_[-1]
        kernels = charges.take(name, optional)
        if not kernels:
            return
        w = self._world
        w.kinds.setdefault(name, kernels[0].kind)
        device, stack = w.topology.device, w.stack
        slow = w.faults.slowdown[self.global_rank] * charges.slowdown_of(kernels, device.sms)
        times = [(device.time(k) + (stack.launch if k.kind == "memory" else 0.0)) * slow for k in kernels]
        ring = charges.ring
        if ring is not None and kernels[0].kind == "gemm":  # its rows arrive from a ring exchange meanwhile
            charges.ring = None
            self._ring_exchange(ring, sum(times), name, stack.dispatch)
            return
        me = self.global_rank
        start = max(w.clock.compute[me], w.clock.host[me] + stack.dispatch)
        w.clock.kernels(me, times, name, stack.dispatch)
        charges.last_kernel = (start, w.clock.compute[me], sum(times))

    def _ring_exchange(self, ring, gemm, name, dispatch):
        """A GEMM cut into tp chunks, each started once its rows have arrived (TE's ring
        exchange; :func:`emulator.machine.comm_overlap.ring_exchange`)."""
        handle, n = ring
        start, end, _ = handle.span()
        clock, me = self._world.clock, self.global_rank
        clock.host[me] += dispatch
        t0 = max(clock.compute[me], clock.host[me])
        arrivals = [max(0.0, start + (end - start) * k / (n - 1) - t0) for k in range(n)]
        done = t0 + ring_exchange(gemm, end - start, n, arrivals)
        if t0 > clock.compute[me]:
            clock.join(me, t0, "the host")
        clock.advance(me, done - t0, name)

    def replayed(self, name):
        """A per-op checkpoint replayed the op ``name`` (its kept output, not computed): the
        open pass charges nothing for ``name`` when the module charges it, if nothing else of
        that name is declared."""
        self._world._charges[self.global_rank][-1].replayed.add(name)

    def replace_declared(self, name, kernels):
        """Swap the open pass's declared ``name`` kernels for ``kernels`` (known only as it runs)."""
        open_ = self._world._charges[self.global_rank]
        if open_:
            open_[-1].replace(name, kernels)

    def sync_host(self):
        """The host waits for this rank's GPU (it reads a value back)."""
        self._world.clock.sync_host(self.global_rank)

    def storage(self, seconds, name="storage", background=False):
        """Time on storage (a checkpoint's write or read): on the compute stream, which
        waits; or, ``background=True``, on this rank's ``storage`` stream while compute
        goes on (an asynchronous save's writer), after what that stream holds. Returns
        when it ends."""
        if not seconds >= 0:
            raise ConfigError(f"rank {self.global_rank}: storage() got a negative duration ({seconds})")
        if background:
            return self._world.clock.background(self.global_rank, "storage", seconds, name)
        clock = self._world.clock  # a synchronous write holds the host too: it waits for the GPU, then writes
        clock.sync_host(self.global_rank)
        clock.advance(self.global_rank, seconds, name)
        clock.sync_host(self.global_rank)
        return self.now

    def wait_storage(self, what="storage"):
        """Wait until this rank's ``storage`` stream is done (before reusing what it writes)."""
        clock = self._world.clock
        clock.join(self.global_rank, clock.free(self.global_rank, "storage"), what)
