"""What one rank of a pipeline holds and computes: its model chunks, and each micro-batch's
activations from its forward to its backward.

The model is cut into ``p * v`` virtual stages of whole layers (:func:`split_layers`):
the blocks as evenly as they go, the embedding joined to the first and the LM head (with
the loss) to the last, as Megatron does. Chunk ``c`` of pipeline rank ``r`` is virtual
stage ``c * p + r``.

:class:`PipelineStage` computes one action at a time and says where its messages go
(``source``, ``destination``); the loop that receives, computes and sends is
:func:`emulator.parallel.pipeline.executor.run_actions`. Where parameters come from and
where gradients go is the business of its ``hooks``, the same hooks a training step gives
a data-parallel strategy (:mod:`emulator.training`): ``params_for_forward(layer, next)``,
``after_forward(layer)``, ``params_for_backward(layer, next)``, ``grads_ready(layer, grads,
last)``, and ``step()`` once the batch is done (:func:`~.executor.train_step`). So DDP and
ZeRO-1/2/3 run inside a stage, and a run without pipelining is a one-stage pipeline.
Without hooks the stage keeps its layers' parameters and sums their gradients itself
(:class:`LocalParams`).

It keeps the rank's ledger of ``activations`` (:class:`~.activations.ActivationLedger`):
what each layer's forward cached for a micro-batch, from ``F`` until the loop calls
:meth:`PipelineStage.free` once the micro-batch's backward is done; with
``release="layer"`` each layer's as soon as its own backward is done. With
``recompute="full"`` a layer keeps only its input and runs its forward again in backward.

Compute is charged layer by layer from each layer's FLOPs (so a strategy's communication
overlaps the layers still computing), or, with ``costs=(t_f, t_b, t_w)``, as fixed seconds
per whole stage (a chunk's action takes ``1/v`` of it): equal stages, to compare schedules
with their formulas.
"""

import numpy as np

from ... import nn
from ...errors import ConfigError
from ...nn.module import sub
from ...nn.precision import upcast
from ...machine.work import np_dtype
from ..dims import RECOMPUTE
from .actions import destination, source, stage_of
from .activations import ActivationLedger
from .partition import LocalParams, chunk_layers, split_layers  # noqa: F401 -- split_layers also importable from here


class PipelineStage(ActivationLedger):
    """Pipeline rank ``comm.rank`` of ``comm.size``, holding ``v`` chunks of ``model``.

    ``model`` has ``layers`` (a list of ``(name, module)``); optionally ``boundary(shape)``
    (the shape of what one layer hands the next for a micro-batch of token ids of that
    shape), ``loss(out, y)`` and ``loss_backward(cache, scale)`` (default: cross-entropy
    on logits). ``params`` are the model's (full or this rank's; the stage takes its own
    layers'); ``hooks`` replace them (see the module docstring). ``split``: whether the
    schedule has ``W`` actions (then ``B`` computes the input gradient only).
    ``aux_factor``: the auxiliary losses' gradient is scaled by ``scale * aux_factor``
    (context parallelism: the loss is scaled for cp ranks, each auxiliary loss is not)."""

    def __init__(self, comm, model, params=None, v=1, split=False, costs=None, hooks=None, recompute="none",
                 label=None, aux_factor=1.0, release="micro-batch"):
        self.comm, self.model, self.v, self.split = comm, model, v, split
        self.p, self.rank = comm.size, comm.rank
        self.memory = comm.memory
        modules = dict(model.layers)
        self.chunks = [[(n, modules[n]) for n in names] for names in chunk_layers(model, self.p, self.rank, v)]
        self.modules = modules
        self.names = [n for chunk in self.chunks for n, _ in chunk]
        if recompute not in RECOMPUTE:
            raise ConfigError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
        self.recompute = recompute == "full"  # selective and per-op recomputation happen inside the blocks
        self._init_activations(release)
        if hooks is None:
            if params is None:
                raise ConfigError("PipelineStage needs the model's params, or hooks that provide them")
            hooks = LocalParams(self.memory, {n: sub(params, n) for n in self.names})
        self.hooks = hooks
        self.costs = None if costs is None else tuple(float(c) for c in costs)
        if self.costs is not None and (len(self.costs) != 3 or min(self.costs) < 0):
            raise ConfigError(f"costs=(t_f, t_b, t_w) are three non-negative seconds per stage, got {costs!r}")
        self.label = label or (lambda action, layer, what: str(action))
        # mixed precision: 16-bit parameters, and activations handed between layers in 16 bits
        dtype = np.dtype(getattr(model, "handed", getattr(model, "dtype", np.float32)))
        self.act = dtype if dtype.kind == "V" or dtype.itemsize == 2 else None
        self.aux_factor = aux_factor
        self._flops = {}  # (layer, input shape) -> its FLOPs dict: each worked out once
        self.losses = {}
        self.done = []  # the actions computed so far, in order
        self.weights_done = {}  # (chunk, layer) -> micro-batches whose weight gradients are in
        self.micro_batches = None  # set by the loop that runs the schedule

    @property
    def params(self):
        """This stage's parameters by layer (when the stage keeps them itself)."""
        return self.hooks.params

    @property
    def grads(self):
        """This stage's summed gradients by layer (when the stage keeps them itself)."""
        return self.hooks.grads

    @grads.setter
    def grads(self, value):
        self.hooks.grads = value

    # ----------------------------------------------------------------- where messages go
    def virtual_stage(self, chunk):
        return stage_of(self.p, self.rank, chunk)

    def is_first(self, chunk):
        return self.virtual_stage(chunk) == 0

    def is_last(self, chunk):
        return self.virtual_stage(chunk) == self.p * self.v - 1

    def source(self, action):
        """(pipeline rank, chunk) that sends ``action``'s input, or None (first stage's
        forward, last stage's backward, ``W``): :func:`.actions.source`."""
        return source(self.p, self.v, self.rank, action)

    def destination(self, action):
        """(pipeline rank, chunk) that receives ``action``'s output, or None."""
        return destination(self.p, self.v, self.rank, action)

    def boundary(self, micro_x):
        """Shape and dtype of what crosses a stage boundary for one micro-batch."""
        shape = tuple(np.shape(micro_x))
        if hasattr(self.model, "boundary"):
            return self.model.boundary(shape)
        return shape + (self.model.d_model,), np.dtype(self.model.dtype)

    # ----------------------------------------------------------------- compute
    def flops_of(self, name, layer, x):
        key = (name, np.shape(x))
        hit = self._flops.get(key)
        if hit is None:
            hit = self._flops[key] = layer.flops(key[1])
        return hit

    def _charge(self, action, layer, what, flops, share):
        """Compute time of one layer's part of an action: its FLOPs at the device's rate
        (unless the layer charges its own kernels as it runs), or ``share`` of the stage's
        fixed cost."""
        name = self.label(action, layer, what)
        if self.costs is None:
            if not getattr(self.modules[layer], "charges_itself", False):
                self.comm.compute(flops=flops, name=name)
        else:
            t_f, t_b, t_w = self.costs
            t = {"F": t_f, "B": t_b if self.split else t_b + t_w, "W": t_w}[what]
            self.comm.compute(seconds=t * share / self.v, name=name)

    def _upcoming(self, chunk, i, step):
        j = i + step
        return chunk[j][0] if 0 <= j < len(chunk) else None

    def forward(self, action, x, y=None):
        """``F``: run the chunk's layers on ``x``; on the last stage also the loss (mean
        over the micro-batch's tokens, scaled by the caller's ``scale`` in backward).
        Returns the output to send on, or the loss on the last stage."""
        mb, c = action.microbatch, action.chunk
        chunk, saved, h = self.chunks[c], {}, x
        held_before = self.memory.current["activations"]
        for i, (name, layer) in enumerate(chunk):
            p = upcast(self.hooks.params_for_forward(name, self._upcoming(chunk, i, 1)))
            flops = self.flops_of(name, layer, h)["forward"]
            out, cache = layer.forward(p, h)
            if self.act is not None and out is not None and out.dtype != self.act and out.dtype.kind == "f":
                out = out.astype(self.act)
            self._charge(action, name, "F", flops, 1 / len(chunk))
            self.hooks.after_forward(name)
            kept = None if self.recompute else cache
            self._hold_layer(mb, c, name, h if self.recompute else cache)
            saved[name] = (h, kept)
            h = out
        self.saved[(mb, c)] = saved
        self.done.append(action)
        result = h
        if self.is_last(c):
            result, lcache = self._loss(h, y)
            self.losses[mb] = result
            saved["loss"] = self.memory.hold(f"loss {mb}", lcache, "activations")  # the logits' gradient, until B
        self.micro_batch_bytes.setdefault(c, self.memory.current["activations"] - held_before)
        return result

    def _loss(self, out, y):
        if hasattr(self.model, "loss"):
            return self.model.loss(out, y)
        return nn.cross_entropy(out, y)

    def _loss_backward(self, cache, scale):
        if hasattr(self.model, "loss_backward"):
            return self.model.loss_backward(cache, scale)
        return nn.cross_entropy_backward(cache, scale)

    def backward(self, action, dy=None, scale=1.0):
        """``B``: the input gradient through the chunk's layers, from ``dy`` (or from the
        loss on the last stage, times ``scale``); with an unsplit schedule the weight
        gradients too, layer by layer. Returns the gradient to send back (None on the
        first stage)."""
        mb, c = action.microbatch, action.chunk
        saved = self._saved(mb, c)
        if "loss" in saved:
            dy = self._loss_backward(saved.pop("loss"), scale)
            self.memory.release(f"loss {mb}")
        chunk, outs = self.chunks[c], {}
        for i in reversed(range(len(chunk))):
            name, layer = chunk[i]
            raw = self.hooks.params_for_backward(name, self._upcoming(chunk, i, -1))
            p = upcast(raw)
            x, cache = saved[name]
            held = self._held_arrays((x, cache, dy)) if self.split else None  # F's and the output gradient's
            flops = self.flops_of(name, layer, x)
            if cache is None:  # full recomputation: the layer's forward again
                _, cache = layer.forward(p, x)
                if self.costs is None and not getattr(layer, "charges_itself", False):
                    self.comm.compute(flops=flops["forward"], name=self.label(action, name, "F'"))
            nn.scale_aux_loss(cache, scale * self.aux_factor)
            outs[name] = dy
            dx = layer.backward_input(p, cache, dy)
            if self.act is not None and dx is not None and dx.dtype != self.act:
                dx = dx.astype(self.act)
            if self.split:  # W needs the cache, and the parameters the hooks gave (held until then)
                saved[name] = (x, cache, raw)
                self._hold_for_w(mb, c, name, cache, held)
                self._charge(action, name, "B", flops["backward_input"], 1 / len(chunk))
            else:
                grads = layer.backward_weight(p, cache, dy)
                self._charge(action, name, "B", flops["backward_input"] + flops["backward_weight"], 1 / len(chunk))
                self._release_layer(mb, c, name)
                self._grads_ready(mb, c, name, raw, grads)
            dy = dx
        self.done.append(action)
        if self.split:
            self._keep_grad_out(mb, c, outs)
        else:
            self.backward_done.add((mb, c))
        return dy

    def backward_weight(self, action):
        """``W``: the weight gradients of the chunk's layers, from what ``B`` kept."""
        mb, c = action.microbatch, action.chunk
        outs = self._take_grad_out(action)
        saved, chunk = self._saved(mb, c), self.chunks[c]
        for name, layer in reversed(chunk):
            x, cache, raw = saved[name]
            grads = layer.backward_weight(upcast(raw), cache, outs[name])
            self._release_for_w(mb, c, name)
            self._charge(action, name, "W", self.flops_of(name, layer, x)["backward_weight"], 1 / len(chunk))
            self._release_layer(mb, c, name)
            self._grads_ready(mb, c, name, raw, grads)
        self.done.append(action)
        self.backward_done.add((mb, c))

    def _grads_ready(self, mb, c, name, params, grads):
        """Hand a layer's gradients of micro-batch ``mb`` to the hooks, in the precision
        policy's gradient dtype (else the parameters': bf16 gradients for bf16 parameters);
        ``last`` once every micro-batch's are in (DDP reduces only then)."""
        policy = self.comm.precision
        if policy is not None and policy.grads is not None:  # the policy's gradients (Megatron's fp32 main_grad)
            dtype = np_dtype(policy.grads)
            grads = {k: g.astype(dtype, copy=False) for k, g in grads.items()}
        else:
            grads = {k: g.astype(params[k].dtype, copy=False) for k, g in grads.items()}
        done = self.weights_done.setdefault((c, name), set())
        done.add(mb)
        last = len(done) == self.micro_batches
        if last:
            del self.weights_done[(c, name)]
        self.hooks.grads_ready(name, grads, last)

    def flat_params(self):
        """This stage's parameters as ``{"layer.key": array}``."""
        return {f"{n}.{k}": v for n, p in self.params.items() for k, v in p.items()}
