"""Lesson 01's checks (DDP, ZeRO-2, ZeRO-3, Problem 8.1) reject wrong answers, with a
message saying what is wrong, and accept other correct answers."""

import pytest

from emulator.grading import CheckFailed
from emulator.grading import lesson01 as g1
from emulator.parallel.base import DataParallelStrategy


class GoodDDP(DataParallelStrategy):
    def __init__(self, comm, model, params, opt, sync=False, divide=True, per_tensor=False):
        super().__init__(comm, model, params, opt)
        self.hold_full_params()
        self.state = opt.init(params)
        self.memory.hold("optimizer", self.state, "optimizer")
        self.pending, self.sync, self.divide, self.per_tensor = {}, sync, divide, per_tensor

    def grads_ready(self, name, grads, last):
        if self.per_tensor:
            for k in sorted(grads):
                self.pending[(name, k)] = self.comm.all_reduce(grads[k], async_op=True)
            return
        flat = self.memory.hold(f"grads:{name}", self.layouts[name].flatten(grads), "grads")
        h = self.comm.all_reduce(flat, async_op=True)
        if self.sync:
            h.wait()
        self.pending[name] = h

    def step(self):
        mean = {}
        for key, h in self.pending.items():
            got = h.wait() / (self.comm.size if self.divide else 1)
            if self.per_tensor:
                mean[f"{key[0]}.{key[1]}"] = got
                continue
            mean.update({f"{key}.{k}": v for k, v in self.layouts[key].unflatten(got).items()})
            self.memory.release(f"grads:{key}")
        self.pending = {}
        new, self.state = self.opt.step(self.params(), mean, self.state)
        self.full = {n: {k: new[f"{n}.{k}"] for k in self.full[n]} for n in self.names}
        self.hold_full_params()


def variant(cls, **fixed):
    return type(cls.__name__, (cls,), {"__init__": lambda self, *a, **k: cls.__init__(self, *a, **{**fixed, **k})})


def test_ddp_check_passes_a_correct_ddp_and_catches_each_mistake(capsys):
    g1.check_ddp(GoodDDP)
    assert "PASSED Exercise 1.1" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="start only after backward"):
        g1.check_ddp(variant(GoodDDP, sync=True))
    with pytest.raises(CheckFailed, match="differ from one device"):
        g1.check_ddp(variant(GoodDDP, divide=False))
    with pytest.raises(CheckFailed, match="one per layer per step"):
        g1.check_ddp(variant(GoodDDP, per_tensor=True))
    from emulator.parallel import DDP

    with pytest.raises(CheckFailed, match="library's own solution"):
        g1.check_ddp(DDP)

    class WorldDDP(GoodDDP):  # reduces over every rank instead of the strategy's group
        def __init__(self, comm, *a, **k):
            super().__init__(comm, *a, **k)
            self.comm = comm.new_group(range(comm._world.size)) if comm.label == "dp" else comm

    with pytest.raises(CheckFailed):
        g1.check_ddp(WorldDDP)


class GoodZeRO2(DataParallelStrategy):
    def __init__(self, comm, model, params, opt, scale=None, keep_full=False, op="sum"):
        super().__init__(comm, model, params, opt)
        self.hold_full_params()
        self.state = self.sharded_optimizer(self.slices_of_full())
        self.slices, self.scale, self.keep_full, self.op = {}, scale, keep_full, op

    def grads_ready(self, name, grads, last):
        flat = self.layouts[name].flatten(grads)
        if self.keep_full:
            self.memory.hold(f"grads-full:{name}", flat, "grads")
        got = self.comm.reduce_scatter(flat, op=self.op)
        self.slices[name] = got / (self.comm.size if self.scale is None else self.scale)
        self.memory.hold(f"grads:{name}", self.slices[name], "grads")

    def step(self):
        for name in self.names:
            mine = self.my_slice(name, self.layouts[name].flatten(self.full[name]))
            new, self.state[name] = self.opt.step({"flat": mine}, {"flat": self.slices.pop(name)}, self.state[name])
            self.memory.release(f"grads:{name}")
            if self.keep_full:
                self.memory.release(f"grads-full:{name}")
            self.full[name] = self.layouts[name].unflatten(self.comm.all_gather(new["flat"]))
        self.hold_full_params()


def test_zero2_check_catches_scale_mistakes_and_full_gradients(capsys):
    g1.check_zero2(GoodZeRO2)
    g1.check_zero2(variant(GoodZeRO2, op="avg", scale=1))  # another correct way: torch's ReduceOp.AVG
    assert capsys.readouterr().out.count("PASSED Exercise 1.2") == 2
    with pytest.raises(CheckFailed, match="divide the reduce-scattered sum by the group size"):
        g1.check_zero2(variant(GoodZeRO2, scale=1))  # forgot /n
    with pytest.raises(CheckFailed, match="divide the reduce-scattered sum by the group size"):
        g1.check_zero2(variant(GoodZeRO2, op="avg"))  # divided twice
    with pytest.raises(CheckFailed, match="keeps only this rank's slices"):
        g1.check_zero2(variant(GoodZeRO2, keep_full=True))


def test_zero3_check_ties_holding_to_use_and_wants_prefetch(capsys):
    from emulator.parallel import ZeRO3

    class Good(ZeRO3):  # the library's algorithm, under the student's name: not refused
        def __init__(self, comm, model, params, opt):
            super().__init__(comm, model, params, opt, prefetch=True)

    Good.__init__.__qualname__ = "Good.__init__"
    # the library class itself refuses while its exercise is checked: build from the base
    with pytest.raises(CheckFailed, match="library's own solution"):
        g1.check_zero3(Good)

    class Student(DataParallelStrategy):
        prefetch, early_release = True, False

        def __init__(self, comm, model, params, opt):
            super().__init__(comm, model, params, opt)
            self.my = self.slices_of_full()
            self.full = None
            self.memory.hold("params", self.my, "params")
            self.state = self.sharded_optimizer(self.my)
            self.slices, self.pending = {}, {}

        def _gather(self, name, upcoming):
            h = self.pending.pop(name, None) or self.comm.all_gather(self.my[name], async_op=True)
            if self.prefetch and upcoming is not None and upcoming not in self.pending:
                self.pending[upcoming] = self.comm.all_gather(self.my[upcoming], async_op=True)
            full = self.memory.hold(f"g:{name}", h.wait(), "buffers")
            if self.early_release:
                self.memory.release(f"g:{name}")
            return self.layouts[name].unflatten(full)

        params_for_forward = params_for_backward = _gather

        def after_forward(self, name):
            if not self.early_release:
                self.memory.release(f"g:{name}")

        def grads_ready(self, name, grads, last):
            if not self.early_release:
                self.memory.release(f"g:{name}")
            self.slices[name] = self.comm.reduce_scatter(self.layouts[name].flatten(grads)) / self.comm.size
            self.memory.hold(f"grads:{name}", self.slices[name], "grads")

        def step(self):
            for name in self.names:
                new, self.state[name] = self.opt.step({"flat": self.my[name]}, {"flat": self.slices.pop(name)},
                                                      self.state[name])
                self.memory.release(f"grads:{name}")
                self.my[name] = new["flat"]

        def shards(self):
            return dict(self.my)

    g1.check_zero3(Student)
    assert "PASSED Exercise 1.3" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="not in this rank's ledger"):
        g1.check_zero3(type("Early", (Student,), {"early_release": True}))
    with pytest.raises(CheckFailed, match="prefetch the next layer"):
        g1.check_zero3(type("NoPrefetch", (Student,), {"prefetch": False}))


def test_problem_8_1_checks_every_part_and_other_numbers(capsys):
    def right(n_params=30e9, dp_size=16, gpu_gb=80):
        p, k, d = 2 * n_params / 1e9, 12 * n_params / 1e9, dp_size
        parts = {0: (p, p, k), 1: (p, p, k / d), 2: (p, p / d, k / d), 3: (p / d, p / d, k / d)}
        return parts, [z for z, v in parts.items() if sum(v) <= gpu_gb]

    g1.problem_8_1(right)
    assert "PASSED Problem 8.1" in capsys.readouterr().out
    answer = right()

    with pytest.raises(CheckFailed, match="n_params=7e"):
        g1.problem_8_1(lambda n_params=30e9, dp_size=16, gpu_gb=80: answer)  # hard-coded
    def shards_params_at_stage_2(n_params=30e9, dp_size=16, gpu_gb=80):
        parts, fits = right(n_params, dp_size, gpu_gb)
        p, g, k = parts[2]
        return {**parts, 2: (p / dp_size, g, k)}, fits

    with pytest.raises(CheckFailed, match="stage 2 params.*recheck which parts stage 2 shards"):
        g1.problem_8_1(shards_params_at_stage_2)
    from emulator.accounting import zero_bytes_per_gpu

    def library(n_params=30e9, dp_size=16, gpu_gb=80):
        parts = {z: tuple(getattr(zero_bytes_per_gpu(n_params, dp_size, z), k) / 1e9
                          for k in ("params", "grads", "optimizer")) for z in range(4)}
        return parts, [z for z, v in parts.items() if sum(v) <= gpu_gb]

    with pytest.raises(CheckFailed, match="library's own solution"):
        g1.problem_8_1(library)
