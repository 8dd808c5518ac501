"""The data_parallel package: the old module paths give the same objects; reduce_flat (the
one flatten, all-reduce, unflatten) equals one all-reduce of the tensors laid end to end,
and the tensor-parallel and pipeline helpers built on it send what they sent."""

import importlib

import numpy as np
import pytest

from emulator import ConfigError, World
from emulator.parallel import data_parallel as data_parallel_function
from emulator.parallel.data_parallel import ladder
from emulator.parallel.data_parallel.flat_layout import reduce_flat
from emulator.parallel.pipeline.executor import sync_dp_grads
from emulator.parallel.tp_regions import all_reduce_together

OLD = {
    "base": ["DataParallelStrategy"], "ddp": ["DDP"], "zero1": ["ZeRO1"], "zero2": ["ZeRO2"], "zero3": ["ZeRO3"],
    "zero_ladder": ["NAMES", "STRATEGIES", "assemble", "data_parallel"], "flat_layout": ["FlatLayout", "layouts"],
    "buckets": ["bucket_layers", "bucket_limit"], "distributed_optimizer": ["DistributedOptimizer"],
    "mesh_hooks": ["MeshHooks", "strategy_for", "uses_distributed_optimizer"],
}


@pytest.mark.parametrize("module", sorted(OLD))
def test_the_old_paths_give_the_package_objects(module):
    old = importlib.import_module(f"emulator.parallel.{module}")
    new = importlib.import_module("emulator.parallel.data_parallel")
    for name in OLD[module]:
        assert getattr(old, name) is getattr(new, name), (module, name)


def test_emulator_parallel_data_parallel_calls_as_the_function_and_imports_as_the_package():
    import inspect

    import emulator.parallel as P
    import emulator.parallel.data_parallel.ddp as ddp_module  # a function of that name hid this path

    assert ddp_module.DDP is P.DDP and P.data_parallel is data_parallel_function
    assert inspect.signature(P.data_parallel) == inspect.signature(ladder.data_parallel)
    model, params = _tiny()
    for stage in range(4):
        made = World(2).run(lambda comm: type(data_parallel_function(stage, comm, model, params, _opt())))
        assert made == [ladder.STRATEGIES[stage]] * 2
    with pytest.raises(ConfigError, match="zero_stage must be 0"):
        data_parallel_function(7, None, model, params, _opt())
    for name in ("DDP", "ZeRO1", "ZeRO2", "ZeRO3", "NAMES", "STRATEGIES", "assemble"):
        assert getattr(P, name) is getattr(ladder, name)


def _tiny():
    from emulator import nn

    model = nn.GPT(vocab=16, d_model=8, n_heads=2, d_ff=16, n_layers=1, max_seq=8, dtype=np.float64)
    return model, model.init(np.random.default_rng(0))


def _opt():
    from emulator.nn import AdamW

    return AdamW(lr=1e-3)


def _tensors(rank):
    return {"b": np.arange(3, dtype=np.float32) + rank, "a": np.full((2, 2), 0.1 * (rank + 1)),
            "c": np.linspace(0, 1, 5, dtype=np.float32) * (rank + 1), "z": np.zeros(2, np.float16)}


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_reduce_flat_is_one_all_reduce_of_the_tensors_end_to_end(n):
    keys = ["c", "a", "b"]  # not sorted: laid out in this order

    def reference(comm):
        t = _tensors(comm.rank)
        flat = comm.all_reduce(np.concatenate([t[k].reshape(-1) for k in keys]))
        sizes = np.cumsum([0] + [t[k].size for k in keys])
        return {**t, **{k: flat[i:j].reshape(t[k].shape) for k, i, j in zip(keys, sizes, sizes[1:])}}

    want_world, got_world = World(n), World(n)
    want = want_world.run(reference)
    got = got_world.run(lambda comm: reduce_flat(comm, _tensors(comm.rank), keys))
    for w, g in zip(want, got):
        assert list(g) == list(w)  # the order of the keys kept, the others passed through
        for k in w:
            assert g[k].dtype == w[k].dtype and g[k].shape == w[k].shape and np.array_equal(g[k], w[k]), k
    assert got[0]["a"].dtype == got[0]["b"].dtype == np.float64  # float32 and float64 laid end to end travel as float64
    assert [[c.as_list() for c in r] for r in got_world.calls] == [[c.as_list() for c in r] for r in want_world.calls]
    assert [r.as_dict() for r in got_world.trace] == [r.as_dict() for r in want_world.trace]


def test_reduce_flat_with_nothing_to_reduce_sends_nothing():
    world = World(2)
    out = world.run(lambda comm: reduce_flat(comm, _tensors(comm.rank), []))
    assert all(c == [] for c in world.calls) and sorted(out[0]) == ["a", "b", "c", "z"]


def test_the_helpers_built_on_it():
    """all_reduce_together sums the keys it is given (a group of one sends nothing);
    sync_dp_grads averages every gradient, in sorted order, in one call."""
    def prog(comm):
        t = _tensors(comm.rank)
        together = all_reduce_together(comm, t, ["b", "c"])
        averaged = sync_dp_grads(comm, {k: t[k] for k in ("c", "b")})
        return together, averaged

    for n in (1, 3):
        world = World(n)
        out = world.run(prog)
        ops = [c.op for c in world.calls[0]]
        assert ops == (["all_reduce"] if n == 1 else ["all_reduce", "all_reduce"])
        together, averaged = out[0]
        total = sum(_tensors(r)["c"].astype(np.float64) for r in range(n))
        assert np.allclose(together["c"], total) and np.array_equal(together["a"], _tensors(0)["a"])  # passed through
        assert list(averaged) == ["b", "c"] and np.allclose(averaged["c"], total / n)
