"""Training with a pipeline (``train_pipeline``, each step ``train_step``: the program, then
the stage's hooks reduce and apply) against one device, in float64 to 1e-12: the reference
is :func:`emulator.training.train_single`, its numbers stored here so that a change to
both sides at once shows too."""

import numpy as np
import pytest

from emulator import World, nn
from emulator.machine import elementwise
from emulator.nn.module import sub
from emulator.parallel import pipeline as pp
from emulator.training import synthetic_batches, train_single

# train_single(MODEL, PARAMS, BATCHES, AdamW(lr=1e-2)): each step's loss, then the sum of
# every parameter and of their squares after the three steps
REFERENCE_LOSSES = [2.7775387108002962, 2.7795736947271856, 2.7634210258160543]
REFERENCE_SUM, REFERENCE_SQUARES = 72.46941435938079, 74.37817385508993
TOL = 1e-12


def setup():
    model = nn.GPT(vocab=16, d_model=8, n_heads=2, d_ff=16, n_layers=4, max_seq=4, dtype=np.float64)
    return model, model.init(np.random.default_rng(4)), synthetic_batches(3, 12, 4, 16, seed=5)


def test_the_stored_reference_is_one_devices():
    model, params, batches = setup()
    ref, losses = train_single(model, dict(params), batches, nn.AdamW(lr=1e-2))
    assert losses == pytest.approx(REFERENCE_LOSSES, rel=0, abs=TOL)
    assert float(sum(np.sum(a) for a in ref.values())) == pytest.approx(REFERENCE_SUM, rel=0, abs=TOL)
    assert float(sum(np.sum(a * a) for a in ref.values())) == pytest.approx(REFERENCE_SQUARES, rel=0, abs=TOL)


CASES = [({"pp": 4}, "1f1b", 4, 1, None), ({"pp": 2}, "gpipe", 3, 1, None), ({"dp": 2, "pp": 2}, "1f1b", 2, 1, None),
         ({"dp": 2, "pp": 2}, "interleaved_1f1b", 2, 2, None), ({"dp": 3, "pp": 2}, "zb_h1", 2, 1, None),
         ({"dp": 3, "pp": 1}, "gpipe", 2, 1, None), ({"dp": 2, "pp": 2}, "gpipe", 2, 1, pp.blocking_loop)]


@pytest.mark.parametrize("mesh, name, m, v, loop", CASES, ids=lambda c: str(c) if not callable(c) else c.__name__)
def test_train_pipeline_equals_one_device(mesh, name, m, v, loop):
    model, params, batches = setup()
    ref, _ = train_single(model, dict(params), batches, nn.AdamW(lr=1e-2))
    s = pp.schedule(name, mesh["pp"], m, v)
    out = World(mesh=mesh).run(lambda comm: pp.train_pipeline(comm, model, params, batches, s, nn.AdamW(lr=1e-2),
                                                               loop=loop))
    got = {k: a for stage_params, _ in out for k, a in stage_params.items()}
    assert set(got) == set(ref)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=TOL, err_msg=k)
    assert float(sum(np.sum(a) for a in got.values())) == pytest.approx(REFERENCE_SUM, rel=0, abs=TOL)
    last = [losses for _, losses in out if losses[0] is not None]  # one per dp replica
    assert len(last) == mesh.get("dp", 1)
    assert np.mean(last, axis=0) == pytest.approx(REFERENCE_LOSSES, rel=0, abs=TOL)


def test_train_pipeline_averages_with_the_sync_it_is_given():
    model, params, batches = setup()
    seen = []

    def per_key_average(dp, grads):
        seen.append((dp.size, sorted(grads)))
        return {k: dp.all_reduce(g) / dp.size for k, g in grads.items()}

    s = pp.schedule("1f1b", 2, 2)
    world = World(mesh={"dp": 2, "pp": 2})
    out = world.run(lambda comm: pp.train_pipeline(comm, model, params, batches, s, nn.AdamW(lr=1e-2),
                                                   sync=per_key_average))
    assert len(seen) == world.size * len(batches)  # every rank, once a step
    assert all(size == 2 for size, _ in seen)
    handed = {k for _, keys in seen for k in keys}
    assert all(set(stage_params) <= handed for stage_params, _ in out)  # as {"layer.key": gradient}
    ref, _ = train_single(model, dict(params), batches, nn.AdamW(lr=1e-2))
    got = {k: a for stage_params, _ in out for k, a in stage_params.items()}
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=0, atol=TOL, err_msg=k)


def test_train_step_runs_the_program_then_the_hooks_step():
    model, params, batches = setup()
    calls = []

    class Hooks(pp.LocalParams):
        def step(self):
            calls.append(sorted(self.grads))
            self.grads = {}

    def one_rank(comm):
        stage = pp.PipelineStage(comm, model, hooks=Hooks(comm.memory, {n: sub(params, n) for n, _ in model.layers}))
        steps = pp.program(pp.schedule("1f1b", 1, 2))[0]
        x, y = batches[0]
        losses = pp.train_step(comm, stage, steps, list(np.split(x, 2)), list(np.split(y, 2)))
        return losses, stage.losses, stage.done

    (losses, left, done), = World(1).run(one_rank)
    assert calls == [sorted(n for n, _ in model.layers)]  # every layer's gradients, once
    assert sorted(losses) == [0, 1] and left == {} and done == []


def test_each_stage_charges_its_optimizer_update_once_a_step():
    """The update of every parameter a stage holds is charged on its clock after each step, as
    the data-parallel strategies charge theirs: its declared kernels, over the stage's own
    elements (the timeline's ``optimizer step``); without the charge the check fails."""
    model, params, batches = setup()
    s = pp.schedule("1f1b", 2, 2)
    world = World(mesh={"dp": 2, "pp": 2})
    out = world.run(lambda comm: (pp.train_pipeline(comm, model, params, batches, s, nn.AdamW(lr=1e-2)),
                                  comm.work_context(np.float64)))
    for r, ((stage_params, _), ctx) in enumerate(out):
        updates = [passes for name, passes in world.charged[r] if name == "optimizer step"]
        assert len(updates) == len(batches), f"rank {r}"
        elements = sum(a.size for a in stage_params.values())
        want = elementwise.optimizer_update(ctx.stack, elements, ctx.precision, ctx.array)
        for passes in updates:
            assert [k for _, ks in passes for k in ks] == list(want), f"rank {r}: not the update of its {elements}"
