"""ZeRO-1: the optimizer state is sharded (Rajbhandari et al., "ZeRO", SC 2020).

Every rank computes the full gradient. In ``step``, layer by layer: a reduce-scatter
leaves each rank the summed gradient of its own slice; the rank updates that slice with
the optimizer state only it keeps; an all-gather hands everyone the new parameters.
all-reduce = reduce-scatter + all-gather, so the traffic is DDP's: the memory saving
(K bytes per parameter become K/n) is free.
"""

from .strategy import DataParallelStrategy


class ZeRO1(DataParallelStrategy):
    zero_stage = 1

    def __init__(self, comm, model, params, opt, average=True, label=""):
        super().__init__(comm, model, params, opt, average, label)
        self.hold_full_params()
        self.state = self.sharded_optimizer(self.slices_of_full())
        self.grads, self.grad_slices = {}, {}

    def grads_ready(self, name, grads, last):
        if name in self.grads:  # accumulating over micro-batches
            self.grads[name] = {k: self.grads[name][k] + g for k, g in grads.items()}
            return
        self.grads[name] = grads
        self.memory.hold(f"grads:{name}", grads, "grads")

    def step(self):  # layer by layer: reduce-scatter, update, all-gather
        self.charge_update()
        for name in self.names:
            self._reduce(name)
            self._update(name, 1.0)
        self.hold_full_params()

    def reduce_grads(self):
        for name in self.names:
            self._reduce(name)

    def owned_grads(self):
        return self.sliced_owned_grads(self.grad_slices)

    def apply(self, grad_scale=1.0):
        self.charge_update()
        for name in self.names:
            self._update(name, grad_scale)
        self.hold_full_params()

    def _reduce(self, name):
        flat = self.layouts[name].flatten(self.grads.pop(name))
        self.grad_slices[name] = self.comm.reduce_scatter(flat) / self.divisor  # the gradient of my slice
        self.memory.release(f"grads:{name}")
        self.memory.hold(f"grads:{name}", self.grad_slices[name], "grads")

    def _update(self, name, grad_scale):
        self.full[name] = self.layouts[name].unflatten(self.comm.all_gather(self.step_my_slice(name, grad_scale)))

    def shards(self):
        return self.slices_of_full()
