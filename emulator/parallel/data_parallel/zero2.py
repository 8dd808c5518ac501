"""ZeRO-2: gradients are sharded too (Rajbhandari et al., "ZeRO", SC 2020).

No rank keeps the full gradient: as soon as backward produces a layer's gradient it is
reduce-scattered, the rank keeps the summed gradient of its own slice, and the full copy
is freed. ``step`` updates each slice and all-gathers the parameters. The same bytes as
DDP; with several micro-batches, though, the reduce-scatter runs for every micro-batch
(a full gradient cannot wait for the last one: there is nowhere to keep it).
"""

from .strategy import DataParallelStrategy


class ZeRO2(DataParallelStrategy):
    zero_stage = 2

    def __init__(self, comm, model, params, opt, average=True, label=""):
        super().__init__(comm, model, params, opt, average, label)
        self.hold_full_params()
        self.state = self.sharded_optimizer(self.slices_of_full())
        self.grad_shards = {}

    def grads_ready(self, name, grads, last):
        self.reduce_scatter_grads(name, grads, self.grad_shards)

    def reduce_grads(self):
        pass  # reduce-scattered as backward went

    def owned_grads(self):
        return self.sliced_owned_grads(self.grad_shards)

    def apply(self, grad_scale=1.0):
        self.charge_update()
        for name in self.names:
            new = self.step_my_slice(name, grad_scale, self.grad_shards)
            self.full[name] = self.layouts[name].unflatten(self.comm.all_gather(new))
        self.hold_full_params()

    def shards(self):
        return self.slices_of_full()
