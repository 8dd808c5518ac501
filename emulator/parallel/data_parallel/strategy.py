"""What every data-parallel strategy shares: its group, the model's layers and their flat
layouts, the optimizer, and what it holds in the rank's ledger."""

import numpy as np

from ...machine import elementwise
from ...nn.module import sub
from .flat_layout import layouts


class DataParallelStrategy:
    """Base of DDP and the ZeRO stages. ``comm`` is the data-parallel group (the world, or
    a mesh axis such as ``comm.group("dp")``). Subclasses set ``zero_stage`` and define
    ``grads_ready`` and either ``step`` or, split in two so that gradient clipping fits
    between them, ``reduce_grads`` (finish the reduction) and ``apply`` (update). The
    hooks here serve full, replicated parameters.

    ``label`` names its ledger entries when a rank runs several (one per gradient group).

    ``average=True``: each rank's loss is the mean over its own examples, and the reduced
    gradient is divided by the group size. ``average=False``: the loss was already scaled
    for the whole group (as the mesh runtime scales it once, for every data-parallel and
    context-parallel rank and micro-batch), and gradients are summed."""

    zero_stage = None

    def __init__(self, comm, model, params, opt, average=True, label=""):
        self.comm, self.model, self.opt, self.label = comm, model, opt, label
        self.memory = comm.memory
        self.divisor = comm.size if average else 1
        self.names = [name for name, _ in model.layers]
        self.layouts = layouts(model, params, comm.size)
        self.full = {name: sub(params, name) for name in self.names}  # this rank's full params, if any
        self.param_dtype = next(iter(params.values())).dtype if params else np.dtype(np.float32)

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
        """After the whole batch: reduce, then update."""
        self.reduce_grads()
        self.apply()

    def reduce_grads(self):
        raise NotImplementedError

    def apply(self, grad_scale=1.0):
        raise NotImplementedError

    def owned_grads(self):
        """After :meth:`reduce_grads`: ``(layer, key, gradient or a piece of it)`` for every
        reduced gradient this rank holds, and how many ranks of the group hold the same
        piece (DDP: all of them; ZeRO: each piece is one rank's). For the global norm."""
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

    # ----------------------------------------------------------------- the optimizer's kernels
    def updated_elements(self):
        """Parameter elements this rank's optimizer updates: all of them (DDP), or its slice
        of every layer's flat vector (ZeRO)."""
        if self.zero_stage == 0:
            return sum(int(np.prod(shape)) for name in self.names for shape in self.layouts[name].shapes)
        return sum(self.layouts[name].padded // self.comm.size for name in self.names)

    def optimizer_work(self):
        """The declared kernels of this rank's update (:func:`emulator.machine.elementwise.optimizer_update`)."""
        return update_work(self.comm, self.param_dtype, self.updated_elements())

    def charge_update(self):
        """Advance the clock by the optimizer's update, as declared."""
        charge_update(self.comm, self.param_dtype, self.updated_elements())

    # ----------------------------------------------------------------- helpers
    def entry(self, name):
        """The ledger's name for what this strategy holds (``label`` tells apart two
        strategies on one rank: a block's dense weights and its experts)."""
        return f"{name} ({self.label})" if self.label else name

    def my_slice(self, name, flat):
        return self.layouts[name].shard(flat, self.comm.rank, self.comm.size)

    def step_my_slice(self, name, grad_scale, grads=None):
        """The optimizer's step on this rank's slice of layer ``name`` with its reduced
        gradient slice, taken from ``grads`` (default: ``self.grad_slices``) and released:
        the new slice."""
        g = (self.grad_slices if grads is None else grads).pop(name)
        self.memory.release(f"grads:{name}")
        mine = self.my_slice(name, self.layouts[name].flatten(self.full[name]))
        new, self.state[name] = self.opt.step({"flat": mine}, {"flat": g * grad_scale if grad_scale != 1.0 else g},
                                              self.state[name])
        return new["flat"]

    def slice_pieces(self, name, flat_slice):
        """(layer, key, piece) for the parameters that this rank's slice of a layer's flat
        vector covers (the padding left out)."""
        lay, n, r = self.layouts[name], self.comm.size, self.comm.rank
        lo, hi = r * lay.padded // n, (r + 1) * lay.padded // n
        for key, off, shape in zip(lay.names, lay.offsets, lay.shapes):
            a, b = max(lo, off), min(hi, off + int(np.prod(shape)))
            if a < b:
                yield name, key, flat_slice[a - lo:b - lo]

    def sliced_owned_grads(self, slices):
        return [piece for name in self.names for piece in self.slice_pieces(name, slices[name])], 1

    def hold_full_params(self):
        if self.memory.holds(self.entry("params")):
            self.memory.release(self.entry("params"))
        self.memory.hold(self.entry("params"), self.full, "params")

    def slices_of_full(self):
        """{layer: this rank's slice of its full parameters} (ZeRO-1 and 2 hold them all)."""
        return {name: self.my_slice(name, self.layouts[name].flatten(self.full[name])) for name in self.names}

    def sharded_optimizer(self, shards):
        """Optimizer state for this rank's slice of every layer only (ZeRO-1, 2, 3)."""
        state = {name: self.opt.init({"flat": shards[name]}) for name in self.names}
        self.memory.hold(self.entry("optimizer"), state, "optimizer")
        return state

    def reduce_scatter_grads(self, name, grads, grad_shards):
        """ZeRO-2 and 3, as backward produces a layer's gradients: reduce-scatter them, keep
        the mean gradient of this rank's slice (adding to it over micro-batches), free the
        full gradient."""
        flat = self.layouts[name].flatten(grads)
        self.memory.hold(f"fullgrad:{name}", flat, "buffers")
        mine = self.comm.reduce_scatter(flat) / self.divisor
        self.memory.release(f"fullgrad:{name}")
        self.accumulate(grad_shards, name, mine, f"grads:{name}", "grads")

    def accumulate(self, store, name, value, entry, kind):
        """``store[name] += value``; the first time, ``value`` itself, held in the ledger as
        ``entry`` of ``kind`` (gradients summed over a step's micro-batches)."""
        if name in store:
            store[name] += value
        else:
            store[name] = value
            self.memory.hold(entry, value, kind)


def update_work(comm, dtype, elements):
    """The declared kernels of an optimizer update of ``elements`` parameters of ``dtype`` on
    ``comm``'s rank (:func:`emulator.machine.elementwise.optimizer_update`, under the run's stack)."""
    ctx = comm.work_context(dtype)
    return elementwise.optimizer_update(ctx.stack, elements, ctx.precision, ctx.array)


def charge_update(comm, dtype, elements):
    """Advance ``comm``'s clock by that update, as declared (every strategy's, and a pipeline
    stage's own: :class:`emulator.parallel.pipeline.partition.ReplicatedParams`)."""
    with comm.declared(lambda: update_work(comm, dtype, elements), "optimizer step"):
        comm.charge("optimizer")
