"""The pipeline's programs (emulator/parallel/pipeline/exchange.py): with one handle per
batch and a group's batches one after the other (NCCL's semantics), the time-step pairing
runs every schedule for every m torch builds, on the executor and in run_on_mesh, equal to
one device; the pairing a rank makes alone hangs interleaved 1F1B from m = 2p."""

import numpy as np
import pytest

from emulator import ConfigError, DeadlockError, Topology, World, nn
from emulator.accounting import pipeline_bubble
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.parallel import pipeline as pp
from emulator.training import synthetic_batches, train_single

COSTS = (1e-3, 1e-3, 1e-3)


def torch_builds(p, m, v):
    """Does torch's schedule exist for this m (interleaving: rounds of equal size)?"""
    try:
        pp.schedule("interleaved_1f1b" if v > 1 else "1f1b", p, m, v)
    except ConfigError:
        return False
    return True


def cases(p):
    """(name, m, v): every schedule, m up to 3p (interleaving: the m torch builds)."""
    out = [(name, m, 1) for name in ("gpipe", "1f1b", "zb_h1") for m in range(1, 2 * p + 2)]
    return out + [("interleaved_1f1b", m, v) for v in (2, 3) for m in range(1, 3 * p + 1) if torch_builds(p, m, v)]


def tiny(blocks):
    model = nn.GPT(vocab=16, d_model=8, n_heads=2, d_ff=16, n_layers=blocks, max_seq=4, dtype=np.float64)
    return model, model.init(np.random.default_rng(blocks))


def single_device_grads(model, params, x, y):
    logits, cache = model.forward(params, x)
    loss, lc = nn.cross_entropy(logits, y)
    return loss, model.backward(params, cache, nn.cross_entropy_backward(lc))[1]


@pytest.mark.parametrize("p", [2, 3, 4])
def test_every_schedule_runs_for_every_m_equal_to_one_device_and_adds_no_wait(p):
    """Gradients and loss as one device's (float64); with equal stages on a free network
    the measured bubble is the formula's, so no batch makes a rank wait longer than the
    schedule itself does."""
    for name, m, v in cases(p):
        model, params = tiny(p * v)
        (x, y), = synthetic_batches(1, m, 4, 16, seed=m)
        run = pp.run(World(p, topology=Topology.free_network()), model, params, pp.schedule(name, p, m, v), x, y,
                     costs=COSTS)
        loss, want = single_device_grads(model, params, x, y)
        got = run.grads()
        assert sorted(got) == sorted(want), (name, m, v)
        for k in want:
            np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-13, err_msg=f"{name} m={m} v={v} {k}")
        assert run.loss == pytest.approx(loss, rel=1e-12)
        bubble = (pipeline_bubble(p, m, v) if v > 1 else
                  pipeline_bubble(p, m, schedule="zb_h1" if name == "zb_h1" else "1f1b", costs=COSTS))
        assert run.bubble == pytest.approx(bubble, abs=1e-9), (name, m, v)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_pairing_each_receive_with_the_previous_sends_hangs_interleaving_from_2p(p):
    """What the lesson says of the pairing a rank can make alone (Megatron's without
    interleaving): GPipe, 1F1B and ZB-H1 for every m; interleaved 1F1B only below 2p."""
    for name, m, v in cases(p):
        model, params = tiny(p * v)
        (x, y), = synthetic_batches(1, m, 4, 16, seed=1)
        s = pp.schedule(name, p, m, v)
        local = pp.local_program(s)

        def loop(comm, stage, steps, mx, my):
            return pp.run_actions(comm, stage, local[comm.rank], mx, my)

        if v > 1 and m >= 2 * p:
            with pytest.raises(DeadlockError, match="waits in batch_isend_irecv"):
                pp.run(World(p), model, params, s, x, y, loop=loop)
        else:
            pp.run(World(p), model, params, s, x, y, loop=loop)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_run_on_mesh_runs_interleaving_for_every_m_torch_builds(p):
    for v in (2, 3):
        model = nn.GPT(vocab=16, d_model=8, n_heads=2, d_ff=16, n_layers=p * v, max_seq=4, dtype=np.float64)
        params = model.init(np.random.default_rng(0))
        for m in [m for m in range(1, 3 * p + 1) if torch_builds(p, m, v)]:
            batches = synthetic_batches(1, m, 4, 16, seed=m)
            dims = ParallelDims(pp=p, v=v, schedule="interleaved_1f1b", micro_batches=m)
            run = run_on_mesh(model, params, batches, dims, nn.AdamW(lr=1e-2))
            ref, ref_losses = train_single(model, params, batches, nn.AdamW(lr=1e-2), micro_batches=m)
            for k in ref:
                np.testing.assert_allclose(run.params[k], ref[k], rtol=1e-9, atol=1e-12, err_msg=f"m={m} v={v} {k}")
            assert run.losses == pytest.approx(ref_losses, rel=1e-12)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "zb_h1"])
def test_run_on_mesh_runs_the_other_schedules_for_every_m(name):
    p = 3
    model = nn.GPT(vocab=16, d_model=8, n_heads=2, d_ff=16, n_layers=p, max_seq=4, dtype=np.float64)
    params = model.init(np.random.default_rng(0))
    for m in range(1, 2 * p + 2):
        batches = synthetic_batches(1, m, 4, 16, seed=m)
        run = run_on_mesh(model, params, batches, ParallelDims(pp=p, schedule=name, micro_batches=m),
                          nn.AdamW(lr=1e-2))
        ref, ref_losses = train_single(model, params, batches, nn.AdamW(lr=1e-2), micro_batches=m)
        for k in ref:
            np.testing.assert_allclose(run.params[k], ref[k], rtol=1e-9, atol=1e-12, err_msg=f"m={m} {k}")


def test_a_program_holds_one_batch_per_time_step_with_both_ends_of_each_message():
    """Every message is sent in a step of its producer and received in a step of its
    consumer's rank before the consumer runs; the k-th batches two neighbours exchange
    meet (the same number of sends one way as receives the other, batch by batch)."""
    for name, p, m, v in [("1f1b", 4, 6, 1), ("interleaved_1f1b", 3, 6, 2), ("interleaved_1f1b", 4, 2, 3)]:
        s = pp.schedule(name, p, m, v)
        steps = pp.program(s)
        for r, rank_steps in enumerate(steps):
            assert [a for st in rank_steps for a in st.actions] == s[r]  # the schedule's order, every action once
            seen = set()
            for st in rank_steps:
                assert not set(st.receives) & seen  # received before it runs
                seen |= set(st.actions)
        for r in range(p):
            for q in range(p):
                if q == r:
                    continue
                out = [len([a for a in st.sends if _dst(p, r, a) == q]) for st in steps[r] if _meets(p, r, st, q)]
                inn = [len([a for a in st.receives if _src(p, q, a) == r]) for st in steps[q] if _meets(p, q, st, r)]
                assert sum(out) == sum(inn)


def _dst(p, r, a):
    s = a.chunk * p + r + (1 if a.kind == "F" else -1)
    return s % p


def _src(p, r, a):
    s = a.chunk * p + r + (-1 if a.kind == "F" else 1)
    return s % p


def _meets(p, r, st, q):
    return any(_dst(p, r, a) == q for a in st.sends) or any(_src(p, r, a) == q for a in st.receives)


def test_format_program_shows_each_step_and_its_batch():
    """1F1B on 2 ranks with F = 1 and B = 2: rank 0's F1 ends at 2, when rank 1's F0 does,
    so rank 1 receives it in the batch after its F0; rank 1's B0 ends at 4, between rank
    0's F1 (2) and B0 (4 to 6), so rank 0 receives it in a batch of its own."""
    text = pp.format_program(pp.program(pp.schedule("1f1b", 2, 2)))
    assert text.splitlines() == ["rank 0: F0 [send F0] | F1 [send F1] | [recv for B0] | B0 | [recv for B1] | B1",
                                 "rank 1: [recv for F0] | F0 [recv for F1] | B0 [send B0] | F1 | B1 [send B1]"]
