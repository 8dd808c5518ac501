"""The protocol every layer follows, and the composition rule.

A module keeps no state: parameters live in a flat ``dict[str, ndarray]`` (keys like
``"attn.q.w"``), and ``forward`` returns ``(y, cache)`` where the cache holds what the
backward pass needs for *this* call. So many micro-batches can be in flight at once,
each with its own cache, as pipeline schedules need.

Backward is split the way zero-bubble pipelines need it:

* ``backward_input(params, cache, dy) -> dx`` ("B"): what the previous stage waits for;
* ``backward_weight(params, cache, dy) -> grads`` ("W"): may run later.

A composite module's B stores the output gradient of each child in its cache
(``cache["dys"]``), so its W only does the weight-gradient matmuls; if W is called
without B first, it runs B itself. B then W gives exactly what ``backward`` gives.

Every module reports its FLOPs for an input shape, ``flops(shape)`` -> ``{"forward",
"backward_input", "backward_weight"}``: matrix multiplications only (2 per multiply-add),
as the 6ND rule and MFU count them; elementwise work (norms, GELU, softmax) is left out.
``cache_bytes(cache)`` lists what a forward cached for backward, tensor by tensor.
"""

import numpy as np

from ..errors import ConfigError
from ..records.memory import is_array, memory_key

NO_FLOPS = {"forward": 0, "backward_input": 0, "backward_weight": 0}


def sub(params, prefix):
    """The entries of ``params`` under ``prefix.``, with the prefix removed."""
    p = prefix + "."
    return {k[len(p):]: v for k, v in params.items() if k.startswith(p)}


def prefixed(prefix, d):
    return {f"{prefix}.{k}": v for k, v in d.items()}


def check_last_dim(name, x, d):
    x = np.asarray(x)
    if x.ndim < 1 or x.shape[-1] != d:
        raise ConfigError(f"{name}: expected an input whose last dim is {d}, got shape {x.shape}")


def check_ndim(name, x, ndim, layout):
    if np.asarray(x).ndim != ndim:
        raise ConfigError(f"{name}: expected a {ndim}-d input {layout}, got shape {np.asarray(x).shape}")


def check_heads(name, d_model, n_heads):
    if n_heads < 1 or d_model % n_heads:
        raise ConfigError(f"{name}: d_model ({d_model}) must be divisible by n_heads ({n_heads})")


def check_kv_heads(name, n_heads, n_kv_heads):
    if isinstance(n_kv_heads, bool) or not isinstance(n_kv_heads, (int, np.integer)) or n_kv_heads < 1 \
            or n_heads % n_kv_heads:
        raise ConfigError(f"{name}: n_kv_heads ({n_kv_heads!r}) must be a positive divisor of n_heads ({n_heads}): "
                          f"each K/V head serves a group of n_heads / n_kv_heads query heads")


def add_flops(*parts):
    """The sum of several modules' FLOPs dicts."""
    return {k: sum(p[k] for p in parts) for k in NO_FLOPS}


def total_flops(f):
    """Forward plus backward (B and W)."""
    return sum(f.values())


def cache_bytes(cache, prefix=""):
    """Bytes a forward cached for backward, by tensor: ``{"attn.core.p": nbytes, ...}``.
    A tensor cached twice (the same memory under two names, e.g. the input shared by the
    q, k and v projections) is counted once, under its first name."""
    out, seen = {}, set()

    def walk(obj, path):
        if isinstance(obj, dict):
            for k, v in obj.items():
                if k != "dys":
                    walk(v, f"{path}.{k}" if path else str(k))
        elif is_array(obj):
            key = memory_key(obj)
            if key not in seen:
                seen.add(key)
                out[path] = obj.nbytes

    walk(cache, prefix)
    return out


class Module:
    """Base class: subclasses define ``init``, ``forward``, ``backward_input`` and, if they
    have parameters, ``backward_weight``."""

    dtype = np.float32

    def init(self, rng):
        return {}

    def forward(self, params, x):
        raise NotImplementedError

    def backward_input(self, params, cache, dy):
        raise NotImplementedError

    def backward_weight(self, params, cache, dy):
        return {}

    def backward(self, params, cache, dy):
        dx = self.backward_input(params, cache, dy)
        return dx, self.backward_weight(params, cache, dy)

    def flops(self, shape):
        """FLOPs for an input of ``shape`` (see the module docstring); none by default."""
        return dict(NO_FLOPS)


class Composite(Module):
    """A module made of named children. Subclasses list ``children()`` and write
    ``forward`` and ``backward_input``; the latter records each child's output gradient
    with ``self._remember(cache, name, dy)``."""

    def children(self):
        raise NotImplementedError

    def init(self, rng):
        params = {}
        for name, child in self.children():
            params.update(prefixed(name, child.init(rng)))
        return params

    @staticmethod
    def _remember(cache, name, dy):
        cache.setdefault("dys", {})[name] = dy

    def backward_weight(self, params, cache, dy):
        if "dys" not in cache:
            self.backward_input(params, cache, dy)
        grads = {}
        for name, child in self.children():
            if name in cache["dys"]:
                g = child.backward_weight(sub(params, name), cache[name], cache["dys"][name])
                grads.update(prefixed(name, g))
        del cache["dys"]
        return grads
