"""Batch size as a resource (:mod:`emulator.accounting.batch_size`, lesson 01's sweep): small
batches are noise-limited (doubling B about halves the steps), past the critical batch the
steps stop falling and the examples consumed grow; the fit of steps = S_min (1 + B_crit / B)
recovers a known curve exactly; a target no learning rate reaches is refused with a message."""

import numpy as np
import pytest

from emulator.accounting import batch_size
from emulator.errors import ConfigError


def test_small_batches_trade_steps_for_examples_and_large_ones_stop_paying():
    sweep = batch_size.critical_batch_sweep()
    steps, examples, B = sweep["steps"], sweep["examples"], sweep["batch"]
    assert np.all(np.diff(steps) <= 0)  # more batch never needs more steps
    assert steps[0] / steps[3] > 4  # B = 1 -> 8: noise-limited, close to the 8x of pure noise
    assert steps[-2] / steps[-1] < 1.5  # B = 256 -> 512: near the floor of exact gradients
    assert examples[-1] > 3 * examples.min()  # past the critical batch, examples are wasted
    assert B[1] < sweep["b_crit"] < B[-2] and 0 < sweep["s_min"] <= steps.min()


def test_the_fit_recovers_a_known_curve(monkeypatch):
    s_min, b_crit = 40.0, 24.0
    monkeypatch.setattr(batch_size, "steps_to_target", lambda b, **kw: (s_min * (1 + b_crit / b), 0.1))
    sweep = batch_size.critical_batch_sweep((1, 4, 16, 64, 256))
    assert sweep["s_min"] == pytest.approx(s_min, rel=1e-9)
    assert sweep["b_crit"] == pytest.approx(b_crit, rel=1e-9)
    assert sweep["examples"] == pytest.approx(sweep["steps"] * sweep["batch"])


def test_the_learning_rate_grid_is_searched_and_a_target_out_of_reach_is_refused():
    steps, lr = batch_size.steps_to_target(8)
    one_lr, _ = batch_size.steps_to_target(8, lrs=[0.01])  # the grid's smallest rate alone
    assert steps < one_lr and lr > 0.01
    with pytest.raises(ConfigError, match="no learning rate reached the target within 5 steps at batch 4"):
        batch_size.steps_to_target(4, max_steps=5)
