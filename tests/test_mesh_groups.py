"""The groups a mesh run names beside the mesh's axes (:class:`emulator.mesh.Group`): each
is the set its definition says, on every rank of a grid of meshes, found here from the
coordinates alone; each is spelled as the call trace spells it, so tables keyed by the
name keep working; the group each kind of parameter reduces over is the one the runtime
builds."""

import copy
import itertools
import pickle

import pytest

from emulator.mesh import DATA_PARALLEL, DP_CP, EDP, EP, REDUCED_OVER, TP_PP, Group
from emulator.parallel import ParallelDims

MESHES = [dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep) for dp, tp, pp, cp, ep in itertools.product(
    (1, 2, 4), (1, 2), (1, 2), (1, 2), (1, 2, 4)) if (dp * cp) % ep == 0]


def by_coordinates(dims, rank):
    """Every named group of ``rank``, from the mesh's coordinates (pp, dp, cp, tp; tp
    fastest) without the mesh: dp x cp ranks share pp and tp; the expert group is ep
    consecutive members of dp x cp in (dp, cp) order, the ranks holding the same experts
    every ep-th member."""
    sizes = dict(pp=dims.pp, dp=dims.dp, cp=dims.cp, tp=dims.tp)
    coords = list(itertools.product(*(range(n) for n in sizes.values())))
    mine = dict(zip(sizes, coords[rank]))
    same = lambda free: tuple(r for r, c in enumerate(coords) if all(
        c[i] == mine[a] for i, a in enumerate(sizes) if a not in free))
    dp_cp = same(("dp", "cp"))
    i = dp_cp.index(rank)
    return {"dp,cp": dp_cp, "tp,pp": same(("tp", "pp")),
            "ep": dp_cp[i // dims.ep * dims.ep:(i // dims.ep + 1) * dims.ep], "edp": dp_cp[i % dims.ep::dims.ep]}


@pytest.mark.parametrize("shape", MESHES, ids=lambda d: ",".join(f"{k}{v}" for k, v in d.items()))
def test_each_group_is_the_set_its_definition_names(shape):
    dims = ParallelDims(**shape)
    mesh = dims.mesh(gpus_per_node=4)
    for rank in range(dims.world_size):
        want = by_coordinates(dims, rank)
        got = dims.groups_of(rank, gpus_per_node=4)
        for group in (DP_CP, EP, EDP):
            assert tuple(got[group]) == want[group], (shape, rank, group)
        assert tuple(TP_PP.ranks(mesh, rank)) == want["tp,pp"], (shape, rank)


def test_groups_are_spelled_as_the_trace_spells_them_and_survive_copies():
    assert [str(g) for g in (DP_CP, TP_PP, EP, EDP)] == ["dp,cp", "tp,pp", "ep", "edp"]
    table = {"dp,cp": 1, "edp": 2}
    assert table[DP_CP] == 1 and table[EDP] == 2 and {DP_CP: 3}["dp,cp"] == 3
    assert REDUCED_OVER == {"dense": DP_CP, "experts": EDP} and DATA_PARALLEL == (DP_CP, EDP)
    for g in (DP_CP, EDP):
        for other in (pickle.loads(pickle.dumps(g)), copy.deepcopy(g)):
            assert isinstance(other, Group) and (other, other.axes, other.carve) == (g, g.axes, g.carve)


def test_a_group_carved_the_wrong_way_is_caught():
    """The comparison above tells the expert group from the ranks that share experts."""
    dims = ParallelDims(dp=4, ep=2)
    mesh = dims.mesh(gpus_per_node=4)
    swapped = Group("ep", ("dp", "cp"), "stride")
    assert tuple(swapped.ranks(mesh, 0, 2)) != by_coordinates(dims, 0)["ep"]
