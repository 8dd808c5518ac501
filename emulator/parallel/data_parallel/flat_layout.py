"""The flat layout of a layer's parameters: how ZeRO and FSDP cut a layer into shards, and
the library's one flatten-reduce-unflatten.

A layer's parameters (a dict of arrays) are laid end to end in sorted name order as one
flat vector of ``size`` elements, padded with zeros to ``padded``, a multiple of the
group size n, so that rank r owns the r-th of n equal slices. Padding is why a layer of
1001 parameters on 4 ranks moves 1004 elements: 251 per rank.

:func:`reduce_flat` lays a dict's tensors end to end in one buffer, all-reduces it in one
call (many small tensors pay one call's latency, not one each: DDP's bucket, Megatron's
``_allreduce_layernorm_grads``) and hands back views of the result. The pipeline's
data-parallel average and sequence parallelism's partial gradients use it.
"""

from dataclasses import dataclass

import numpy as np

from ...nn.module import sub


@dataclass
class FlatLayout:
    """A layer's parameters as one flat vector of ``padded`` elements (a multiple of n)."""

    names: list
    shapes: list
    offsets: list
    size: int
    padded: int

    @classmethod
    def of(cls, params, n, names=None):
        """The layout of ``params`` padded for n ranks; ``names``: the keys laid out, in
        that order (default: every key, sorted)."""
        names = sorted(params) if names is None else list(names)
        shapes = [params[k].shape for k in names]
        sizes = [int(np.prod(s)) for s in shapes]
        offsets = [int(o) for o in np.cumsum([0] + sizes[:-1])]
        size = sum(sizes)
        return cls(names, shapes, offsets, size, -(-size // n) * n)

    def flatten(self, params, dtype=None):
        first = params[self.names[0]]
        flat = np.zeros_like(first, shape=(self.padded,), dtype=dtype or first.dtype)
        for k, off, shape in zip(self.names, self.offsets, self.shapes):
            flat[off:off + int(np.prod(shape))] = params[k].reshape(-1)
        return flat

    def unflatten(self, flat):
        """The dict of tensors, as views of ``flat`` (the padding dropped)."""
        return {k: flat[off:off + int(np.prod(shape))].reshape(shape)
                for k, off, shape in zip(self.names, self.offsets, self.shapes)}

    def shard(self, flat, rank, n):
        """Rank ``rank``'s slice of ``flat`` (a copy)."""
        s = self.padded // n
        return flat[rank * s:(rank + 1) * s].copy()


def layouts(model, params, n):
    """A :class:`FlatLayout` per layer of ``model.layers``, padded for n ranks."""
    return {name: FlatLayout.of(sub(params, name), n) for name, _ in model.layers}


def reduce_flat(comm, arrays, keys=None, op="sum"):
    """``arrays`` ({key: array}) with those of ``keys`` (default: every key, sorted) reduced
    over the group ``comm`` by ``op``: laid end to end in that order in one buffer of their
    common dtype (NumPy's promotion, as ``np.concatenate``), one ``all_reduce``, each
    result a view of the reduced buffer. The other arrays pass through as they are; with
    nothing to reduce there is no call."""
    keys = sorted(arrays) if keys is None else list(keys)
    if not keys:
        return dict(arrays)
    layout = FlatLayout.of(arrays, 1, keys)
    flat = layout.flatten(arrays, dtype=np.result_type(*(arrays[k].dtype for k in keys)))
    return {**arrays, **layout.unflatten(comm.all_reduce(flat, op=op))}
