"""The lesson checks reject wrong answers (every way found to game them), with a message
saying what is wrong, and accept other correct answers."""

import numpy as np
import pytest

from emulator.algorithms import global_view as C
from emulator.grading import CheckFailed
from emulator.grading import lesson00 as g


def naive_reduce_scatter(bufs, net):
    """Right answer, wrong algorithm: everyone sends everything to everyone."""
    n = len(bufs)
    if n > 1:
        net.exchange([(s, d, bufs[s]) for s in range(n) for d in range(n) if s != d])
    total = np.sum(bufs, axis=0)
    return np.split(total, n)


def global_sum_with_fake_exchanges(bufs, net):
    """Sums in the global view, then makes n-1 ring-shaped exchanges of the right size."""
    n = len(bufs)
    for _ in range(n - 1):
        net.exchange([(r, (r + 1) % n, np.zeros(len(bufs[0]) // n)) for r in range(n)])
    return np.split(np.sum(bufs, axis=0), n)


def direct_all_gather(shards, net):
    """n-1 steps of the right size, but rank r sends its own shard to r+s: not a ring."""
    n = len(shards)
    have = [[None] * n for _ in range(n)]
    for r in range(n):
        have[r][r] = shards[r]
    for s in range(1, n):
        for (src, dst), data in zip([(r, (r + s) % n) for r in range(n)],
                                    net.exchange([(r, (r + s) % n, shards[r]) for r in range(n)])):
            have[dst][src] = data
    return [np.concatenate(row) for row in have]


def another_correct_reduce_scatter(bufs, net):
    """A correct ring written differently: one array per rank, chunks indexed on the fly."""
    n = len(bufs)
    acc = [b.copy() for b in bufs]
    q = len(bufs[0]) // n
    for s in range(n - 1):
        sends = [(r, (r + 1) % n, acc[r][((r - s - 1) % n) * q:((r - s) % n or n) * q]) for r in range(n)]
        for (src, dst, _), data in zip(sends, net.exchange(sends)):
            c = (src - s - 1) % n
            acc[dst][c * q:(c + 1) * q] += data
    return [acc[r][r * q:(r + 1) * q] for r in range(n)]


def test_reduce_scatter_check_counts_bytes():
    with pytest.raises(CheckFailed, match="rank 0 sent to rank 2|rank 0 sent .* bytes|steps"):
        g.check_ring_reduce_scatter(naive_reduce_scatter)


def test_reduce_scatter_check_catches_wrong_values():
    with pytest.raises(CheckFailed, match="differ from the reference"):
        g.check_ring_reduce_scatter(lambda bufs, net: np.split(bufs[0], len(bufs)))


def test_results_must_come_from_the_messages():
    with pytest.raises(CheckFailed, match="changed in flight and your result did not change"):
        g.check_ring_reduce_scatter(global_sum_with_fake_exchanges)


def test_a_ring_talks_to_its_neighbour_only():
    with pytest.raises(CheckFailed, match="a ring only talks to its right neighbour"):
        g.check_ring_all_gather(direct_all_gather)


def test_the_library_refuses_while_its_exercise_is_checked():
    with pytest.raises(CheckFailed, match="Exercise 0.1: your code called the library's own solution"):
        g.check_ring_reduce_scatter(lambda bufs, net: C.ring_reduce_scatter(bufs))
    assert C.ring_reduce_scatter([np.ones(2)] * 2)[0].tolist() == [2.0]  # and works again afterwards


def test_another_correct_answer_passes(capsys):
    g.check_ring_reduce_scatter(another_correct_reduce_scatter)
    assert "PASSED Exercise 0.1" in capsys.readouterr().out


def test_spmd_check_refuses_library_collectives_and_reports_deadlock():
    with pytest.raises(CheckFailed, match="point-to-point calls only"):
        g.check_spmd_ring_all_reduce(lambda comm, x: comm.all_reduce(x))

    def send_then_recv(comm, x):
        if comm.size > 1:
            comm.send(x, (comm.rank + 1) % comm.size)
            comm.recv((comm.rank - 1) % comm.size)
        return x

    with pytest.raises(CheckFailed, match="deadlock"):
        g.check_spmd_ring_all_reduce(send_then_recv)
    from emulator.algorithms.p2p_ring import ring_all_reduce_p2p

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_spmd_ring_all_reduce(ring_all_reduce_p2p)


def test_spmd_ring_with_non_neighbour_peers_fails():
    """Right sums, right counts and bytes, but chunks go straight to their owners: not a ring."""
    from emulator import P2POp

    def direct(comm, x):
        n, r = comm.size, comm.rank
        chunks = np.split(x, n)
        for s in range(1, n):  # reduce-scatter: send chunk r+s to its owner r+s, receive mine from r-s
            buf = np.empty_like(chunks[r])
            hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[(r + s) % n], (r + s) % n),
                                         P2POp(comm.irecv, buf, (r - s) % n)])
            for h in hs:
                h.wait()
            chunks[r] = chunks[r] + buf
        for s in range(1, n):  # all-gather: send my chunk to r+s, receive r-s's
            buf = np.empty_like(chunks[r])
            hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[r], (r + s) % n),
                                         P2POp(comm.irecv, buf, (r - s) % n)])
            for h in hs:
                h.wait()
            chunks[(r - s) % n] = buf
        return np.concatenate(chunks)

    with pytest.raises(CheckFailed, match="a ring only talks to its right neighbour"):
        g.check_spmd_ring_all_reduce(direct)


def per_op_ring(comm, x):
    """The ring with batch_isend_irecv read as one handle per operation (its receive's
    wait() taken for the data): on NCCL, as here, the batch has one handle."""
    from emulator import P2POp

    n, r = comm.size, comm.rank
    chunks = np.split(x, n)
    for s in range(n - 1):
        c = (r - s - 2) % n
        hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[(r - s - 1) % n], (r + 1) % n),
                                     P2POp(comm.irecv, np.empty_like(chunks[c]), (r - 1) % n)])
        chunks[c] = chunks[c] + hs[1].wait()
    for s in range(n - 1):
        hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[(r - s) % n], (r + 1) % n),
                                     P2POp(comm.irecv, np.empty_like(chunks[0]), (r - 1) % n)])
        chunks[(r - s - 1) % n] = hs[1].wait()
    return np.concatenate(chunks)


def test_spmd_ring_reading_one_handle_per_operation_fails_and_says_why():
    with pytest.raises(CheckFailed, match=r"n=2: the program failed(.|\n)*IndexError(.|\n)*returns a list holding "
                                          r"one handle for the whole batch"):
        g.check_spmd_ring_all_reduce(per_op_ring)


def test_spmd_ring_in_even_odd_order_passes(capsys):
    def even_odd(comm, x):
        n, r = comm.size, comm.rank
        chunks = np.split(x, n)
        right, left = (r + 1) % n, (r - 1) % n

        def exchange(chunk):
            if r % 2 == 0:
                comm.send(chunk, right)
                return comm.recv(left)
            got = comm.recv(left)
            comm.send(chunk, right)
            return got

        if n == 1:
            return x
        for s in range(n - 1):
            c = (r - s - 2) % n
            chunks[c] = chunks[c] + exchange(chunks[(r - s - 1) % n])
        for s in range(n - 1):
            chunks[(r - s - 1) % n] = exchange(chunks[(r - s) % n])
        return np.concatenate(chunks)

    g.check_spmd_ring_all_reduce(even_odd)  # odd n too: an odd rank receives first and breaks the cycle
    assert "PASSED Exercise 0.4" in capsys.readouterr().out


def test_napkins_with_hard_coded_numbers_fail():
    with pytest.raises(CheckFailed, match="n=16"):
        g.napkin_bus_bandwidth(lambda n=8, nbytes=1e9, seconds=4.73e-3: 370.0)
    with pytest.raises(CheckFailed, match=r"^Napkin 0\.2: expected 370 GB/s, got 211\.4 GB/s \(the check allows 2%\)"):
        g.napkin_bus_bandwidth(lambda n=8, nbytes=1e9, seconds=4.73e-3: nbytes / seconds / 1e9)  # algbw
    with pytest.raises(CheckFailed, match="not 'NVLink'"):
        g.napkin_gradient_all_reduce(lambda n_params=7.5e9, n_gpus=64, gpus_per_node=8: (0.6, 0.08, "NVLink"))
    with pytest.raises(CheckFailed, match="n=4"):
        g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: 5.92e6)
    from emulator.cost import crossover_bytes
    from emulator.machine.topology import Link

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: crossover_bytes(n, Link("l", alpha, beta)))
    g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: n * alpha * beta)


# ----------------------------------------------------------------------------- lesson 01
from emulator.parallel.base import DataParallelStrategy  # noqa: E402
from emulator.grading import lesson01 as g1  # noqa: E402


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
