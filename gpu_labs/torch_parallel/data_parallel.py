"""DDP and ZeRO-1/2/3 written by hand on ``torch.distributed``: the algorithms of
``emulator.parallel``, call for call (a test compares the traces).

Each variant trains a model given layer by layer (``names``, ``layer_forward(name, params,
x)``) on this rank's slice of every global batch, on the data-parallel group ``group``,
and returns the full parameters and the local losses. Parameters are cut into the
emulator's flat layout (``emulator.parallel.data_parallel.flat_layout``: sorted names,
padded to a multiple of the group size), and every call goes through a :class:`trace.Recorder`; ``led`` (an
``emulator.records.memory.MemoryLedger``) records what the algorithm holds, by kind.

* DDP: one bucket per layer, all-reduced asynchronously from a hook as soon as backward
  has produced the layer's gradients; wait for all, divide by n, step.
* ZeRO-1: after backward, layer by layer: reduce-scatter the gradient, step this rank's
  slice (an optimizer per layer slice), all-gather the parameters.
* ZeRO-2: reduce-scatter each layer's gradient from a hook as backward produces it and drop
  the full one; after backward, layer by layer: step the slice, all-gather.
* ZeRO-3: layer by layer, all-gather the parameters into a flat buffer, run the layer,
  free the buffer's storage (autograd keeps the activations, as the lesson's ZeRO-3 does);
  in backward all-gather into the same storage again, backward through the layer,
  reduce-scatter its gradient, free. The storage trick is FSDP's: the saved weight views
  read whatever the storage holds when backward runs.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ..common import all_gather_into_tensor
from emulator.nn.module import sub


@dataclass
class Setup:
    names: list
    layouts: dict  # name -> emulator.parallel.data_parallel.flat_layout.FlatLayout
    params0: dict  # numpy, "layer.key" -> array
    layer_forward: object
    loss_fn: object
    optimizer: object  # a function: list of tensors -> torch.optim.Optimizer
    device: object
    dtype: object
    group: object
    rec: object  # trace.Recorder
    led: object  # emulator.records.memory.MemoryLedger

    @property
    def n(self):
        return torch.distributed.get_world_size(self.group)

    @property
    def rank(self):
        return torch.distributed.get_rank(self.group)

    def tensors(self, name, grad=False):
        return {k: torch.tensor(v, device=self.device, dtype=self.dtype, requires_grad=grad)
                for k, v in sub(self.params0, name).items()}

    def flatten(self, name, tensors, padded=True):
        lay = self.layouts[name]
        flat = torch.zeros(lay.padded if padded else lay.size, device=self.device, dtype=self.dtype)
        for k, off in zip(lay.names, lay.offsets):
            flat[off:off + tensors[k].numel()] = tensors[k].reshape(-1)
        return flat

    def unflatten(self, name, flat):
        lay = self.layouts[name]
        return {k: flat[off:off + int(np.prod(s))].view(s) for k, off, s in zip(lay.names, lay.offsets, lay.shapes)}

    def slice_of(self, name, flat):
        s = self.layouts[name].padded // self.n
        return flat[self.rank * s:(self.rank + 1) * s]

    def local(self, x, y):
        b = len(x) // self.n
        return x[self.rank * b:(self.rank + 1) * b], y[self.rank * b:(self.rank + 1) * b]

    def forward(self, params, x):
        for name in self.names:
            x = self.layer_forward(name, params[name], x)
        return x


def optimizer_state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
               if torch.is_tensor(v) and k != "step")


def _when_layer_done(full, name, fn):
    """Call ``fn(name)`` once backward has accumulated every gradient of a layer."""
    left = {"n": len(full[name])}

    def hook(_):
        left["n"] -= 1
        if left["n"] == 0:
            fn(name)

    return [t.register_post_accumulate_grad_hook(hook) for t in full[name].values()]


def _full_result(full):
    return {f"{a}.{k}": t.detach() for a, p in full.items() for k, t in p.items()}


def ddp(s, batches):
    full = {name: s.tensors(name, grad=True) for name in s.names}
    opt = s.optimizer([t for p in full.values() for t in p.values()])
    s.led.hold("params", _full_result(full), "params")
    losses = []
    for step, (x, y) in enumerate(batches):
        xl, yl = s.local(x, y)
        works, flats = {}, {}

        def reduce(name):
            flats[name] = s.led.hold(f"grads:{name}", s.flatten(name, {k: t.grad for k, t in full[name].items()},
                                                                padded=False), "grads")
            works[name] = s.rec.all_reduce(flats[name], group=s.group, async_op=True)

        hooks = [h for name in s.names for h in _when_layer_done(full, name, reduce)]
        loss = s.loss_fn(s.forward(full, xl), yl)
        loss.backward()
        for h in hooks:
            h.remove()
        for name in reversed(s.names):
            works.pop(name).wait()
            for k, g in s.unflatten(name, flats.pop(name) / s.n).items():
                full[name][k].grad = g.clone()
            s.led.release(f"grads:{name}")
        opt.step()
        if step == 0:  # torch makes the state on the first step
            s.led.hold("optimizer", optimizer_state_bytes(opt), "optimizer")
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return _full_result(full), losses


def _sharded(s):
    shards = {name: s.slice_of(name, s.flatten(name, s.tensors(name))).clone().requires_grad_(True)
              for name in s.names}
    opts = {name: s.optimizer([shards[name]]) for name in s.names}
    return shards, opts


def _reduce_scatter_into(s, name, flat, shards):
    """The mean gradient of this rank's slice of a layer, from every rank's full one."""
    out = torch.empty(s.layouts[name].padded // s.n, device=s.device, dtype=s.dtype)
    s.rec.reduce_scatter(out, flat, group=s.group)
    shards[name].grad = out / s.n
    return shards[name].grad


def _step_and_gather(s, name, shards, opts, full, step):
    opts[name].step()
    if step == 0 and name == s.names[-1]:
        s.led.hold("optimizer", sum(optimizer_state_bytes(o) for o in opts.values()), "optimizer")
    opts[name].zero_grad(set_to_none=True)
    s.led.release(f"grads:{name}")
    gathered = torch.empty(s.layouts[name].padded, device=s.device, dtype=s.dtype)
    s.rec.all_gather(gathered, shards[name].detach(), group=s.group)
    with torch.no_grad():
        for k, t in s.unflatten(name, gathered).items():
            full[name][k].copy_(t)


def zero1(s, batches, fault=False):
    full = {name: s.tensors(name, grad=True) for name in s.names}
    shards, opts = _sharded(s)
    s.led.hold("params", _full_result(full), "params")
    losses = []
    for step, (x, y) in enumerate(batches):
        xl, yl = s.local(x, y)
        loss = s.loss_fn(s.forward(full, xl), yl)
        loss.backward()
        for name in s.names:
            s.led.hold(f"grads:{name}", [t.grad for t in full[name].values()], "grads")
        for name in s.names:
            g = _reduce_scatter_into(s, name, s.flatten(name, {k: t.grad for k, t in full[name].items()}), shards)
            if fault and s.rank == 0 and name == s.names[-1]:  # flip one gradient: Adam's step flips too (a
                g[0] = -g[0] if g[0] != 0 else 1.0  # larger gradient would not do: Adam's first step is lr * sign)
            for t in full[name].values():
                t.grad = None
            _step_and_gather(s, name, shards, opts, full, step)
        losses.append(loss.item())
    return _full_result(full), losses


def zero2(s, batches):
    full = {name: s.tensors(name, grad=True) for name in s.names}
    shards, opts = _sharded(s)
    s.led.hold("params", _full_result(full), "params")
    losses = []
    for step, (x, y) in enumerate(batches):
        xl, yl = s.local(x, y)

        def reduce_scatter(name):
            flat = s.led.hold(f"fullgrad:{name}", s.flatten(name, {k: t.grad for k, t in full[name].items()}),
                              "buffers")
            _reduce_scatter_into(s, name, flat, shards)
            s.led.release(f"fullgrad:{name}")
            s.led.hold(f"grads:{name}", shards[name].grad, "grads")
            for t in full[name].values():
                t.grad = None

        hooks = [h for name in s.names for h in _when_layer_done(full, name, reduce_scatter)]
        loss = s.loss_fn(s.forward(full, xl), yl)
        loss.backward()
        for h in hooks:
            h.remove()
        for name in s.names:
            _step_and_gather(s, name, shards, opts, full, step)
        losses.append(loss.item())
    return _full_result(full), losses


def zero3(s, batches):
    shards, opts = _sharded(s)
    s.led.hold("params", {k: v.detach() for k, v in shards.items()}, "params")
    flats = {name: torch.empty(s.layouts[name].padded, device=s.device, dtype=s.dtype, requires_grad=True)
             for name in s.names}
    nbytes = {name: f.untyped_storage().nbytes() for name, f in flats.items()}

    def free(name):
        flats[name].untyped_storage().resize_(0)
        s.led.release(f"gathered:{name}")

    def gather(name):
        flats[name].untyped_storage().resize_(nbytes[name])
        s.rec.all_gather(flats[name].data, shards[name].detach(), group=s.group)  # .data: no version bump
        s.led.hold(f"gathered:{name}", flats[name], "buffers")

    for name in s.names:
        flats[name].untyped_storage().resize_(0)
    losses = []
    for step, (x, y) in enumerate(batches):
        xl, yl = s.local(x, y)
        inputs, outputs, h = {}, {}, xl
        for name in s.names:  # forward: gather, compute, free (autograd keeps the activations)
            gather(name)
            inputs[name] = h.detach().requires_grad_(h.is_floating_point())
            h = outputs[name] = s.layer_forward(name, s.unflatten(name, flats[name]), inputs[name])
            free(name)
        top = h.detach().requires_grad_(True)
        loss = s.loss_fn(top, yl)
        (dy,) = torch.autograd.grad(loss, top)
        for name in reversed(s.names):  # backward: gather again, backward, reduce-scatter, free
            gather(name)
            wanted = [flats[name]] + ([inputs[name]] if inputs[name].requires_grad else [])
            grads = torch.autograd.grad(outputs.pop(name), wanted, dy)
            free(name)
            s.led.hold(f"grads:{name}", _reduce_scatter_into(s, name, grads[0], shards), "grads")
            dy = grads[1] if len(grads) > 1 else None
        for name in s.names:
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            s.led.release(f"grads:{name}")
        if step == 0:
            s.led.hold("optimizer", sum(optimizer_state_bytes(o) for o in opts.values()), "optimizer")
        losses.append(loss.item())
    result = {}
    for name in s.names:  # for the check only, outside the recorder
        gathered = torch.empty(s.layouts[name].padded, device=s.device, dtype=s.dtype)
        all_gather_into_tensor(gathered, shards[name].detach(), group=s.group)
        result.update({f"{name}.{k}": t for k, t in s.unflatten(name, gathered).items()})
    return result, losses


VARIANTS = {0: ddp, 1: zero1, 2: zero2, 3: zero3}
