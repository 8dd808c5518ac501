"""ZeRO-1: the optimizer state is sharded (Rajbhandari et al., "ZeRO", SC 2020).

Every rank computes the full gradient. In ``step``, layer by layer: a reduce-scatter
leaves each rank the summed gradient of its own slice; the rank updates that slice with
the optimizer state only it keeps; an all-gather hands everyone the new parameters.
all-reduce = reduce-scatter + all-gather, so the traffic is DDP's: the memory saving
(K bytes per parameter become K/n) is free.
"""

from .base import DataParallelStrategy


class ZeRO1(DataParallelStrategy):
    zero_stage = 1

    def __init__(self, comm, model, params, opt):
        super().__init__(comm, model, params, opt)
        self.hold_full_params()
        self.state = self.sharded_optimizer(self.slices_of_full())
        self.grads = {}

    def grads_ready(self, name, grads, last):
        if name in self.grads:  # accumulating over micro-batches
            self.grads[name] = {k: self.grads[name][k] + g for k, g in grads.items()}
            return
        self.grads[name] = grads
        self.memory.hold(f"grads:{name}", grads, "grads")

    def step(self):
        n = self.comm.size
        for name in self.names:
            lay = self.layouts[name]
            g = self.comm.reduce_scatter(lay.flatten(self.grads.pop(name))) / n  # mean gradient of my slice
            self.memory.release(f"grads:{name}")
            mine = self.my_slice(name, lay.flatten(self.full[name]))
            new, self.state[name] = self.opt.step({"flat": mine}, {"flat": g}, self.state[name])
            self.full[name] = lay.unflatten(self.comm.all_gather(new["flat"]))
        self.hold_full_params()

    def shards(self):
        return self.slices_of_full()
