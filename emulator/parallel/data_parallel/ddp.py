"""DDP: every rank holds everything; gradients are averaged with all-reduce, in buckets,
while backward still runs (Li et al., "PyTorch Distributed", VLDB 2020).

Backward produces gradients last layer first. DDP lays the gradient tensors, in that
order, into buckets of about ``bucket_bytes`` (None: one bucket per layer) and starts an
asynchronous all-reduce of a bucket as soon as its last tensor is ready, so the reduction
of late layers travels while earlier layers still compute. ``step`` waits for every
bucket, divides by the group size and updates all parameters. With several micro-batches
the gradients accumulate in the buckets and only the last micro-batch reduces
(``no_sync``). Traffic per step: one all-reduce of the gradients, 2(n-1)/n x their bytes
per rank, in as many calls as there are buckets: small buckets pay the latency of many
calls, one big bucket cannot start before backward ends.
"""

import numpy as np

from .strategy import DataParallelStrategy


class DDP(DataParallelStrategy):
    zero_stage = 0

    def __init__(self, comm, model, params, opt, bucket_bytes=None, average=True, label="", first_bucket_bytes=None):
        super().__init__(comm, model, params, opt, average, label)
        self.hold_full_params()
        self.state = opt.init(params)
        self.memory.hold(self.entry("optimizer"), self.state, "optimizer")
        self.buckets = self._plan_buckets(bucket_bytes, first_bucket_bytes)
        self.flat = {}  # bucket index -> its gradients, flat (torch's grads are views of it)
        self.pending = {}  # bucket index -> handle of its all-reduce

    def _plan_buckets(self, bucket_bytes, first_bucket_bytes=None):
        """The gradient tensors in backward order, cut into buckets of at least
        ``bucket_bytes`` (the first of ``first_bucket_bytes``, as torch DDP's 1 MB): a list of
        buckets, each a list of (layer, key, offset, size)."""
        buckets, current, size, nbytes = [], [], 0, 0
        limit = first_bucket_bytes if first_bucket_bytes is not None else bucket_bytes
        for name in reversed(self.names):
            lay = self.layouts[name]
            for key, shape in zip(lay.names, lay.shapes):
                numel = int(np.prod(shape))
                current.append((name, key, size, numel))
                size += numel
                nbytes += numel * self.full[name][key].itemsize
                if limit is not None and nbytes >= limit:
                    buckets.append(current)
                    current, size, nbytes, limit = [], 0, 0, bucket_bytes
            if bucket_bytes is None and current:
                buckets.append(current)
                current, size, nbytes = [], 0, 0
        if current:
            buckets.append(current)
        return buckets

    def grads_ready(self, name, grads, last):
        for i, bucket in enumerate(self.buckets):
            if not any(layer == name for layer, *_ in bucket):
                continue
            if i not in self.flat:  # the bucket's storage, allocated by its first gradient
                size = bucket[-1][2] + bucket[-1][3]
                first = next(iter(grads.values()))
                self.flat[i] = self.memory.hold(self.entry(f"grads:bucket{i}"), np.zeros_like(first, shape=(size,)),
                                                "grads")
            for layer, key, off, numel in bucket:
                if layer == name:
                    self.flat[i][off:off + numel] += grads[key].reshape(-1)
            if last and bucket[-1][0] == name:  # complete: reduce it while backward goes on
                self.pending[i] = self.comm.all_reduce(self.flat[i], async_op=True)

    def reduce_grads(self):
        self.mean = []  # (layer, key, mean gradient); the buckets stay held until the update
        for i, bucket in enumerate(self.buckets):
            reduced = self.pending.pop(i).wait() / self.divisor
            for layer, key, off, numel in bucket:
                self.mean.append((layer, key, reduced[off:off + numel].reshape(self.full[layer][key].shape)))

    def owned_grads(self):
        return self.mean, self.comm.size

    def apply(self, grad_scale=1.0):
        self.charge_update()
        grads = {f"{layer}.{key}": g * grad_scale if grad_scale != 1.0 else g for layer, key, g in self.mean}
        new, self.state = self.opt.step(self.params(), grads, self.state)
        for i in range(len(self.buckets)):
            self.memory.release(self.entry(f"grads:bucket{i}"))
        self.flat, self.mean = {}, None
        self.full = {name: {k: new[f"{name}.{k}"] for k in self.full[name]} for name in self.names}
        self.hold_full_params()
