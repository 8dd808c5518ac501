"""The SPMD view: World.run, groups, traffic identities, overlap, determinism."""

import numpy as np
import pytest

from emulator import P2POp, Topology, World
from emulator.algorithms import global_view as C

SIZES = [1, 2, 3, 4, 8]


def rank_data(comm, shape, dtype=np.float64, seed=0):
    rng = np.random.default_rng(seed + comm.global_rank)
    return (rng.standard_normal(shape) * 10).astype(dtype)


def inputs(n, shape, dtype=np.float64, seed=0):
    return [(np.random.default_rng(seed + r).standard_normal(shape) * 10).astype(dtype) for r in range(n)]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("alg", ["ring", "tree", "naive"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32])
def test_spmd_collectives_match_references(n, alg, dtype):
    def prog(comm):
        x = rank_data(comm, (2 * n, 3), dtype)
        before = x.copy()
        out = (comm.all_reduce(x, op="max"), comm.all_reduce(x), comm.reduce_scatter(x),
               comm.all_gather(x[:1]), comm.broadcast(x, src=n - 1))
        assert np.array_equal(x, before), "a collective modified its input"
        return out

    res = World(n, algorithm=alg).run(prog)
    xs = inputs(n, (2 * n, 3), dtype)
    tol = dict(rtol=1e-5, atol=1e-4) if dtype == np.float32 else dict(rtol=1e-12, atol=1e-12)
    for r in range(n):
        assert np.array_equal(res[r][0], np.max(xs, axis=0))
        assert np.allclose(res[r][1], np.sum(xs, axis=0), **tol)
        assert np.allclose(res[r][2], C.reference_reduce_scatter(xs)[r], **tol)
        assert np.array_equal(res[r][3], np.concatenate([x[:1] for x in xs]))
        assert np.array_equal(res[r][4], xs[n - 1])


@pytest.mark.parametrize("n", SIZES)
def test_all_to_all_and_point_to_point(n):
    def prog(comm):
        sent = [np.full(i + 1, comm.rank * 10 + i) for i in range(comm.size)]
        got = comm.all_to_all(sent)
        if comm.size > 1:  # a ring of messages, two per pair, received in order
            nxt, prv = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
            first, second = np.empty(2, dtype=int), np.empty(2, dtype=int)
            handles = comm.batch_isend_irecv([P2POp(comm.isend, np.array([comm.rank, 0]), nxt),
                                              P2POp(comm.isend, np.array([comm.rank, 1]), nxt),
                                              P2POp(comm.irecv, first, prv), P2POp(comm.irecv, second, prv)])
            assert len(handles) == 1  # one NCCL group, one handle (torch's cm.works)
            assert handles[0].wait() is True and handles[0].is_completed()
            assert first.tolist() == [prv, 0] and second.tolist() == [prv, 1]
        return got

    res = World(n).run(prog)
    for r in range(n):
        for i in range(n):
            assert res[r][i].tolist() == [i * 10 + r] * (r + 1)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_traffic_identities_in_the_trace(n):
    S_elems = 1024 * n
    w = World(n)

    def prog(comm, op):
        x = np.ones(S_elems, np.float32)
        getattr(comm, op)(x)

    S = S_elems * 4
    for op, factor, steps in [("all_reduce", 2, 2 * (n - 1)), ("reduce_scatter", 1, n - 1), ("all_gather", 1, n - 1)]:
        w.run(prog, op)
        stats = w.stats()
        per_rank_input = S if op != "all_gather" else S  # all_gather input is S, output n*S
        expected = factor * (n - 1) / n * per_rank_input * (n if op == "all_gather" else 1)
        assert stats.bytes_sent == [expected] * n, op
        assert stats["bytes_received"] == [expected] * n
        assert len({rec.step for rec in w.trace}) == steps
        assert stats.bytes_by_op == {op: expected * n}


def test_mesh_groups_and_coords():
    w = World(mesh={"dp": 2, "pp": 2, "tp": 2})

    def prog(comm):
        tp, pp, dp = comm.group("tp"), comm.group("pp"), comm.group("dp")
        flat = comm.group("dp", "tp")
        return (comm.coords(), tp.ranks, pp.ranks, dp.ranks, flat.ranks, tp.rank, tp.size,
                tp.all_reduce(np.array([comm.rank])))

    res = w.run(prog)
    assert res[5][0] == {"dp": 1, "pp": 0, "tp": 1}
    assert res[5][1] == (4, 5) and res[5][2] == (5, 7) and res[5][3] == (1, 5)
    assert res[5][4] == (0, 1, 4, 5) and res[5][5] == 1 and res[5][6] == 2
    assert res[5][7].tolist() == [9]  # 4 + 5
    # consecutive ranks share a node: a tp group never leaves it
    assert all(Topology().node(a) == Topology().node(b) for a, b in [res[r][1] for r in range(8)])


def test_each_run_starts_fresh_and_is_deterministic():
    w = World(4, algorithm="ring")

    def prog(comm):
        comm.compute(flops=1e12 * (comm.rank + 1))
        comm.memory.hold("x", np.zeros(10), "params")
        y = comm.all_reduce(rank_data(comm, (7,), np.float32))
        h = comm.all_gather(y[:2], async_op=True)
        comm.compute(seconds=1e-3)
        return h.wait()

    a = w.run(prog)
    trace_a, stats_a, tl_a = [r.as_dict() for r in w.trace], w.stats(), w.timeline().events
    b = w.run(prog)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert [r.as_dict() for r in w.trace] == trace_a
    assert w.stats() == stats_a and w.timeline().events == tl_a
    assert w.memory_report()[0]["peak"] == 80  # not 160: the ledger was reset


def test_collective_starts_when_last_member_arrives():
    w = World(2)

    def prog(comm):
        comm.compute(seconds=1e-3 * (comm.rank + 1))
        comm.all_reduce(np.ones(4, np.float32))

    w.run(prog)
    assert min(rec.start for rec in w.trace) == pytest.approx(2e-3)
    idle = w.timeline().of(0, stream="compute", kind="idle")
    assert idle[0].start == pytest.approx(1e-3) and idle[0].end > 2e-3


def test_async_overlaps_communication_with_compute():
    x = np.ones(2**20, np.float32)

    def sync(comm):
        comm.all_reduce(x)
        comm.compute(seconds=1e-3)

    def overlapped(comm):
        h = comm.all_reduce(x, async_op=True)
        comm.compute(seconds=1e-3)
        return h.wait()

    w = World(8)
    w.run(sync)
    t_sync = max(w.stats().time)
    w.run(overlapped)
    t_async = max(w.stats().time)
    comm_time = 2 * 7 / 8 * x.nbytes / w.topology.nvlink.beta
    assert t_sync == pytest.approx(1e-3 + comm_time, rel=0.05)
    assert t_async == pytest.approx(max(1e-3, comm_time), rel=0.05)


def test_isend_runs_behind_compute():
    def prog(comm):
        if comm.rank == 0:
            h = comm.isend(np.ones(2**20), 1)
            comm.compute(seconds=1e-2)
            h.wait()
        else:
            return comm.irecv(0).wait()

    w = World(2)
    res = w.run(prog)
    assert res[1].shape == (2**20,)
    assert w.stats().time[0] == pytest.approx(1e-2)
    assert w.stats().time[1] < 1e-3


def test_crossing_nodes_pays_the_slow_link_and_channels_share_it_out():
    x = np.ones(2**22, np.float32)
    nvl, nic = Topology().nvlink, Topology().nic
    times = {}
    for per_node, channels in ((8, None), (4, 1), (4, None)):
        w = World(8, topology=Topology(gpus_per_node=per_node))
        w.run(lambda comm: comm.all_reduce(x, channels=channels))
        times[per_node, channels] = max(w.stats().time)
        if per_node == 4:  # the NIC bytes in the trace: every crossing piece, and only those
            crossing = sum(r.nbytes for r in w.trace if r.link == "nic")
            assert crossing == sum(w.stats().bytes_sent_by_link["nic"]) > 0
            assert all((r.src // 4 != r.dst // 4) == (r.link == "nic") for r in w.trace)
    piece = x.nbytes / 8  # per rank chunk
    assert times[8, None] == pytest.approx(14 * (nvl.alpha + piece / nvl.beta), rel=1e-6)
    # one channel: every ring step waits for its slowest message, the one between nodes
    assert times[4, 1] == pytest.approx(14 * (nic.alpha + piece / nic.beta), rel=1e-6)
    # four channels (one per NIC): each crossing GPU's NIC carries a quarter of the chunk
    assert times[4, None] == pytest.approx(14 * (nic.alpha + piece / 4 / nic.beta), rel=1e-6)


def test_barrier_synchronises_clocks():
    def prog(comm):
        comm.compute(seconds=comm.rank * 1e-3)
        comm.barrier()
        return comm.now

    res = World(4).run(prog)
    assert len(set(res)) == 1 and res[0] >= 3e-3


@pytest.mark.parametrize("n", SIZES)
def test_all_to_all_single_with_uneven_splits(n):
    def splits(r):  # rank r sends 1 + (r + i) % 3 rows to rank i
        return [1 + (r + i) % 3 for i in range(n)]

    def prog(comm):
        r = comm.rank
        x = np.concatenate([np.full((s, 2), 100 * r + i) for i, s in enumerate(splits(r))])
        out_sizes = [splits(i)[r] for i in range(n)]
        return comm.all_to_all_single(x, out_sizes, splits(r)), comm.all_to_all_single(x, None, splits(r))

    w = World(n)
    res = w.run(prog)
    for r in range(n):
        want = np.concatenate([np.full((splits(i)[r], 2), 100 * i + r) for i in range(n)])
        assert np.array_equal(res[r][0], want) and np.array_equal(res[r][1], want)
    rows_sent = sum(sum(splits(r)) - splits(r)[r] for r in range(n))
    assert w.stats().bytes_by_op.get("all_to_all_single", 0) == 2 * rows_sent * 2 * 8


@pytest.mark.parametrize("op,ref", [("avg", np.mean), ("product", np.prod), ("min", np.min)])
def test_reduce_ops_as_torch_names_them(op, ref):
    xs = inputs(4, (8,), seed=3)

    def prog(comm):
        return comm.all_reduce(xs[comm.rank], op=op), comm.reduce_scatter(xs[comm.rank], op=op)

    res = World(4).run(prog)
    assert np.allclose(res[2][0], ref(xs, axis=0)) and np.allclose(res[2][1], ref(xs, axis=0)[4:6])
    from emulator import ReduceOp

    assert ReduceOp.PRODUCT == "product" and ReduceOp.AVG == "avg"


def test_world_records_every_call_in_order():
    def prog(comm):
        dp = comm.group("dp")
        dp.all_reduce(np.ones(4, np.float32))
        comm.group("tp").all_gather(np.ones(2))
        if comm.coord("tp") == 0:
            comm.group("tp").send(np.ones(3, np.int8), 1)
        else:
            comm.group("tp").recv(0)

    w = World(mesh={"dp": 2, "tp": 2})
    w.run(prog)
    assert [c.as_list() for c in w.calls[1]] == [["all_reduce", "dp", 16, None], ["all_gather", "tp", 16, None],
                                                 ["recv", "tp", 3, 0]]
    assert [c.as_list() for c in w.calls[2]][-1] == ["send", "tp", 3, 3]
