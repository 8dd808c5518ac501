"""Timeline and Chrome trace on a small example."""

import json

import numpy as np

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
    assert (0, "comm", "comm", "send->1") in names
    assert (1, "compute", "idle", "wait recv<-0") in names
    assert (0, "compute", "idle", "finished") in names
    assert tl.total("compute") == 3e-3
    assert 0 < tl.idle_fraction() < 0.5
    for r in range(2):  # the compute stream of each rank is a partition of [0, makespan]
        spans = sorted((e.start, e.end) for e in tl.of(r, stream="compute"))
        assert spans[0][0] == 0 and spans[-1][1] == tl.makespan
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:]))


def test_chrome_trace(tmp_path):
    w = World(2)
    w.run(pipeline_like)
    path = w.save_chrome_trace(tmp_path / "trace.json")
    data = json.loads(path.read_text())
    spans = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == {0, 1}
    names = {e["args"]["name"] for e in data["traceEvents"] if e.get("name") == "process_name"}
    assert names == {"rank 0", "rank 1"}
    fwd = [e for e in spans if e["name"] == "forward" and e["pid"] == 1][-1]
    assert fwd["ts"] > 1000  # microseconds: rank 1 starts after rank 0's forward and the send
