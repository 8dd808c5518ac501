"""A named mesh of ranks, as ``torch.distributed.device_mesh.init_device_mesh`` lays it out.

``Mesh({"dp": 4, "tp": 2}, gpus_per_node=8)`` arranges 8 ranks as a 4 x 2 grid, the last
axis innermost: rank = dp * 2 + tp, so consecutive ranks (which share a node) differ in
the last axis. That is why the axis that talks most (tp) goes last: its groups stay
inside a node. A *group along an axis* is the set of ranks that share every other
coordinate; ``group_ranks("dp", 5)`` is ``(1, 3, 5, 7)``. The same names and groups as
``init_device_mesh(device, (4, 2), mesh_dim_names=("dp", "tp"))`` (a test builds both).

``mesh["tp"]`` is the mesh seen along some axes (:class:`SubMesh`): every group along
them, and which group a rank belongs to.

A run on a mesh also names groups drawn from several axes, or carved from them by expert
parallelism (:class:`Group`): :data:`DP_CP`, :data:`TP_PP`, :data:`EP`, :data:`EDP`, each a
``str`` spelled as the call trace spells it.
"""

from functools import lru_cache

import numpy as np

from .errors import GroupError, MeshError


def _axes_tuple(axes):
    if isinstance(axes, str):
        return (axes,)
    return tuple(axes)


class Mesh:
    """Ranks ``0..size-1`` arranged as a grid with named axes (last axis innermost).

    ``gpus_per_node`` says which ranks share a node (ranks ``k*g .. k*g+g-1`` are node k),
    as torchrun assigns them with ``--nproc-per-node g``."""

    def __init__(self, shape, gpus_per_node=8):
        shape = dict(shape)
        if not shape:
            raise MeshError("a mesh needs at least one axis, e.g. Mesh({'dp': 2, 'tp': 4})")
        for axis, size in shape.items():
            if not isinstance(axis, str) or not axis or "," in axis:
                raise MeshError(f"mesh axis names must be non-empty strings without commas, got {axis!r}")
            if not (isinstance(size, (int, np.integer)) and size >= 1):
                raise MeshError(f"mesh axis {axis!r} has size {size!r}; sizes must be positive ints")
        if not (isinstance(gpus_per_node, (int, np.integer)) and gpus_per_node >= 1):
            raise MeshError(f"gpus_per_node must be a positive int, got {gpus_per_node!r}")
        self.shape = {a: int(s) for a, s in shape.items()}
        self.axes = tuple(self.shape)
        self.sizes = tuple(self.shape.values())
        self.size = int(np.prod(self.sizes))
        self.gpus_per_node = int(gpus_per_node)
        self._grid = np.arange(self.size).reshape(self.sizes)

    def __repr__(self):
        return f"Mesh({self.shape}, gpus_per_node={self.gpus_per_node})"

    def __eq__(self, other):
        return isinstance(other, Mesh) and (self.shape, self.gpus_per_node) == (other.shape, other.gpus_per_node)

    def __hash__(self):
        return hash((tuple(self.shape.items()), self.gpus_per_node))

    # ----------------------------------------------------------------- coordinates
    def _check_rank(self, rank):
        if not (isinstance(rank, (int, np.integer)) and 0 <= rank < self.size):
            raise MeshError(f"rank {rank!r} is not in this mesh (ranks 0..{self.size - 1})")

    def _check_axes(self, axes):
        axes = _axes_tuple(axes)
        if not axes:
            raise GroupError("name at least one mesh axis")
        for a in axes:
            if a not in self.shape:
                raise GroupError(f"no mesh axis {a!r}; axes are {list(self.axes)}")
        if len(set(axes)) != len(axes):
            raise GroupError(f"mesh axes {list(axes)} name one axis twice")
        return axes

    def coords(self, rank):
        """``{axis: index}`` of ``rank``."""
        self._check_rank(rank)
        return dict(zip(self.axes, map(int, np.unravel_index(int(rank), self.sizes))))

    def coord(self, rank, axis):
        return self.coords(rank)[self._check_axes(axis)[0]]

    def rank_of(self, **coords):
        """The rank at the given coordinates (every axis named once)."""
        if set(coords) != set(self.axes):
            raise MeshError(f"rank_of needs one coordinate per axis {list(self.axes)}, got {sorted(coords)}")
        for a, i in coords.items():
            if not (isinstance(i, (int, np.integer)) and 0 <= i < self.shape[a]):
                raise MeshError(f"coordinate {a}={i!r} is out of range 0..{self.shape[a] - 1}")
        return int(np.ravel_multi_index(tuple(coords[a] for a in self.axes), self.sizes))

    def group_ranks(self, axes, rank):
        """The ranks that differ from ``rank`` only along ``axes`` (a name or a list of
        names), in increasing order: the members of ``rank``'s group along those axes."""
        return _group_ranks(self, self._check_axes(axes), int(rank))

    def groups(self, axes):
        """Every group along ``axes``, each once, in order of their lowest rank."""
        axes = self._check_axes(axes)
        seen, out = set(), []
        for r in range(self.size):
            if r not in seen:
                g = _group_ranks(self, axes, r)
                seen.update(g)
                out.append(g)
        return out

    def node_of(self, rank):
        self._check_rank(rank)
        return int(rank) // self.gpus_per_node

    def __getitem__(self, axes):
        return SubMesh(self, self._check_axes(axes))

    # ----------------------------------------------------------------- pictures
    def layout(self, max_nodes=8):
        """Which GPU of which node holds which coordinates, one line per node."""
        n_nodes = -(-self.size // self.gpus_per_node)
        lines = [f"{self!r}: {self.size} ranks on {n_nodes} node{'s' * (n_nodes > 1)}"]
        for node in range(min(n_nodes, max_nodes)):
            ranks = range(node * self.gpus_per_node, min((node + 1) * self.gpus_per_node, self.size))
            cells = [f"gpu{r - node * self.gpus_per_node}:" + ",".join(f"{a}{i}" for a, i in self.coords(r).items())
                     for r in ranks]
            lines.append(f"  node {node}: " + "  ".join(cells))
        if n_nodes > max_nodes:
            lines.append(f"  ... {n_nodes - max_nodes} more nodes")
        return "\n".join(lines)

    __str__ = layout


@lru_cache(maxsize=4096)
def _group_ranks(mesh, axes, rank):
    mine = np.unravel_index(rank, mesh.sizes)
    index = tuple(slice(None) if a in axes else int(mine[i]) for i, a in enumerate(mesh.axes))
    return tuple(int(r) for r in np.sort(mesh._grid[index].reshape(-1)))


class SubMesh:
    """A mesh seen along some of its axes: ``size`` ranks per group, ``groups`` (all of
    them), and ``group_of(rank)``, the group a rank belongs to."""

    def __init__(self, mesh, axes):
        self.mesh, self.axes = mesh, axes
        self.shape = {a: mesh.shape[a] for a in axes}
        self.size = int(np.prod(list(self.shape.values())))
        self.label = ",".join(axes)

    @property
    def groups(self):
        return self.mesh.groups(self.axes)

    def group_of(self, rank):
        return self.mesh.group_ranks(self.axes, rank)

    def __repr__(self):
        return f"SubMesh({self.label}: {len(self.groups)} groups of {self.size}, e.g. {self.groups[0]})"


# ----------------------------------------------------------------- the groups a mesh run names
class Group(str):
    """A group of ranks that a run on a mesh uses beside the mesh's own axes: its name as
    the call trace writes it (a ``str``: ``"dp,cp"``, ``"edp"``), the mesh ``axes`` it is
    drawn from, and ``carve``: None for every rank that differs only in those axes, or how
    expert parallelism cuts that set into ``ep``-sized pieces (``"block"``: ep consecutive
    members, the expert group; ``"stride"``: every ep-th member, the ranks that hold the
    same experts)."""

    def __new__(cls, name, axes, carve=None):
        self = super().__new__(cls, name)
        self.axes, self.carve = tuple(axes), carve
        return self

    def __getnewargs__(self):
        return str(self), self.axes, self.carve

    def ranks(self, mesh, rank, ep=1):
        """The global ranks of ``rank``'s group on ``mesh`` (``ep``: expert parallelism's
        size, for a carved group)."""
        members = mesh.group_ranks(self.axes, rank)
        if self.carve is None:
            return members
        piece, index = divmod(members.index(rank), ep)
        return members[piece * ep:(piece + 1) * ep] if self.carve == "block" else members[index::ep]


DP_CP = Group("dp,cp", ("dp", "cp"))       # where dense gradients are reduced (cp fastest)
TP_PP = Group("tp,pp", ("tp", "pp"))       # the model-parallel ranks: a norm's squares summed first
EP = Group("ep", ("dp", "cp"), "block")    # an expert group, carved from dp x cp
EDP = Group("edp", ("dp", "cp"), "stride")  # the ranks holding the same experts
REDUCED_OVER = {"dense": DP_CP, "experts": EDP}  # a parameter unit's kind -> where its gradients reduce
DATA_PARALLEL = (DP_CP, EDP)                      # the groups gradients are reduced over
