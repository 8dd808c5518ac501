"""The numbers each student gets: one function per problem, ``rng -> {name: value}``, drawn
from a generator keyed by the student's id and the problem's label (:func:`rng_for`), so
a sheet can be made again and graded later without storing anything."""

import hashlib
from fractions import Fraction

import numpy as np

from ..accounting.failures import goodput_daly, goodput_first_order


def rng_for(student, problem):
    """The random numbers of ``problem`` for ``student``: the same on every machine, every time."""
    seed = int.from_bytes(hashlib.sha256(f"{student}/{problem}".encode()).digest()[:8], "little")
    return np.random.default_rng(seed)


def _pick(rng, options):
    return options[int(rng.integers(len(options)))]


def napkin_0_1(rng):
    n_params = _pick(rng, [1.3e9, 7.5e9, 13e9, 34e9, 70e9])
    nodes = _pick(rng, [2, 4, 8, 16])
    return {"n_params": n_params, "n_gpus": 8 * nodes, "gpus_per_node": 8}


def napkin_0_2(rng):
    n = _pick(rng, [4, 8, 16, 32])
    nbytes = _pick(rng, [256e6, 512e6, 1e9, 2e9])
    target = float(rng.uniform(300e9, 380e9))  # a plausible bus bandwidth, in bytes/s
    seconds = float(np.round(nbytes * 2 * (n - 1) / n / target, 6))
    return {"n": n, "nbytes": nbytes, "seconds": seconds}


def napkin_0_3(rng):
    return {"n": _pick(rng, [4, 8, 16]), "alpha": _pick(rng, [1e-6, 2e-6, 3e-6, 5e-6]),
            "beta": _pick(rng, [150e9, 300e9, 370e9, 450e9])}


def problem_8_1(rng):
    return {"n_params": _pick(rng, [7e9, 13e9, 30e9, 70e9, 175e9]), "dp_size": _pick(rng, [8, 16, 32, 64, 128]),
            "gpu_gb": _pick(rng, [40, 80, 141])}


def problem_8_2(rng):
    """(p-1)/target is never whole, so rounding the count down instead of up is wrong."""
    while True:
        p, target = _pick(rng, [6, 8, 12, 16, 24, 32]), _pick(rng, [0.03, 0.04, 0.06, 0.07, 0.08, 0.09])
        if (Fraction(p - 1) / Fraction(str(target))).denominator != 1:
            return {"p": p, "target": target, "seqs_per_micro": _pick(rng, [1, 2, 4, 8])}


def napkin_3_1(rng):
    """Two budgets: ``budget`` holds fewer than p micro-batches (1F1B gains nothing over
    GPipe), ``budget_2`` more than the batch has (GPipe stops at max_m)."""
    p = _pick(rng, [4, 6, 8, 12, 16])
    per = _pick(rng, [0.5e9, 1e9, 2e9, 3e9])
    max_m = _pick(rng, [64, 128, 256, 512])
    return {"p": p, "per_micro_batch": per, "budget": per * (int(rng.integers(p // 2, p)) + 0.5),
            "budget_2": per * (max_m + int(rng.integers(1, max_m))) + 0.5 * per, "max_m": max_m}


def problem_8_3(rng):
    return {"b": _pick(rng, [1, 2, 4, 8]), "s": _pick(rng, [2048, 4096, 8192]),
            "h": _pick(rng, [4096, 5120, 8192, 12288]), "t": _pick(rng, [2, 4, 8])}


def problem_8_4(rng):
    h, a = _pick(rng, [(5120, 40), (8192, 64), (12288, 96)])
    return {"h": h, "a": a, "L": _pick(rng, [40, 60, 80, 96]), "s": _pick(rng, [2048, 4096, 8192]),
            "b": _pick(rng, [1, 2]), "t": _pick(rng, [4, 8])}


def napkin_2_1(rng):
    gpus_per_node = _pick(rng, [4, 8])
    return {"b": _pick(rng, [1, 2, 4]), "s": _pick(rng, [2048, 4096, 8192]), "h": _pick(rng, [4096, 8192, 12288]),
            "t": gpus_per_node * _pick(rng, [1, 2]), "gpus_per_node": gpus_per_node}


def napkin_4_1(rng):
    return {"s": _pick(rng, [65536, 131072, 262144]), "b": 1, "h": _pick(rng, [4096, 8192, 16384]),
            "layers": _pick(rng, [32, 80, 126]), "c": _pick(rng, [4, 8, 16, 32])}


def napkin_4_2(rng):
    h, kv_heads, head_dim = _pick(rng, [(16384, 8, 128), (8192, 8, 128), (4096, 8, 128), (4096, 32, 128),
                                        (5120, 8, 128)])  # Llama 3 405B, 70B, 8B, an MHA model, a 13B-sized GQA
    return {"flops": _pick(rng, [312e12, 989e12]), "beta": _pick(rng, [48e9, 250e9, 370e9]),
            "dtype_bytes": _pick(rng, [2, 4]), "h": h, "kv_heads": kv_heads, "head_dim": head_dim}


def napkin_5_1(rng):
    return {"tokens": _pick(rng, [1024, 2048, 4096, 8192]), "d_model": _pick(rng, [2048, 4096, 6144, 7168]),
            "top_k": _pick(rng, [1, 2, 4, 8]), "ep": _pick(rng, [4, 8, 32, 64]), "dtype_bytes": 2}


def napkin_5_2(rng):
    return {"tokens": _pick(rng, [1024, 4096, 8192]), "top_k": _pick(rng, [1, 2, 8]),
            "n_experts": _pick(rng, [4, 8, 64]), "capacity_factor": _pick(rng, [1.0, 1.25, 1.5, 2.0]),
            "hot_share": _pick(rng, [0.1, 0.2, 0.3, 0.5])}


def napkin_6_1(rng):
    return {"n_params": _pick(rng, [13e9, 70e9, 175e9, 405e9]), "dp": _pick(rng, [4, 8, 16, 64, 128]),
            "tp": _pick(rng, [2, 4, 8]), "pp": _pick(rng, [1, 2, 4, 8, 16])}


def napkin_6_2(rng):
    return {"flops": _pick(rng, [312e12, 989e12]), "bandwidth": _pick(rng, [24e9, 48e9, 96e9, 370e9]),
            "dp": _pick(rng, [2, 8, 32, 128, 1024]), "grad_bytes": _pick(rng, [2, 4])}


def napkin_6_3(rng):
    positions = _pick(rng, [4096, 8192])
    tp, pp = _pick(rng, [(8, 16), (8, 8), (4, 8)])
    cp = _pick(rng, [4, 8, 16])
    dp = _pick(rng, [4, 8, 16])
    seq = positions * cp
    return {"seq": seq, "tokens": seq * dp * _pick(rng, [4, 8, 16]), "positions_per_gpu": positions,
            "gpus": tp * pp * cp * dp, "tp": tp, "pp": pp}


def napkin_7_1(rng):
    return {"gpus": _pick(rng, [2048, 4096, 8192, 16384, 32768, 65536]), "timeout_minutes": _pick(rng, [2, 5, 10, 30])}


def napkin_7_2(rng):
    """Numbers for which the first-order goodput is within 1% of Daly's (both are accepted)."""
    while True:
        p = {"gpus": _pick(rng, [2048, 4096, 8192, 16384, 32768]), "gpu_mtbf_hours": _pick(rng, [30000, 50000, 80000]),
             "interval_minutes": _pick(rng, [10, 15, 20, 30, 60]), "save_seconds": _pick(rng, [10, 30, 60, 120]),
             "restart_minutes": _pick(rng, [2, 5, 10, 15])}
        if abs(goodput_first_order(**p) / goodput_daly(**p) - 1) < 0.01:
            return p
