"""Megatron-Core's distributed optimizer: ZeRO-1 with both of its collectives hidden behind
compute, as ``--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather``
run it (``megatron/core/distributed/``; the rules quoted in
:mod:`emulator.machine.stack_sources`).

* The layers are cut into **buckets** in backward order (the last layers first), each at
  least ``bucket_elements`` parameters (Megatron: max(40M, 1M x data-parallel size); on a
  pipeline rank other than the first, one bucket). Once the last micro-batch's backward has
  produced every gradient of a bucket, the bucket's reduce-scatter starts on the group's
  stream while backward goes on (:meth:`grads_ready`); the step waits for them all.
* The update runs on this rank's slice only, and the new parameters are **all-gathered
  during the next forward**: a layer's forward waits for its bucket's all-gather, which
  the previous bucket's wait started (one bucket ahead). The first bucket's is exposed.
  Every step, the first included, gathers its parameters in its forward: one step is the
  steady state.

The gradients travel in the policy's ``grad_reduce`` dtype (fp32 under ``--bf16``), the
parameters in theirs (bf16): the two collectives move different bytes.
"""

from .strategy import DataParallelStrategy


class DistributedOptimizer(DataParallelStrategy):
    zero_stage = 1

    def __init__(self, comm, model, params, opt, bucket_elements=None, average=True, label=""):
        super().__init__(comm, model, params, opt, average, label)
        self.hold_full_params()
        self.state = self.sharded_optimizer(self.slices_of_full())
        self.buckets = self._buckets(bucket_elements)
        self.bucket_of = {name: i for i, b in enumerate(self.buckets) for name in b}
        self.grads, self.grad_slices, self.pending = {}, {}, {}
        self.new = self.slices_of_full()  # the slices the next forward gathers (steady state from step one)
        self.gathering, self.gathered = {}, set()

    def _buckets(self, bucket_elements):
        """Layer names in backward order, cut once a bucket holds at least ``bucket_elements``."""
        out, current, size = [], [], 0
        for name in reversed(self.names):
            current.append(name)
            size += self.layouts[name].size
            if bucket_elements is not None and size >= bucket_elements:
                out.append(current)
                current, size = [], 0
        if current:
            out.append(current)
        return out

    # ----------------------------------------------------------------- forward: gather as needed
    def _gather(self, i):
        if i in self.gathering or i in self.gathered or i >= len(self.buckets) or i < 0:
            return
        self.gathering[i] = [(name, self.comm.all_gather(self.new[name], async_op=True)) for name in self.buckets[i]]

    def params_for_forward(self, name, upcoming):
        i = self.bucket_of[name]
        if i not in self.gathered:
            self._gather(i)
            for layer, handle in self.gathering.pop(i):
                self.full[layer] = self.layouts[layer].unflatten(handle.wait())
            self.gathered.add(i)
            self.hold_full_params()
            self._gather(i - 1)  # forward runs the buckets from the last to the first
        return self.full[name]

    # ----------------------------------------------------------------- backward: reduce as ready
    def grads_ready(self, name, grads, last):
        if name in self.grads:
            self.grads[name] = {k: self.grads[name][k] + g for k, g in grads.items()}
        else:
            self.grads[name] = grads
            self.memory.hold(f"grads:{name}", grads, "grads")
        if last:
            bucket = self.buckets[self.bucket_of[name]]
            if all(n in self.grads and n not in self.pending for n in bucket) and name == bucket[-1]:
                for n in bucket:  # the bucket is complete: its reduce-scatter goes while backward runs on
                    flat = self.layouts[n].flatten(self.grads.pop(n))
                    self.pending[n] = self.comm.reduce_scatter(flat, async_op=True)

    def reduce_grads(self):
        for name in self.names:
            self.grad_slices[name] = self.pending.pop(name).wait() / self.divisor
            self.memory.release(f"grads:{name}")
            self.memory.hold(f"grads:{name}", self.grad_slices[name], "grads")

    def owned_grads(self):
        return self.sliced_owned_grads(self.grad_slices)

    # ----------------------------------------------------------------- the update
    def apply(self, grad_scale=1.0):
        self.charge_update()
        for name in self.names:
            self.new[name] = self.step_my_slice(name, grad_scale)
        self.gathered = set()  # the next forward gathers them

    @property
    def stale(self):
        """Whether the full parameters this rank holds predate the last update (their new
        values are in the slices until the next forward gathers them)."""
        return len(self.gathered) < len(self.buckets)

    @property
    def my(self):
        return self.new

    def shards(self):
        return dict(self.new)
