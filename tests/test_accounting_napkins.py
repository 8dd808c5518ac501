"""The napkins' model answers, as accounting formulas: the numbers the lessons' checks print."""

import pytest

from emulator import accounting as A
from emulator.accounting import activations
from emulator.grading import lesson02, lesson03, lesson04, lesson06, lesson07
from emulator.grading.refuse import Refused


def test_all_reduce_times_on_h100_nodes():
    flat, channels = A.gradient_all_reduce_seconds(7.5e9, 64, 8)
    assert flat == pytest.approx(0.6159, rel=1e-3) and channels == pytest.approx(0.07753, rel=1e-3)
    assert A.activation_all_reduce_seconds(1, 4096, 8192, 16, 8) == pytest.approx(4.777e-4, rel=1e-3)
    assert A.all_reduce_busbw_gb(8, 1e9, 4.73e-3) == pytest.approx(370, rel=1e-3)
    assert A.latency_crossover_bytes(8, 2e-6, 370e9) == pytest.approx(5.92e6, rel=1e-3)


def test_context_parallel():
    per_layer, total = A.cp_activation_bytes(131072, 1, 8192, 80, 16)
    assert per_layer == 34 * 8192 * 8192 and total == 80 * per_layer
    assert A.ring_overlap_positions() == pytest.approx(167.1, rel=1e-3)
    assert A.ring_overlap_positions(beta=48e9) == pytest.approx(1288, rel=1e-3)
    assert A.cp_dp_split(131072, 16 * 2**20, 8192, 16384, 8, 16) == (16, 8, 16)


def test_memory_and_traffic():
    assert A.zero1_state_gb(70e9, 4, 8, 2) == pytest.approx((17.5, 13.125))
    assert A.dp_compute_bound_tokens(989e12, 48e9, 64, 2) == pytest.approx(13521, rel=1e-4)
    sp, sp_all, no_sp, no_sp_all = A.selective_activation_bytes(12288, 96, 96, 4096, 1, 8)
    assert sp == activations.activation_bytes_per_layer(4096, 1, 12288, 96, 8, True, "selective")
    assert (sp_all, no_sp_all) == (96 * sp, 96 * no_sp) and no_sp > sp


def test_pipeline():
    assert A.memory_vs_bubble(8, 2e9, 40e9, 256) == (20, pytest.approx(7 / 27), 256, pytest.approx(7 / 263))
    assert A.memory_vs_bubble(16, 2e9, 24e9, 256)[2] == 12  # p micro-batches do not fit: 1F1B runs as many as GPipe
    assert A.bubble_micro_batches(12, 0.05, 4) == (220, 880, 209)


def test_failures():
    assert A.watchdog_gpu_hours(16384, 10) == pytest.approx(2730.67, rel=1e-5)
    assert A.goodput_first_order(16384, 50000, 20, 60, 15) == pytest.approx(0.8135, abs=1e-4)
    assert A.goodput_daly(16384, 50000, 20, 60, 15) == pytest.approx(0.8281, abs=1e-4)


@pytest.mark.parametrize("label, check, formula", [
    ("Napkin 3.1", lesson03.napkin_memory_vs_bubble, A.memory_vs_bubble),
    ("Problem 8.2", lesson03.problem_8_2, A.bubble_micro_batches),
    ("Problem 8.4", lesson02.problem_8_4, A.selective_activation_bytes),
    ("Napkin 4.1", lesson04.napkin_memory, A.cp_activation_bytes),
    ("Napkin 4.2", lesson04.napkin_overlap, A.ring_overlap_positions),
    ("Napkin 6.1", lesson06.napkin_state, A.zero1_state_gb),
    ("Napkin 6.2", lesson06.napkin_dp_tokens, A.dp_compute_bound_tokens),
    ("Napkin 6.3", lesson06.napkin_llama_cp, A.cp_dp_split),
    ("Napkin 7.1", lesson07.napkin_watchdog, A.watchdog_gpu_hours),
    ("Napkin 7.2", lesson07.napkin_goodput, A.goodput_first_order),
    ("Napkin 7.2", lesson07.napkin_goodput, A.goodput_daly),
])
def test_a_napkin_answered_with_the_library_formula_is_refused(label, check, formula):
    with pytest.raises(Refused, match=f"^{label}: your code called the library's own solution"):
        check(lambda **kw: formula(**kw))
