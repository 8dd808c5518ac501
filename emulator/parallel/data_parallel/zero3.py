"""ZeRO-3 / FSDP: parameters are sharded too (Rajbhandari et al., "ZeRO", SC 2020; Zhao et
al., "PyTorch FSDP", VLDB 2023).

No rank holds the model. Before a layer's forward its shards are all-gathered into the
full parameters, used, and freed; backward gathers them again, computes, reduce-scatters
the gradient and frees them. With ``prefetch`` the gather of the next layer (in forward,
then in backward order) starts asynchronously while the current layer computes, so it
can hide behind compute. Traffic: an all-gather in forward, another in backward, a
reduce-scatter: 3(n-1)/n x the parameter bytes per rank, 1.5x DDP's. Activations are
kept as in DDP: ZeRO does not touch them.
"""

from .strategy import DataParallelStrategy


class ZeRO3(DataParallelStrategy):
    zero_stage = 3

    def __init__(self, comm, model, params, opt, prefetch=False, average=True, label=""):
        super().__init__(comm, model, params, opt, average, label)
        self.prefetch = prefetch
        self.my = self.slices_of_full()
        self.full = None
        self.memory.hold(self.entry("params"), self.my, "params")
        self.state = self.sharded_optimizer(self.my)
        self.grad_shards = {}
        self.pending = {}  # layer -> handle of its all-gather, started early
        self.reducing = None  # (layer, handle) of the reduce-scatter in flight (with prefetch, as FSDP2)
        self.gathered = {}  # layer -> [its full parameters, how many users still hold them]

    def _gather(self, name, upcoming):
        if name in self.gathered:  # still held (a split backward's W has not run yet): share it
            self.gathered[name][1] += 1
            return self.gathered[name][0]
        h = self.pending.pop(name, None) or self.comm.all_gather(self.my[name], async_op=True)
        if self.prefetch and upcoming is not None and upcoming not in self.pending and upcoming not in self.gathered:
            self.pending[upcoming] = self.comm.all_gather(self.my[upcoming], async_op=True)
        full = h.wait()
        self.memory.hold(f"gathered:{name}", full, "buffers")
        self.gathered[name] = [self.layouts[name].unflatten(full), 1]
        return self.gathered[name][0]

    def _done_with(self, name):
        self.gathered[name][1] -= 1
        if not self.gathered[name][1]:
            del self.gathered[name]
            self.memory.release(f"gathered:{name}")

    def params_for_forward(self, name, upcoming):
        return self._gather(name, upcoming)

    def after_forward(self, name):
        self._done_with(name)

    def params_for_backward(self, name, upcoming):
        return self._gather(name, upcoming)

    def grads_ready(self, name, grads, last):
        self._done_with(name)
        if not self.prefetch:
            self.reduce_scatter_grads(name, grads, self.grad_shards)
            return
        # FSDP2: the reduce-scatter goes on its own stream while the next layer's backward runs;
        # the one before is waited for first (one in flight, as its buffer is freed then)
        self._finish_reduce()
        flat = self.layouts[name].flatten(grads)
        self.memory.hold(f"fullgrad:{name}", flat, "buffers")
        self.reducing = (name, self.comm.reduce_scatter(flat, async_op=True))

    def _finish_reduce(self):
        if self.reducing is None:
            return
        name, handle = self.reducing
        self.reducing = None
        mine = handle.wait() / self.divisor
        self.memory.release(f"fullgrad:{name}")
        self.accumulate(self.grad_shards, name, mine, f"grads:{name}", "grads")

    def reduce_grads(self):
        self._finish_reduce()  # the rest reduce-scattered as backward went

    def owned_grads(self):
        return self.sliced_owned_grads(self.grad_shards)

    def apply(self, grad_scale=1.0):
        self.charge_update()
        for name in self.names:
            g = self.grad_shards.pop(name)
            new, self.state[name] = self.opt.step({"flat": self.my[name]},
                                                  {"flat": g * grad_scale if grad_scale != 1.0 else g}, self.state[name])
            self.memory.release(f"grads:{name}")
            self.my[name] = new["flat"]
        self.memory.release(self.entry("params"))
        self.memory.hold(self.entry("params"), self.my, "params")

    def shards(self):
        return dict(self.my)
