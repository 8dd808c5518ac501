"""Where a parameter lives on the mesh, as DTensor's placements say it.

A :class:`Placement` lists the mesh axes a parameter is sharded over, each along one of its
dims (``Shard(dim)`` on that axis), and is replicated over every other axis; ``partial``
names the axes over which its *gradient* is a partial sum (DTensor's ``Partial``): a norm's
weight under sequence parallelism sees only this rank's slice of the sequence, so its
gradient must also be summed over ``tp``. Everything else follows from placements, never
from parameter names:

* :func:`shard` cuts full parameters into one rank's (``coords``: its index along each
  axis, ``sizes``: the axes' sizes); :func:`unshard` puts every rank's back together;
* the group a gradient is reduced over (:meth:`emulator.parallel.mesh_model.RankModel.grad_group`)
  and the global gradient norm count each parameter once
  (:func:`emulator.parallel.runtime.global_grad_norm`).

The axes are the mesh's (``tp``) and ``ep``, the expert-parallel index a rank has inside
``dp x cp`` (see :mod:`emulator.parallel.dims`).
"""

from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError


@dataclass(frozen=True)
class Placement:
    shards: tuple = ()  # ((axis, dim), ...): sharded over ``axis`` along ``dim``, in equal contiguous blocks
    partial: tuple = ()  # axes over which the gradient is a partial sum

    def dim_of(self, axis):
        """The dim sharded over ``axis``, or None (replicated over it)."""
        return dict(self.shards).get(axis)

    def local(self, full, coords, sizes):
        """This rank's block of the full array ``full`` (a copy)."""
        for axis, dim in self.shards:
            if full.shape[dim] % sizes[axis]:
                raise ConfigError(f"a dim of {full.shape[dim]} does not split over {axis}={sizes[axis]}")
        return full[self.index(full.shape, coords, sizes)].copy()

    def index(self, full_shape, coords, sizes):
        """The slices of the full array this rank's block covers."""
        index = [slice(0, n) for n in full_shape]
        shape = list(full_shape)
        for axis, dim in self.shards:
            b = shape[dim] // sizes[axis]
            start = index[dim].start + coords[axis] * b
            index[dim] = slice(start, start + b)
            shape[dim] = b
        return tuple(index)

    def full_shape(self, local_shape, sizes):
        shape = list(local_shape)
        for axis, dim in self.shards:
            shape[dim] *= sizes[axis]
        return tuple(shape)


REPLICATED = Placement()


def shard(full, placements, coords, sizes):
    """One rank's parameters: ``placements[key]`` applied to ``full[key]`` for every key of
    ``placements`` (missing placements are refused: every parameter says where it lives)."""
    missing = sorted(set(placements) - set(full))
    if missing:
        raise ConfigError(f"shard: no full parameter for {missing}")
    return {k: pl.local(full[k], coords, sizes) for k, pl in placements.items()}


def unshard(per_rank, placements, coords, sizes, check_replicas=True):
    """The full parameters from every rank's (``per_rank[r]``: rank r's dict, ``coords[r]``
    its coordinates, ``placements[r]``: its placements). Each rank's block is written at
    its place; copies that should be equal (replicas) are checked to be, so a gradient
    that was not reduced (replicas that drifted apart) is caught, naming the ranks."""
    full, owner = {}, {}
    for r, params in enumerate(per_rank):
        for k, v in params.items():
            pl = placements[r][k]
            if k not in full:
                full[k] = np.empty(pl.full_shape(v.shape, sizes), v.dtype)
                owner[k] = {}
            idx = pl.index(full[k].shape, coords[r], sizes)
            key = tuple((s.start, s.stop) for s in idx)
            if key in owner[k]:
                first = owner[k][key]
                if check_replicas and not np.array_equal(full[k][idx], v):
                    diff = float(np.max(np.abs(full[k][idx].astype(np.float64) - v.astype(np.float64))))
                    raise ConfigError(f"unshard: ranks {first} and {r} hold different copies of {k!r} (largest "
                                      f"difference {diff:.3g}); replicas must stay equal: is a gradient reduction "
                                      f"missing?")
            else:
                owner[k][key] = r
                full[k][idx] = v
    for k, blocks in owner.items():
        covered = sum(int(np.prod([b - a for a, b in key])) for key in blocks)
        if covered != full[k].size:
            raise ConfigError(f"unshard: the ranks' blocks cover {covered} of the {full[k].size} values of {k!r}")
    return full
