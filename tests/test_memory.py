"""Per-rank memory ledger."""

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import MemoryLedgerError, World


def test_hold_release_peak_by_kind():
    def prog(comm):
        m = comm.memory
        m.hold("w", np.zeros(1000, bfloat16), "params")
        m.hold("g", np.zeros(1000, bfloat16), "grads")
        m.hold("adam", {"m": np.zeros(1000, np.float32), "v": np.zeros(1000, np.float32)}, "optimizer")
        m.hold("act", np.zeros(500 * (comm.rank + 1)), "activations")
        m.release("act")
        m.release("g")
        return m.total

    w = World(2)
    assert w.run(prog) == [10000, 10000]
    rep = w.memory_report()
    assert rep[1]["peak"] == 2000 + 2000 + 8000 + 8000
    assert rep[0]["peak_activations"] == 4000 and rep[1]["current"] == 10000
    assert "peak_optimizer" in repr(rep) and "8.00 KB" in repr(rep)


def test_ledger_misuse_names_the_rank():
    def double(comm):
        comm.memory.hold("x", np.zeros(1), "params")
        comm.memory.hold("x", np.zeros(1), "params")

    with pytest.raises(MemoryLedgerError, match="rank 0: 'x' is already held"):
        World(1).run(double)
    with pytest.raises(MemoryLedgerError, match="rank 0: release\\('y'\\)"):
        World(1).run(lambda c: c.memory.release("y"))
    with pytest.raises(MemoryLedgerError, match="unknown memory kind"):
        World(1).run(lambda c: c.memory.hold("z", np.zeros(1), "weights"))


def test_history_follows_the_simulated_clock():
    def prog(comm):
        comm.memory.hold("a", np.zeros(10), "activations")
        comm.compute(seconds=1.0)
        comm.memory.release("a")
        return comm.memory.history

    hist = World(1).run(prog)[0]
    assert hist == [(0.0, 0), (0.0, 80), (1.0, 0)]
