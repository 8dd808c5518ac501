"""What a pipeline rank holds: its share of the model's layers (:func:`split_layers`), and,
when no data-parallel strategy serves them, its layers' parameters and their summed
gradients (:class:`LocalParams`)."""

import numpy as np

from ...errors import ConfigError


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
