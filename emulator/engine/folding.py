"""Folded worlds: a shape-only run of a mesh whose ranks along some axes are alike runs one
representative of each set of them (the ranks with coordinate 0 along the folded axes
are *live*; every other rank stands for its representative), and a collective whose
other members are all folded into a rank runs when that rank next blocks, as the last
member would have arrived then."""

import numpy as np

from ..errors import MeshError


class Folding:
    """The folding half of :class:`~emulator.engine.world.World`."""

    def _fold(self, axes):
        """Run one representative of each set of ranks that differ only along ``axes``
        (symmetric axes of a shape-only run): the ranks with coordinate 0 along them are
        *live*; every other rank stands for its representative."""
        self.fold = axes
        if not axes:
            self.live, self.representative = list(range(self.size)), None
            return
        if self.mesh is None:
            raise MeshError("fold= needs a World with a mesh, to know which ranks are alike")
        for a in axes:
            if a not in self.mesh.shape:
                raise MeshError(f"cannot fold axis {a!r}: the mesh's axes are {list(self.mesh.axes)}")
        grid = self.mesh._grid
        index = tuple(slice(0, 1) if a in axes else slice(None) for a in self.mesh.axes)
        rep = grid[index]
        self.representative = np.broadcast_to(rep, grid.shape).reshape(-1)
        self.live = sorted(int(r) for r in rep.reshape(-1))

    def live_members(self, ranks):
        """The group-local indices of ``ranks`` that run (all of them unless folded)."""
        if self.representative is None:
            return range(len(ranks))
        return [i for i, r in enumerate(ranks) if self.representative[r] == r]

    def stand_in(self, ranks, i):
        """The group-local index of the live rank that stands for member ``i``."""
        rep = int(self.representative[ranks[i]])
        if rep not in ranks:
            raise MeshError(f"rank {ranks[i]} is folded into rank {rep}, which is not in its group {list(ranks)}: "
                            f"a folded axis may not be crossed by a group without the ranks that stand for it")
        return ranks.index(rep)

    def run_deferred(self, rank):
        """Run the collectives ``rank`` completed alone in a folded world, in the order it
        called them. In the unfolded world the last member arrives only once ``rank`` has
        gone as far as it can (ranks run in order, each until it waits), so its point-to-point
        messages posted meanwhile take the links first; deferring keeps that order, and a
        folded run equal to the unfolded one."""
        todo, self._deferred[rank] = self._deferred[rank], []
        for comm, rv, run in todo:
            comm._complete(rv, run)
