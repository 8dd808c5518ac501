"""Megatron's ``finalize_model_grads`` on a mesh (``megatron/core/distributed/
finalize_model_grads.py``): the pipeline stage's hooks, where each layer's parameters come
from and where its gradients go, by the group they are reduced over.

A layer's parameters are split into *units* by their placements: the dense ones (attention,
norms, the router, dense MLPs), reduced over the ``dp x cp`` ranks, and the experts (sharded
over ``ep``), reduced over the ranks that hold the same experts (``edp``). Each group gets
one data-parallel strategy (DDP or ZeRO-1/2/3, summing: the loss is already scaled for the
group) over its units; the gradients that are partial sums over ``tp`` (sequence
parallelism's norms and row-parallel biases) are summed over ``tp`` first, in one
:func:`~.flat_layout.reduce_flat` per layer. The step then reduces, measures the global
norm (every parameter counted once), and applies.
"""

import numpy as np

from ...mesh import DP_CP, REDUCED_OVER, TP_PP
from ...nn.clip import clip_coefficient
from .flat_layout import reduce_flat
from .ladder import strategy_for


class _Units:
    """What a data-parallel strategy needs of a model: ``layers``, the units in order."""

    def __init__(self, names):
        self.layers = [(n, None) for n in names]


class MeshHooks:
    """The stage's hooks on a mesh: each layer's parameters split by the group their
    gradients are reduced over, one strategy per group."""

    def __init__(self, comms, layer_names, params, placements, dims, opt, tp, clip_grad_norm=None):
        self.tp, self.placements = tp, placements
        self.comms, self.clip_grad_norm = comms, clip_grad_norm
        self.parts = {}  # layer -> [(group, unit, keys)]
        units = {"dense": [], "experts": []}
        flat = {"dense": {}, "experts": {}}
        for layer in layer_names:
            mine = {k[len(layer) + 1:]: v for k, v in params.items() if k.startswith(layer + ".")}
            split = {"dense": [], "experts": []}
            for key in sorted(mine):
                split["experts" if placements[f"{layer}.{key}"].dim_of("ep") is not None else "dense"].append(key)
            self.parts[layer] = []
            for group, keys in split.items():
                if keys:
                    unit = f"{layer}:{group}"
                    units[group].append(unit)
                    flat[group].update({f"{unit}.{k}": mine[k] for k in keys})
                    self.parts[layer].append((group, unit, keys))
        self.strategies = {}
        for group, names in units.items():
            if names:
                comm = comms[REDUCED_OVER[group]]
                self.strategies[group] = strategy_for(comm.stack, dims.zero_stage, comm, _Units(names), flat[group],
                                                      opt, comms["pp"].rank, label=group,
                                                      pipelined=comms["pp"].size > 1)
        self.partial = {layer: sorted(k[len(layer) + 1:] for k, pl in placements.items()
                                      if k.startswith(layer + ".") and "tp" in pl.partial) for layer in layer_names}

    def _units_of(self, layer):
        return self.parts.get(layer, [])

    def _next_unit(self, group, upcoming):
        return next((u for g, u, _ in self._units_of(upcoming) if g == group), None) if upcoming else None

    def _gather(self, layer, upcoming, hook):
        out = {}
        for group, unit, _ in self._units_of(layer):
            out.update(getattr(self.strategies[group], hook)(unit, self._next_unit(group, upcoming)))
        return out

    # ----------------------------------------------------------------- the stage's hooks
    def params_for_forward(self, layer, upcoming):
        return self._gather(layer, upcoming, "params_for_forward")

    def after_forward(self, layer):
        for group, unit, _ in self._units_of(layer):
            self.strategies[group].after_forward(unit)

    def params_for_backward(self, layer, upcoming):
        return self._gather(layer, upcoming, "params_for_backward")

    def grads_ready(self, layer, grads, last):
        if self.partial[layer] and self.tp.size > 1:  # partial sums over tp (sequence parallelism): add them up
            grads = reduce_flat(self.tp, grads, self.partial[layer])
        for group, unit, keys in self._units_of(layer):
            self.strategies[group].grads_ready(unit, {k: grads[k] for k in keys}, last)

    # ----------------------------------------------------------------- the step
    def step(self):
        """After the batch: reduce, clip by the global norm (when the run clips; the squares
        summed over the model-parallel ranks, then the data-parallel ones), apply."""
        self.reduce_grads()
        scale = 1.0
        if self.clip_grad_norm is not None:
            squares = self.comms[TP_PP].all_reduce(np.array([self.sum_of_squares()]))
            norm = float(np.sqrt(self.comms[DP_CP].all_reduce(squares)[0]))
            scale = clip_coefficient(norm, self.clip_grad_norm)
        self.apply(scale)

    def reduce_grads(self):
        for s in self.strategies.values():
            s.reduce_grads()

    def sum_of_squares(self):
        """This rank's share of the squared global gradient norm: each reduced gradient it
        holds, weighted by one over the number of ranks holding the same values."""
        total = 0.0
        for s in self.strategies.values():
            pieces, copies = s.owned_grads()
            for unit, key, g in pieces:
                layer = unit.split(":")[0]
                pl = self.placements[f"{layer}.{key}"]
                tp_copies = 1 if pl.dim_of("tp") is not None else self.tp.size
                total += float(np.sum(np.square(g.astype(np.float64)))) / (copies * tp_copies)
        return total

    def apply(self, grad_scale=1.0):
        for s in self.strategies.values():
            s.apply(grad_scale)

    def local_params(self):
        """{"layer.key": this rank's array}, or None where ZeRO-3 holds only a slice:
        then (group, unit, flat slice) so the global view can assemble them."""
        out, slices = {}, []
        for group, s in self.strategies.items():
            if s.full is not None and not getattr(s, "stale", False):
                for unit, p in s.full.items():
                    out.update({f"{unit.split(':')[0]}.{k}": v for k, v in p.items()})
            else:
                slices += [(group, unit, s.layouts[unit], s.comm.ranks, s.my[unit]) for unit in s.names]
        return out, slices
