"""DDP: every rank holds everything; gradients are averaged with all-reduce, in buckets,
while backward still runs (Li et al., "PyTorch Distributed", VLDB 2020).

Backward produces gradients last layer first. DDP collects them in buckets of about
``bucket_bytes`` (whole layers, in backward order; None: one bucket per layer) and starts
an asynchronous all-reduce as soon as a bucket is full, so the reduction of late layers
travels while earlier layers are still computing. ``step`` waits for every bucket,
divides by the group size and updates all parameters. With several micro-batches the
gradients accumulate locally and only the last micro-batch reduces (``no_sync``).
Traffic per step: one all-reduce of the gradients, 2(n-1)/n x their bytes per rank.
"""

import numpy as np

from .base import DataParallelStrategy


class DDP(DataParallelStrategy):
    zero_stage = 0

    def __init__(self, comm, model, params, opt, bucket_bytes=None):
        super().__init__(comm, model, params, opt)
        self.hold_full_params()
        self.state = opt.init(params)
        self.memory.hold("optimizer", self.state, "optimizer")
        self.buckets = self._plan_buckets(bucket_bytes)
        self.where = {name: (i, off) for i, (names, offs) in enumerate(self.buckets) for name, off in zip(names, offs)}
        self.flat = {}  # bucket index -> its gradients, flat (torch's grads are views of it)
        self.pending = {}  # bucket index -> handle of its all-reduce

    def _plan_buckets(self, bucket_bytes):
        """Layers in backward order, grouped into buckets of at least ``bucket_bytes``:
        a list of (layer names, their offsets in the bucket)."""
        buckets, names, offsets, size, nbytes = [], [], [], 0, 0
        for name in reversed(self.names):
            names.append(name)
            offsets.append(size)
            size += self.layouts[name].size
            nbytes += sum(v.nbytes for v in self.full[name].values())
            if bucket_bytes is None or nbytes >= bucket_bytes or name == self.names[0]:
                buckets.append((names, offsets + [size]))
                names, offsets, size, nbytes = [], [], 0, 0
        return buckets

    def grads_ready(self, name, grads, last):
        i, off = self.where[name]
        names, offsets = self.buckets[i]
        if i not in self.flat:  # the bucket's storage, allocated by its first gradient
            dtype = next(iter(grads.values())).dtype
            self.flat[i] = self.memory.hold(f"grads:bucket{i}", np.zeros(offsets[-1], dtype), "grads")
        lay = self.layouts[name]
        self.flat[i][off:off + lay.size] += np.concatenate([grads[k].reshape(-1) for k in lay.names])
        if last and name == names[-1]:  # the bucket is complete: reduce it while backward goes on
            self.pending[i] = self.comm.all_reduce(self.flat[i], async_op=True)

    def step(self):
        mean = {}
        for i, (names, offsets) in enumerate(self.buckets):
            reduced = self.pending.pop(i).wait() / self.comm.size
            for name, off in zip(names, offsets):
                grads = self.layouts[name].unflatten(reduced[off:off + self.layouts[name].size])
                mean.update({f"{name}.{k}": v for k, v in grads.items()})
            self.memory.release(f"grads:bucket{i}")
            del self.flat[i]
        new, self.state = self.opt.step(self.params(), mean, self.state)
        self.full = {name: {k: new[f"{name}.{k}"] for k in self.full[name]} for name in self.names}
        self.hold_full_params()
