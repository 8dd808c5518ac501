"""What a pipeline rank holds: its share of the model's layers (:func:`split_layers`,
:func:`chunk_layers`), and, when no data-parallel strategy serves them, its layers'
parameters and their summed gradients (:class:`LocalParams`), replicated over a
data-parallel group with an optimizer of their own (:class:`ReplicatedParams`)."""

import numpy as np

from ...errors import ConfigError
from ..data_parallel.strategy import charge_update
from .actions import stage_of


def split_layers(model, parts):
    """``model.layers`` cut into ``parts`` contiguous runs of layer names: an ``embed`` layer
    with the first and a ``head`` with the last; the transformer blocks as evenly as they
    go, the extra ones on the inner stages first (the outer stages also hold the embedding
    and the output layer: Llama 3 405B's 126 layers on 16 stages are 7, 8 x 14, 7)."""
    names = [n for n, _ in model.layers]
    first = names[:1] if names and names[0] == "embed" else []
    last = names[-1:] if len(names) > 1 and names[-1] == "head" else []
    middle = names[len(first):len(names) - len(last)]
    if not isinstance(parts, (int, np.integer)) or parts < 1 or parts > len(middle):
        raise ConfigError(f"a pipeline of {parts} stage(s) (p x v) needs at least one block per stage; the model "
                          f"has {len(middle)} ({', '.join(middle[:4])}{', ...' if len(middle) > 4 else ''}). "
                          f"Pick fewer stages or a deeper model")
    base, extra = divmod(len(middle), parts)
    counts = [base] * parts
    order = list(range(1, parts - 1)) + [0, parts - 1] if parts > 2 else list(range(parts))
    for s in order[:extra]:
        counts[s] += 1
    bounds = np.cumsum([0] + counts)
    runs = [middle[bounds[i]:bounds[i + 1]] for i in range(parts)]
    runs[0] = first + runs[0]
    runs[-1] = runs[-1] + last
    return runs


def chunk_layers(model, p, rank, v=1):
    """The layer names of each of pipeline rank ``rank``'s ``v`` chunks: chunk ``c`` is
    virtual stage ``c * p + rank`` of :func:`split_layers`."""
    runs = split_layers(model, p * v)
    return [runs[stage_of(p, rank, c)] for c in range(v)]


class LocalParams:
    """Hooks for a stage that holds its layers' parameters (held in the ledger as
    ``params``) and sums their gradients over micro-batches (``grads``, per layer)."""

    def __init__(self, memory, params_by_layer):
        self.memory, self.params, self.grads = memory, params_by_layer, {}
        memory.hold("params", self.params, "params")

    def params_for_forward(self, name, upcoming):
        return self.params[name]

    def after_forward(self, name):
        pass

    def params_for_backward(self, name, upcoming):
        return self.params[name]

    def grads_ready(self, name, grads, last):
        if name in self.grads:
            for k, g in grads.items():
                self.grads[name][k] += g
        else:
            self.grads[name] = grads
            self.memory.hold(f"grads {name}", grads, "grads")


class ReplicatedParams(LocalParams):
    """:class:`LocalParams` replicated over a data-parallel group ``dp`` (None: not
    replicated), with an optimizer of their own: after the batch, :meth:`step` hands the
    summed gradients (``{"layer.key": array}``) to ``sync(dp, grads)``, which returns them
    averaged over the group (:func:`~.executor.sync_dp_grads`: one flat all-reduce), and
    ``opt`` updates the parameters, its kernels charged on ``comm``'s clock as the
    data-parallel strategies charge theirs (:func:`~emulator.parallel.data_parallel.strategy.charge_update`)."""

    def __init__(self, memory, params_by_layer, opt, dp=None, sync=None, comm=None):
        super().__init__(memory, params_by_layer)
        self.opt, self.dp, self.sync, self.comm = opt, dp, sync, comm
        self.state = opt.init(self.flat_params())
        memory.hold("optimizer", self.state, "optimizer")

    def flat_params(self):
        """The parameters as ``{"layer.key": array}``."""
        return {f"{n}.{k}": v for n, p in self.params.items() for k, v in p.items()}

    def step(self):
        grads = {f"{n}.{k}": g for n, gs in self.grads.items() for k, g in gs.items()}
        if self.dp is not None:
            grads = self.sync(self.dp, grads)
        flat = self.flat_params()
        new, self.state = self.opt.step(flat, {k: g.astype(flat[k].dtype) for k, g in grads.items()}, self.state)
        if self.comm is not None and flat:
            charge_update(self.comm, next(iter(flat.values())).dtype, sum(a.size for a in flat.values()))
        keys = {f"{n}.{k}": (n, k) for n, p in self.params.items() for k in p}
        for key, value in new.items():
            layer, name = keys[key]
            self.params[layer][name] = value
        for name in list(self.grads):
            self.memory.release(f"grads {name}")
        self.grads = {}
