"""What one rank of a pipeline holds and computes: its model chunks, and each micro-batch's
activations from its forward to its backward.

The model is cut into ``p * v`` virtual stages of whole layers (:func:`split_layers`):
the blocks evenly, the embedding joined to the first and the LM head (with the loss) to
the last, as Megatron does. Chunk ``c`` of pipeline rank ``r`` is virtual stage
``c * p + r``.

:class:`PipelineStage` computes one action at a time and says where its messages go
(``source``, ``destination``); the loop that receives, computes and sends is
:func:`emulator.parallel.pipeline.executor.run_actions`. It keeps the rank's ledger:

* ``activations``: everything a chunk's forward cached for a micro-batch, held from ``F``
  until the loop calls :meth:`PipelineStage.free` once its backward is done (``B``, or
  ``W`` when the backward is split: the weight gradient needs the layers' inputs; the
  output gradients ``B`` keeps for ``W`` are held too, under ``grad-out``);
* ``params`` and ``grads`` of its own layers only.

Compute is charged from each layer's FLOPs, or, with ``costs=(t_f, t_b, t_w)``, as fixed
seconds per whole stage (a chunk's action takes ``1/v`` of it): equal stages, to compare
schedules with their formulas.
"""

import numpy as np

from ... import nn
from ...errors import ConfigError
from ...nn.module import sub
from ...training import upcast
from .actions import place_of, stage_of


def split_layers(model, parts):
    """``model.layers`` cut into ``parts`` contiguous runs of layer names: transformer
    blocks evenly (their number must divide), an ``embed`` layer with the first and a
    ``head`` with the last; a model without them has its layers split evenly."""
    names = [n for n, _ in model.layers]
    first = names[:1] if names and names[0] == "embed" else []
    last = names[-1:] if len(names) > 1 and names[-1] == "head" else []
    middle = names[len(first):len(names) - len(last)]
    if not isinstance(parts, int) or parts < 1 or len(middle) % parts or not middle:
        raise ConfigError(f"a pipeline of {parts} stage(s) (p x v) needs a number of blocks it divides; the model "
                          f"has {len(middle)} ({', '.join(middle[:4])}{', ...' if len(middle) > 4 else ''}). "
                          f"Pick a model with a multiple of {parts} layers, or fewer stages")
    k = len(middle) // parts
    runs = [middle[i * k:(i + 1) * k] for i in range(parts)]
    runs[0] = first + runs[0]
    runs[-1] = runs[-1] + last
    return runs


class PipelineStage:
    """Pipeline rank ``comm.rank`` of ``comm.size``, holding ``v`` chunks of ``model``.

    ``params`` are the full model's (every rank starts from the same); the stage keeps
    its layers' only. ``micro_x``, ``micro_y``: the micro-batches' inputs and targets (the
    first stage reads the inputs, the last the targets). ``split``: whether the schedule
    has ``W`` actions (then ``B`` computes the input gradient only)."""

    def __init__(self, comm, model, params, v=1, split=False, costs=None):
        self.comm, self.model, self.v, self.split = comm, model, v, split
        self.p, self.rank = comm.size, comm.rank
        self.memory = comm.memory
        runs = split_layers(model, self.p * v)
        modules = dict(model.layers)
        self.chunks = [[(n, modules[n]) for n in runs[stage_of(self.p, self.rank, c)]] for c in range(v)]
        self.params = {n: sub(params, n) for chunk in self.chunks for n, _ in chunk}
        self.memory.hold("params", self.params, "params")
        self.grads = {}
        self.costs = None if costs is None else tuple(float(c) for c in costs)
        if self.costs is not None and (len(self.costs) != 3 or min(self.costs) < 0):
            raise ConfigError(f"costs=(t_f, t_b, t_w) are three non-negative seconds per stage, got {costs!r}")
        self.saved = {}  # (mb, chunk) -> (inputs per layer, caches per layer)
        self.grad_out = {}  # (mb, chunk) -> output gradient per layer, kept from B for W
        self.losses = {}
        self.backward_done = set()  # (mb, chunk) whose weight gradients are in, activations not yet freed
        self.done = []  # the actions computed so far, in order

    # ----------------------------------------------------------------- where messages go
    def virtual_stage(self, chunk):
        return stage_of(self.p, self.rank, chunk)

    def is_first(self, chunk):
        return self.virtual_stage(chunk) == 0

    def is_last(self, chunk):
        return self.virtual_stage(chunk) == self.p * self.v - 1

    def source(self, action):
        """(pipeline rank, chunk) that sends ``action``'s input, or None (first stage's
        forward, last stage's backward, ``W``)."""
        s = self.virtual_stage(action.chunk)
        if action.kind == "F" and s > 0:
            return place_of(self.p, s - 1)
        if action.kind == "B" and s < self.p * self.v - 1:
            return place_of(self.p, s + 1)
        return None

    def destination(self, action):
        """(pipeline rank, chunk) that receives ``action``'s output, or None."""
        s = self.virtual_stage(action.chunk)
        if action.kind == "F" and s < self.p * self.v - 1:
            return place_of(self.p, s + 1)
        if action.kind == "B" and s > 0:
            return place_of(self.p, s - 1)
        return None

    def boundary(self, micro_x):
        """Shape and dtype of what crosses a stage boundary for one micro-batch."""
        return tuple(np.shape(micro_x)) + (self.model.d_model,), np.dtype(self.model.dtype)

    # ----------------------------------------------------------------- compute
    def _charge(self, kind, chunk, flops):
        """Compute time of an action: ``flops()`` at the device's peak, or the fixed costs."""
        if self.costs is None:
            self.comm.compute(flops=flops(), name=kind)
        else:
            t_f, t_b, t_w = self.costs
            t = {"F": t_f, "B": t_b if self.split else t_b + t_w, "W": t_w}[kind[0]]
            self.comm.compute(seconds=t / self.v, name=kind)

    def forward(self, action, x, y=None):
        """``F``: run the chunk's layers on ``x``; on the last stage also the loss (mean
        over the micro-batch's tokens, scaled by ``1/m`` by the caller's ``scale``).
        Returns the output to send on, or the loss on the last stage."""
        mb, c = action.microbatch, action.chunk
        inputs, caches, h = [], [], x
        for name, layer in self.chunks[c]:
            inputs.append(h)
            h, cache = layer.forward(upcast(self.params[name]), h)
            caches.append(cache)
        self._charge(str(action), c, lambda: sum(layer.flops(np.shape(h_in))["forward"]
                                                 for (_, layer), h_in in zip(self.chunks[c], inputs)))
        self.memory.hold(f"act {mb}.{c}", caches, "activations")
        self.saved[(mb, c)] = (inputs, caches)
        self.done.append(action)
        if not self.is_last(c):
            return h
        loss, lcache = nn.cross_entropy(h, y)
        self.losses[mb] = loss
        self.saved[(mb, c)] += (lcache,)
        return loss

    def backward(self, action, dy=None, scale=1.0):
        """``B``: the input gradient through the chunk's layers, from ``dy`` (or from the
        loss on the last stage, times ``scale``); with an unsplit schedule the weight
        gradients too. Returns the gradient to send back (None on the first stage)."""
        mb, c = action.microbatch, action.chunk
        inputs, caches, *loss = self._saved(mb, c)
        if loss:
            dy = nn.cross_entropy_backward(loss[0], scale)
        outs = [None] * len(caches)
        for i in reversed(range(len(caches))):
            name, layer = self.chunks[c][i]
            outs[i] = dy
            dy = layer.backward_input(upcast(self.params[name]), caches[i], dy)
        kinds = ("backward_input",) if self.split else ("backward_input", "backward_weight")
        self._charge(str(action), c, lambda: self._flops(c, inputs, kinds))
        self.done.append(action)
        if self.split:
            self.grad_out[(mb, c)] = outs
            self.memory.hold(f"grad-out {mb}.{c}", outs, "activations")
        else:
            self._weights(mb, c, outs)
        return dy

    def backward_weight(self, action):
        """``W``: the weight gradients of the chunk's layers, from what ``B`` kept."""
        mb, c = action.microbatch, action.chunk
        if (mb, c) not in self.grad_out:
            raise ConfigError(f"rank {self.comm.global_rank}: {action} before B{mb}{'.' + str(c) if c else ''}: the "
                              f"weight gradient needs the output gradients that B computes")
        outs = self.grad_out.pop((mb, c))
        self.memory.release(f"grad-out {mb}.{c}")
        inputs = self._saved(mb, c)[0]
        self._charge(str(action), c, lambda: self._flops(c, inputs, ("backward_weight",)))
        self.done.append(action)
        self._weights(mb, c, outs)

    def _flops(self, c, inputs, kinds):
        return sum(layer.flops(np.shape(x))[k] for (_, layer), x in zip(self.chunks[c], inputs) for k in kinds)

    def _weights(self, mb, c, outs):
        _, caches, *_ = self._saved(mb, c)
        for (name, layer), cache, dy in zip(self.chunks[c], caches, outs):
            g = layer.backward_weight(upcast(self.params[name]), cache, dy)
            if name in self.grads:
                for k, v in g.items():
                    self.grads[name][k] += v
            else:
                self.grads[name] = g
                self.memory.hold(f"grads {name}", g, "grads")
        self.backward_done.add((mb, c))

    def _saved(self, mb, c):
        if (mb, c) not in self.saved:
            raise ConfigError(f"rank {self.comm.global_rank}: the activations of micro-batch {mb} on chunk {c} are "
                              f"gone: their forward has not run, or they were freed before their backward")
        return self.saved[(mb, c)]

    def finishes_backward(self, action):
        """Whether ``action`` is the last one that needs its micro-batch's activations:
        ``B`` in a schedule without ``W``, else ``W``."""
        return action.kind == ("W" if self.split else "B")

    def free(self, action):
        """Release the activations of ``action``'s micro-batch and chunk (after the
        action that :meth:`finishes_backward`)."""
        mb, c = action.microbatch, action.chunk
        if (mb, c) not in self.backward_done:
            raise ConfigError(f"rank {self.comm.global_rank}: free({action}) before the backward of micro-batch {mb} "
                              f"on chunk {c} is done; its {'W' if self.split else 'B'} still needs the activations")
        self.backward_done.discard((mb, c))
        del self.saved[(mb, c)]
        self.memory.release(f"act {mb}.{c}")

    def flat_params(self):
        """This stage's parameters as ``{"layer.key": array}``."""
        return {f"{n}.{k}": v for n, p in self.params.items() for k, v in p.items()}
