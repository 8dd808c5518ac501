"""The mesh: coordinates, groups, nodes; the same groups as torch's init_device_mesh."""

import os
import socket

import numpy as np
import pytest

from emulator import GroupError, Mesh, MeshError, Topology, World


def test_coordinates_and_groups():
    m = Mesh({"dp": 2, "pp": 2, "tp": 2}, gpus_per_node=4)
    assert m.size == 8 and m.axes == ("dp", "pp", "tp")
    assert m.coords(5) == {"dp": 1, "pp": 0, "tp": 1}
    assert m.rank_of(dp=1, pp=0, tp=1) == 5
    assert all(m.rank_of(**m.coords(r)) == r for r in range(8))
    assert m.group_ranks("tp", 5) == (4, 5)
    assert m.group_ranks("pp", 5) == (5, 7)
    assert m.group_ranks("dp", 5) == (1, 5)
    assert m.group_ranks(["dp", "tp"], 5) == (0, 1, 4, 5)
    assert m.groups("tp") == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert m.node_of(5) == 1 and m.node_of(3) == 0
    sub = m["tp"]
    assert sub.size == 2 and sub.group_of(6) == (6, 7) and len(sub.groups) == 4
    layout = m.layout()
    assert "node 1: gpu0:dp1,pp0,tp0" in layout and "2 nodes" in layout


def test_world_uses_the_mesh():
    w = World(mesh=Mesh({"dp": 2, "tp": 4}, gpus_per_node=4))
    assert w.topology.gpus_per_node == 4 and w.mesh.shape == {"dp": 2, "tp": 4}

    def prog(comm):
        tp = comm.group("tp")
        return comm.mesh is w.mesh, comm.coords(), tp.ranks, tp.rank, tp.size, tp.all_reduce(np.array([comm.rank]))

    res = w.run(prog)
    assert res[6][0] and res[6][1] == {"dp": 1, "tp": 2} and res[6][2] == (4, 5, 6, 7)
    assert res[6][3] == 2 and res[6][4] == 4 and res[6][5].tolist() == [22]
    assert World(mesh={"dp": 2}).mesh == Mesh({"dp": 2})


@pytest.mark.parametrize("bad,match", [({}, "at least one axis"), ({"dp": 0}, "positive"),
                                       ({"d,p": 2}, "without commas"), ({"dp": 2.0}, "positive ints")])
def test_bad_meshes(bad, match):
    with pytest.raises(MeshError, match=match):
        Mesh(bad)


def test_mesh_and_world_must_agree():
    with pytest.raises(MeshError, match="2 x 2 = 4 ranks, but World was asked for 8"):
        World(8, mesh={"dp": 2, "tp": 2})
    with pytest.raises(MeshError, match="make them agree"):
        World(mesh=Mesh({"dp": 2}, gpus_per_node=4), topology=Topology(gpus_per_node=8))
    m = Mesh({"dp": 2, "tp": 2})
    with pytest.raises(GroupError, match="no mesh axis 'pp'"):
        m.group_ranks("pp", 0)
    with pytest.raises(MeshError, match="out of range"):
        m.rank_of(dp=2, tp=0)
    with pytest.raises(MeshError, match="not in this mesh"):
        m.coords(4)


SHAPES = [(("dp", "tp"), (2, 2)), (("dp", "pp", "tp"), (2, 2, 2)), (("dp", "tp"), (4, 2)), (("pp", "dp"), (2, 4))]


def _torch_groups(rank, world, port, shapes, queue):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    out = []
    for names, shape in shapes:
        if int(np.prod(shape)) != world:
            continue
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
        for name in names:
            out.append((names, shape, name, tuple(sorted(dist.get_process_group_ranks(mesh.get_group(name))))))
    queue.put((rank, out))
    dist.barrier()
    dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("world", [4, 8])
def test_same_groups_as_torch_init_device_mesh(world):
    import torch.multiprocessing as mp

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_torch_groups, args=(r, world, port, SHAPES, queue)) for r in range(world)]
    for p in procs:
        p.start()
    got = dict(queue.get() for _ in range(world))
    for p in procs:
        p.join(timeout=120)
    checked = 0
    for rank, rows in got.items():
        for names, shape, axis, ranks in rows:
            mesh = Mesh(dict(zip(names, shape)))
            assert mesh.group_ranks(axis, rank) == ranks, (names, shape, axis, rank)
            checked += 1
    assert checked == world * sum(len(n) for n, s in SHAPES if int(np.prod(s)) == world)
