"""The pipeline executor on the emulator: its point-to-point messages, what goes wrong said
clearly (a deadlock, a schedule that cannot run, bad shapes), uneven stages, and compute
charged from FLOPs."""

import time
from collections import Counter

import numpy as np
import pytest

from emulator import DeadlockError, World
from emulator.accounting import pp_bytes_per_boundary
from emulator.parallel import pipeline as pp
from emulator.parallel.pipeline import blocking_loop
from tests._pipeline import FREE, tiny


# ----------------------------------------------------------------- messages and traffic
def test_interleaving_multiplies_point_to_point_messages():
    model, params = tiny(16, dtype=np.float32, d=8)
    x = np.zeros((8, 4), dtype=np.int64)
    counts = {}
    for name, v in [("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 4)]:
        world = World(4)
        pp.run(world, model, params, pp.schedule(name, 4, 8, v), x, x)
        sends = [c for calls in world.calls for c in calls if c.op == "send"]
        counts[v] = len(sends)
        assert all(c.nbytes == pp_bytes_per_boundary(1, 4, 8, dtype_bytes=4) for c in sends)
    assert counts[1] == 2 * 8 * 3  # m micro-batches, forward and backward, over p - 1 boundaries
    assert counts[2] == 2 * 8 * 7 and counts[4] == 2 * 8 * 15  # p v - 1 boundaries


def test_messages_use_batch_isend_irecv_and_no_blocking_send():
    model, params = tiny(4)
    x = np.zeros((4, 2), dtype=np.int64)
    world = World(4)
    pp.run(world, model, params, pp.schedule("1f1b", 4, 4), x, x)
    ops = Counter(c.op for calls in world.calls for c in calls)
    assert set(ops) == {"send", "recv"} and ops["send"] == ops["recv"] == 2 * 4 * 3


# ----------------------------------------------------------------- what goes wrong, said clearly
def test_blocking_sends_deadlock_and_the_report_names_each_ranks_action():
    model, params = tiny(4)
    x = np.zeros((8, 2), dtype=np.int64)
    t0 = time.perf_counter()
    with pytest.raises(DeadlockError) as info:
        pp.run(World(4), model, params, pp.schedule("1f1b", 4, 8), x, x, loop=blocking_loop)
    assert time.perf_counter() - t0 < 1.0
    text = str(info.value)
    assert "rank 0: computed F0 F1 F2 F3; its next action is #4 B0" in text
    assert "rank 3: computed F0 B0; its next action is #2 F1" in text
    assert "rank 3 waits in send(dst=2)" in text


def test_a_schedule_that_cannot_run_is_refused_or_reported():
    stuck = pp.parse("F0 B0 F1 B1\nF0 F1 B0 B1")  # rank 0 waits for B0 before sending F1
    with pytest.raises(pp.ScheduleError, match=r"rank 0 is stuck on action #1 B0: it needs B0 on rank 1"):
        pp.validate(stuck)
    model, params = tiny(2)
    x = np.zeros((2, 2), dtype=np.int64)
    with pytest.raises(DeadlockError, match=r"rank 1: computed F0; its next action is #1 F1"):
        pp.run(World(2), model, params, stuck, x, x, check=False)
    for text, words in [("F0 B0\nF0 B0 B0", "repeated: B0"), ("F0 F1 B0\nF0 B0 F1 B1", "missing: B1"),
                        ("B0 F0\nF0 B0", "B0 comes before F0"), ("F0 F1 B1 B0\nF0 F1 B0 B1", "matched in order")]:
        with pytest.raises(pp.ScheduleError, match=words):
            pp.validate(pp.parse(text))
    with pytest.raises(ValueError, match="not an action"):
        pp.parse("F0 X1")
    with pytest.raises(ValueError, match="a batch of 2 sequences does not split into 3 equal micro-batches"):
        pp.run(World(3), *tiny(3), pp.schedule("1f1b", 3, 3), x, x)
    x3 = np.zeros((3, 2), dtype=np.int64)
    with pytest.raises(ValueError, match="at least one block per stage"):
        pp.run(World(3), *tiny(2), pp.schedule("1f1b", 3, 3), x3, x3)
    with pytest.raises(ValueError, match="the schedule has 3 ranks, the world 2"):
        pp.run(World(2), *tiny(3), pp.schedule("1f1b", 3, 3), x3, x3)


def test_uneven_stages_put_the_extra_blocks_inside():
    """Llama 3 405B's 126 layers on 16 stages: 7 on the first and last, 8 on the others."""
    class Stub:
        layers = [("embed", None)] + [(f"blocks.{i}", None) for i in range(126)] + [("head", None)]

    runs = pp.split_layers(Stub, 16)
    assert [len([n for n in r if n.startswith("blocks")]) for r in runs] == [7] + [8] * 14 + [7]
    assert runs[0][0] == "embed" and runs[-1][-1] == "head"
    assert sum(runs, []) == [n for n, _ in Stub.layers]
    assert [len(r) for r in pp.split_layers(Stub, 2)] == [64, 64]  # 63 blocks each, plus embed / head
    model, params = tiny(5)  # 5 blocks on 3 stages: 1, 2, 2 ... every layer once, trained as one device
    x = np.random.default_rng(0).integers(0, 7, (3, 2))
    run = pp.run(World(3), model, params, pp.schedule("1f1b", 3, 3), x, x)
    assert sorted(run.grads()) == sorted(params)


def test_compute_is_charged_from_flops():
    model, params = tiny(2, dtype=np.float32, d=8)
    x = np.zeros((2, 4), dtype=np.int64)
    world = World(2, topology=FREE)
    run = pp.run(world, model, params, pp.schedule("gpipe", 2, 2), x, x)
    f0 = next(e for e in world.timeline().of(1, "compute", "compute") if e.name == "F0")
    h = np.zeros((1, 4, 8))
    flops = model.blocks[1].flops(h.shape)["forward"] + model.head.flops(h.shape)["forward"]
    assert f0.duration == pytest.approx(flops / FREE.flops)
    assert run.loss is not None
