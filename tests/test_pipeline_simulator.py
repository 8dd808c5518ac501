"""The pipeline's neighbour rule (``actions.source``, ``destination``, ``dependencies``) and
its one simulator (``simulator.play``), which validation, each rank's program and the
planner all use."""

import numpy as np
import pytest

from emulator import World, nn
from emulator.parallel import pipeline as pp
from emulator.parallel.pipeline.actions import Action, destination, source
from emulator.parallel.pipeline.simulator import play, waits_of

SHAPES = [("gpipe", 3, 4, 1), ("1f1b", 4, 6, 1), ("zb_h1", 4, 8, 1), ("interleaved_1f1b", 2, 4, 2),
          ("interleaved_1f1b", 4, 8, 3), ("interleaved_1f1b", 1, 2, 2)]


@pytest.mark.parametrize("name, p, m, v", SHAPES)
def test_source_and_destination_are_each_others_inverse(name, p, m, v):
    for r, acts in enumerate(pp.schedule(name, p, m, v)):
        for a in acts:
            src, dst = source(p, v, r, a), destination(p, v, r, a)
            if src is not None:  # the sender's action sends here
                assert destination(p, v, src[0], Action(a.kind, a.microbatch, src[1])) == (r, a.chunk)
                assert (src[0], Action(a.kind, a.microbatch, src[1])) in pp.dependencies(p, v, r, a)
            if dst is not None:
                assert source(p, v, dst[0], Action(a.kind, a.microbatch, dst[1])) == (r, a.chunk)
            if a.kind == "W":
                assert src is None and dst is None


def test_the_stage_asks_the_rule():
    model = nn.GPT(vocab=8, d_model=4, n_heads=1, d_ff=4, n_layers=4, max_seq=4)
    params = model.init(np.random.default_rng(0))

    def rank(comm):
        stage = pp.PipelineStage(comm, model, params, v=2)
        acts = [Action(k, 0, c) for k in "FBW" for c in range(2)]
        return all(stage.source(a) == source(2, 2, comm.rank, a) and
                   stage.destination(a) == destination(2, 2, comm.rank, a) for a in acts)

    assert all(World(2).run(rank))


def test_a_message_takes_its_hop_and_the_host_can_hold_the_gpu_back():
    s = pp.schedule("gpipe", 2, 1)  # rank 0: F0 B0, rank 1: F0 B0
    durations = [[1.0, 2.0], [1.0, 2.0]]
    t = play(s, durations, hop=lambda src, dst: 0.5)
    assert [(str(a), st, e) for a, st, e in t[1]] == [("F0", 1.5, 2.5), ("B0", 2.5, 4.5)]
    assert [(str(a), st, e) for a, st, e in t[0]] == [("F0", 0.0, 1.0), ("B0", 5.0, 7.0)]
    slow_host = play(s, durations, hop=lambda src, dst: 0.5, host=[[3.0, 0.1], [0.1, 0.1]])
    assert slow_host[0][0][2] == 3.0  # F0 ends once its host has issued it all
    assert slow_host[1][0][1] == 3.5  # and rank 1's F0 waits for its message


@pytest.mark.parametrize("name, p, m, v", SHAPES)
def test_simulate_is_play_with_equal_stages(name, p, m, v):
    s = pp.schedule(name, p, m, v)
    split = name == "zb_h1"
    per = {"F": 1.0 / v, "B": (2.0 if split else 2.5) / v, "W": 0.5 / v}
    assert pp.simulate(s, (1.0, 2.0, 0.5)) == play(s, [[per[a.kind] for a in acts] for acts in s])
    assert play(s, [[per[a.kind] for a in acts] for acts in s], waits=waits_of(s)) == pp.simulate(s, (1.0, 2.0, 0.5))


def test_ranks_waiting_on_each_other_are_reported_with_what_each_needs():
    s = pp.parse("F0 B0\nB0 F0")
    with pytest.raises(pp.ScheduleError) as err:
        play(s, [[1.0, 1.0], [1.0, 1.0]], hop=lambda src, dst: 0.1, host=[[0.0, 0.0], [0.0, 0.0]])
    text = str(err.value)
    assert "rank 0 is stuck on action #1 B0: it needs B0 on rank 1" in text
    assert "rank 1 is stuck on action #0 B0: it needs F0 on rank 1" in text


def test_an_action_before_what_it_needs_on_its_own_rank_never_runs():
    with pytest.raises(pp.ScheduleError, match="rank 0 is stuck on action #0 B0: it needs F0 on rank 0"):
        pp.simulate([pp.parse("B0 F0")])
