"""What a rank of the mesh runtime holds, as pieces of global tensors, and how to put a
checkpoint's pieces back into a rank of another mesh.

A **piece** is a block of one global tensor: its fully qualified name (``model.blocks.0.
attn.q.w``, ``optim.m.blocks.0.attn.q.w``, ``optim.v...``, ``optim.master...``), the
tensor's global shape and dtype, the block's offsets and sizes, and the data. What a rank
holds follows from its strategies (:class:`~emulator.parallel.runtime.MeshHooks`: one
data-parallel strategy per gradient group) and the placements:

* whole local tensors (DDP's and ZeRO-1/2's parameters, DDP's moments): one block each,
  where the placement puts this rank's shard (``Placement.index``);
* ZeRO's flat slices (ZeRO-1/2/3's moments and master weights, ZeRO-3's parameters): the
  layer's local tensors laid end to end (:class:`~emulator.parallel.data_parallel.flat_layout.FlatLayout`),
  this rank's range of that vector cut back into each tensor's elements, each range into
  blocks (:func:`~emulator.parallel.reshard.flat_range_blocks`), each block moved to its
  place in the global tensor by the placement.

Loading is the same walk the other way: each block this rank needs is read from the saved
chunks that overlap it (``read(fqn, offsets, sizes)``), whatever mesh saved them.
"""

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError
from ..reshard import flat_range_blocks

STATE = ("m", "v", "master")  # AdamW's per-parameter state (master: mixed precision only)


@dataclass
class Piece:
    fqn: str
    shape: tuple  # the global tensor's
    dtype: object
    offsets: tuple
    sizes: tuple
    data: np.ndarray

    @property
    def nbytes(self):
        return int(self.data.nbytes)


def _block_start(placement, local_shape, coords, sizes):
    full = placement.full_shape(local_shape, sizes)
    return full, tuple(s.start for s in placement.index(full, coords, sizes))


def _whole(fqn, name, arr, placements, coords, sizes):
    full, start = _block_start(placements[name], arr.shape, coords, sizes)
    return Piece(fqn, full, arr.dtype, start, tuple(arr.shape), arr)


def _slice_ranges(layout, rank, n):
    """For this rank's slice of a layer's flat vector: (key, local shape, first and last
    element of the key's tensor it covers, where that range sits in the slice)."""
    size = layout.padded // n
    lo, hi = rank * size, (rank + 1) * size
    for key, off, shape in zip(layout.names, layout.offsets, layout.shapes):
        a, b = max(lo, off), min(hi, off + int(np.prod(shape)))
        if a < b:
            yield key, tuple(shape), a - off, b - off, a - lo


def _flat(prefix, layer, layout, rank, n, flat, placements, coords, sizes):
    for key, shape, a, b, at in _slice_ranges(layout, rank, n):
        name = f"{layer}.{key}"
        full, start = _block_start(placements[name], shape, coords, sizes)
        for block in flat_range_blocks(shape, a, b):
            count = int(np.prod(block.sizes))
            data = flat[at:at + count].reshape(block.sizes)
            yield Piece(f"{prefix}.{name}", full, flat.dtype, tuple(s + o for s, o in zip(start, block.offsets)),
                        tuple(block.sizes), data)
            at += count


def _units(hooks):
    """(strategy, unit, layer) for every unit of every strategy of the rank."""
    for s in hooks.strategies.values():
        for unit in s.names:
            yield s, unit, unit.split(":")[0]


def _per_unit_state(s):
    """DDP keeps one optimizer state for all its units ({"t", "m": {"unit.key": ...}});
    ZeRO one per unit ({unit: {"t", "m": {"flat": ...}}})."""
    return "t" not in s.state


def rank_pieces(hooks, placements, coords, sizes):
    """Every piece this rank holds (parameters and optimizer state) and the optimizer's
    step count."""
    pieces, steps = [], set()
    for s, unit, layer in _units(hooks):
        layout, r, n = s.layouts[unit], s.comm.rank, s.comm.size
        if s.full is not None and not getattr(s, "stale", False):  # (a distributed optimizer's are in its slices)
            pieces += [_whole(f"model.{layer}.{k}", f"{layer}.{k}", s.full[unit][k], placements, coords, sizes)
                       for k in layout.names]
        else:
            pieces += _flat("model", layer, layout, r, n, s.my[unit], placements, coords, sizes)
        if _per_unit_state(s):
            state = s.state[unit]
            steps.add(state["t"])
            for kind in STATE:
                if kind in state:
                    pieces += _flat(f"optim.{kind}", layer, layout, r, n, state[kind]["flat"], placements, coords,
                                    sizes)
        else:
            steps.add(s.state["t"])
            for kind in STATE:
                if kind in s.state:
                    pieces += [_whole(f"optim.{kind}.{layer}.{k}", f"{layer}.{k}", s.state[kind][f"{unit}.{k}"],
                                      placements, coords, sizes) for k in layout.names]
    if len(steps) > 1:
        raise ConfigError(f"the optimizer's units have taken different numbers of steps {sorted(steps)}")
    return pieces, (steps.pop() if steps else 0)


def load_params(read, placements, coords, sizes, shapes):
    """This rank's parameters, read block by block: ``shapes[name]`` is each parameter's
    global shape; ``read(fqn, offsets, sizes)`` returns a block of a saved tensor."""
    out = {}
    for name, pl in placements.items():
        idx = pl.index(shapes[name], coords, sizes)
        out[name] = read(f"model.{name}", tuple(s.start for s in idx), tuple(s.stop - s.start for s in idx))
    return out


def _read_flat(read, prefix, layer, layout, rank, n, dtype, placements, coords, sizes):
    out = np.zeros(layout.padded // n, dtype=dtype)
    for key, shape, a, b, at in _slice_ranges(layout, rank, n):
        name = f"{layer}.{key}"
        _, start = _block_start(placements[name], shape, coords, sizes)
        for block in flat_range_blocks(shape, a, b):
            count = int(np.prod(block.sizes))
            out[at:at + count] = read(f"{prefix}.{name}", tuple(s + o for s, o in zip(start, block.offsets)),
                                      block.sizes).reshape(-1)
            at += count
    return out


def load_optimizer(read, hooks, placements, coords, sizes, step, kinds=STATE):
    """Fill this rank's optimizer state (freshly made by its strategies) from the saved
    moments (and master weights), in place; set its step count to ``step``. ``kinds``:
    the state the save holds (a state it lacks keeps its fresh values)."""
    for s, unit, layer in _units(hooks):
        layout, r, n = s.layouts[unit], s.comm.rank, s.comm.size
        if _per_unit_state(s):
            state = s.state[unit]
            for kind in kinds:
                if kind in state:
                    flat = state[kind]["flat"]
                    flat[...] = _read_flat(read, f"optim.{kind}", layer, layout, r, n, flat.dtype, placements,
                                           coords, sizes)
            state["t"] = step
        else:
            for kind in kinds:
                if kind in s.state:
                    for k in layout.names:
                        arr = s.state[kind][f"{unit}.{k}"]
                        full, start = _block_start(placements[f"{layer}.{k}"], arr.shape, coords, sizes)
                        arr[...] = read(f"optim.{kind}.{layer}.{k}", start, arr.shape)
            s.state["t"] = step
