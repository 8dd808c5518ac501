import pytest

from emulator.accounting import zero_bytes_per_gpu, zero_traffic_per_gpu


def gb(stage, psi, n):
    return zero_bytes_per_gpu(psi, n, stage) / 1e9


def test_seed_table_7p5b_on_64_gpus():
    assert [round(gb(s, 7.5e9, 64), 1) for s in range(4)] == [120.0, 31.4, 16.6, 1.9]


def test_problem_8_1_30b_on_16_gpus():
    got = [gb(s, 30e9, 16) for s in range(4)]
    assert got == pytest.approx([480, 142.5, 86.25, 30])
    assert [g <= 80 for g in got] == [False, False, False, True]  # only ZeRO-3 fits


def test_parts_and_traffic():
    b = zero_bytes_per_gpu(1e9, 4, 2)
    assert (b.params, b["grads"], b.optimizer) == (2e9, 0.5e9, 3e9) and b == 5.5e9
    assert zero_traffic_per_gpu(1e9, 4, 3) == pytest.approx(1.5 * zero_traffic_per_gpu(1e9, 4, 1))


@pytest.mark.parametrize("args,msg", [((1e9, 0, 1), "dp_size"), ((1e9, 8, 4), "stage"), ((0, 8, 1), "n_params"),
                                      ((1e9, 2.5, 1), "dp_size")])
def test_bad_arguments(args, msg):
    with pytest.raises(ValueError, match=msg):
        zero_bytes_per_gpu(*args)
