"""Timeline, streams and Chrome trace on small examples."""

import json

import numpy as np
import pytest

from emulator import World


def pipeline_like(comm):
    comm.compute(seconds=1e-3, name="forward")
    if comm.rank == 0:
        comm.send(np.ones(1000, np.float32), 1)
    else:
        comm.recv(0)
        comm.compute(seconds=1e-3, name="forward")


def test_timeline_events():
    w = World(2)
    w.run(pipeline_like)
    tl = w.timeline()
    names = [(e.rank, e.stream, e.kind, e.name) for e in tl.events]
    assert (0, "compute", "compute", "forward") in names
    assert (0, "p2p 0->1", "comm", "send->1") in names
    assert (1, "p2p 0->1", "comm", "recv<-0") in names
    assert (1, "compute", "idle", "wait recv<-0") in names
    assert (0, "compute", "idle", "finished") in names
    assert tl.total("compute") == 3e-3
    assert 0 < tl.idle_fraction() < 0.5
    assert tl.streams(0) == ["compute", "p2p 0->1"]
    for r in range(2):  # the compute stream of each rank is a partition of [0, makespan]
        spans = sorted((e.start, e.end) for e in tl.of(r, stream="compute"))
        assert spans[0][0] == 0 and spans[-1][1] == tl.makespan
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_a_send_starts_when_both_sides_are_ready():
    def prog(comm):
        if comm.rank == 0:
            comm.compute(seconds=1e-3)
            comm.send(np.ones(4), 1)
        else:
            comm.recv(0)  # posted at 0, waits for the sender
        comm.compute(seconds=2e-3 if comm.rank == 0 else 0)
        if comm.rank == 1:
            comm.send(np.ones(4), 0)  # posted at ~1 ms, the receiver posts at ~3 ms
        else:
            comm.recv(1)

    w = World(2)
    w.run(prog)
    sends = sorted(w.trace, key=lambda r: r.start)
    assert sends[0].start == pytest.approx(1e-3)
    assert sends[1].start == pytest.approx(3e-3, rel=1e-3)


def test_one_stream_per_group_and_events_name_the_group():
    """An async tp all-reduce and an async dp all-reduce run at once, each on its own
    stream, in the order issued; on different links they do not slow each other."""
    x = np.ones(2**20, np.float32)

    def both(comm):
        tp = comm.group("tp").all_reduce(x, async_op=True)
        dp = comm.group("dp").all_reduce(x, async_op=True)
        return tp.wait(), dp.wait()

    w = World(mesh={"dp": 2, "tp": 8})
    w.run(both)
    tl = w.timeline()
    comm = {e.group: e for e in tl.of(0, kind="comm")}
    assert set(comm) == {"tp", "dp"} and tl.streams(0) == ["compute", "comm dp", "comm tp"]
    assert comm["tp"].start == comm["dp"].start == 0.0  # both start at once: separate streams and links
    assert {r.group for r in w.trace} == {"tp", "dp"}
    assert {r.link for r in w.trace if r.group == "dp"} == {"nic"}
    assert {r.link for r in w.trace if r.group == "tp"} == {"nvlink"}


def test_groups_crossing_one_nic_share_it():
    """Two groups whose rings cross rank 0's NIC at the same time take turns on it: the
    two together take as long as their bytes need."""
    x = np.ones(2**20, np.float32)

    def one(comm):
        if comm.global_rank in (0, 8):
            comm.new_group([0, 8]).all_reduce(x)

    def two(comm):
        hs = []
        for ranks in ([0, 8], [0, 16]):
            g = comm.new_group(ranks)
            if comm.global_rank in ranks:
                hs.append(g.all_reduce(x, async_op=True))
        for h in hs:
            h.wait()

    w = World(24)
    w.run(one)
    alone = w.stats().time[0]
    w.run(two)
    events = sorted(w.timeline().of(0, kind="comm"), key=lambda e: e.start)
    assert len(events) == 2 and events[1].start == pytest.approx(events[0].end)
    assert w.stats().time[0] == pytest.approx(2 * alone)


def test_chrome_trace(tmp_path):
    w = World(2)
    w.run(pipeline_like)
    path = w.save_chrome_trace(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"rank 0", "rank 1"}
    threads = {(e["pid"], e["args"]["name"]) for e in data["traceEvents"] if e.get("name") == "thread_name"}
    assert threads == {(0, "compute"), (0, "p2p 0->1"), (1, "compute"), (1, "p2p 0->1")}
    fwd = [e for e in spans if e["name"] == "forward" and e["pid"] == 1][-1]
    assert fwd["ts"] > 1000  # microseconds: rank 1 starts after rank 0's forward and the send
