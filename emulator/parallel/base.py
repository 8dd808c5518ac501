"""What every data-parallel strategy shares: its group, the model's layers and their flat
layouts, the optimizer, and what it holds in the rank's ledger."""

from ..nn.module import sub
from .flat_layout import layouts


class DataParallelStrategy:
    """Base of DDP and the ZeRO stages. ``comm`` is the data-parallel group (the world, or
    a mesh axis such as ``comm.group("dp")``). Subclasses set ``zero_stage`` and define
    ``grads_ready`` and ``step``; the hooks here serve full, replicated parameters."""

    zero_stage = None

    def __init__(self, comm, model, params, opt):
        self.comm, self.model, self.opt = comm, model, opt
        self.memory = comm.memory
        self.names = [name for name, _ in model.layers]
        self.layouts = layouts(model, params, comm.size)
        self.full = {name: sub(params, name) for name in self.names}  # this rank's full params, if any

    # ----------------------------------------------------------------- hooks of emulator.training
    def params_for_forward(self, name, upcoming):
        return self.full[name]

    def after_forward(self, name):
        pass

    def params_for_backward(self, name, upcoming):
        return self.full[name]

    def grads_ready(self, name, grads, last):
        raise NotImplementedError

    def step(self):
        raise NotImplementedError

    # ----------------------------------------------------------------- results
    def params(self):
        """The full parameters this rank holds ({"layer.key": array}), or None."""
        if self.full is None:
            return None
        return {f"{name}.{k}": v for name, p in self.full.items() for k, v in p.items()}

    def shards(self):
        """{layer: this rank's flat slice} for sharded strategies, else None."""
        return None

    # ----------------------------------------------------------------- helpers
    def my_slice(self, name, flat):
        return self.layouts[name].shard(flat, self.comm.rank, self.comm.size)

    def hold_full_params(self):
        if self.memory.holds("params"):
            self.memory.release("params")
        self.memory.hold("params", self.full, "params")

    def slices_of_full(self):
        """{layer: this rank's slice of its full parameters} (ZeRO-1 and 2 hold them all)."""
        return {name: self.my_slice(name, self.layouts[name].flatten(self.full[name])) for name in self.names}

    def sharded_optimizer(self, shards):
        """Optimizer state for this rank's slice of every layer only (ZeRO-1, 2, 3)."""
        state = {name: self.opt.init({"flat": shards[name]}) for name in self.names}
        self.memory.hold("optimizer", state, "optimizer")
        return state

    def reduce_scatter_grads(self, name, grads, grad_shards):
        """ZeRO-2 and 3, as backward produces a layer's gradients: reduce-scatter them, keep
        the mean gradient of this rank's slice (adding to it over micro-batches), free the
        full gradient."""
        flat = self.layouts[name].flatten(grads)
        self.memory.hold(f"fullgrad:{name}", flat, "buffers")
        mine = self.comm.reduce_scatter(flat) / self.comm.size
        self.memory.release(f"fullgrad:{name}")
        if name in grad_shards:
            grad_shards[name] += mine
        else:
            grad_shards[name] = mine
            self.memory.hold(f"grads:{name}", mine, "grads")
