"""Per-student variants of the napkin problems and Problems 8.1 to 8.4, and their model answers.

Each student gets the same problems with other numbers, drawn from their id (so a sheet
can be made again and graded later without storing anything). The model answers are the
functions the notebook checks compare with. ``tools/problem_set.py`` writes the sheets
and grades answer files.
"""

import hashlib
from fractions import Fraction

import numpy as np

from ..accounting import activations, micro_batches_for_bubble, moe, zero_bytes_per_gpu
from ..accounting.context_parallel import cp_activation_bytes as memory_128k, cp_dp_split as llama_cp_switch
from ..accounting.context_parallel import ring_overlap_positions as overlap_length
from ..accounting.failures import goodput_daly as _goodput_daly, goodput_first_order as _goodput_first_order
from ..accounting.failures import watchdog_gpu_hours
from ..accounting.memory import zero1_state_gb as state_per_gpu
from ..accounting.pipeline import memory_vs_bubble
from ..accounting.traffic import dp_compute_bound_tokens
from ..cost import busbw, collective_time, crossover_bytes
from ..machine.topology import Link, Topology

TOLERANCE = 0.02


def _rng(student, problem):
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
        if abs(_goodput_first_order(**p) / _goodput_daly(**p) - 1) < 0.01:
            return p


PROBLEMS = {
    "Napkin 0.1": (napkin_0_1, "A model of {n_params:g} parameters keeps bf16 gradients. Data parallelism over "
                               "{n_gpus} GPUs, {gpus_per_node} per node (one 400G NIC per GPU), all-reduces them "
                               "once per step. Seconds with one flat ring (one channel), and with a channel per "
                               "NIC? Answer: [flat seconds, channels seconds]."),
    "Napkin 0.2": (napkin_0_2, "nccl-tests ran all_reduce_perf on {n} GPUs; for {nbytes:g} bytes per rank it "
                               "measured {seconds:g} s. What bus bandwidth does it print, in GB/s?"),
    "Napkin 0.3": (napkin_0_3, "Below what message size (bytes per rank) does a ring all-reduce on {n} GPUs of one "
                               "node, over a link of alpha = {alpha:g} s and beta = {beta:g} bytes/s, spend more "
                               "time on latency than on bandwidth?"),
    "Problem 8.1": (problem_8_1, "A model of {n_params:g} parameters trains with 16 bytes per parameter (bf16 "
                                 "parameters and gradients, fp32 master weights and Adam moments) on {dp_size} GPUs. "
                                 "GB per GPU (1 GB = 1e9 bytes) for parameters, gradients and optimizer state under "
                                 "ZeRO stages 0 to 3, and which stages fit in {gpu_gb} GB? Answer: "
                                 "{{\"0\": [params, grads, optimizer], ..., \"3\": [...], \"fits\": [stages]}}."),
    "Problem 8.2": (problem_8_2, "A model is pipelined over {p} stages. How many micro-batches keep the bubble at or "
                                 "under {target:g} of the ideal step ((p-1)/m)? With {seqs_per_micro} sequences per "
                                 "micro-batch, how many sequences per step? And how many micro-batches keep the idle "
                                 "share of the whole step ((p-1)/(m+p-1)) at or under {target:g}? Answer: "
                                 "[micro-batches, sequences, micro-batches]."),
    "Napkin 3.1": (napkin_3_1, "A {p}-stage pipeline's first stage can spend {budget:g} bytes on activations; one "
                               "micro-batch costs it {per_micro_batch:g} bytes; the global batch allows at most "
                               "{max_m} micro-batches. The most micro-batches GPipe can run and its bubble (idle share "
                               "of the step), then the same for 1F1B. Then again with {budget_2:g} bytes. Answer: "
                               "[m, bubble, m, bubble] for the first budget, then the same four for the second."),
    "Problem 8.3": (problem_8_3, "A transformer layer of width {h} runs micro-batches of {b} sequences of {s} tokens in "
                                 "bf16. Bytes each GPU sends per layer (forward and backward) with tensor parallelism "
                                 "over {t} GPUs, and bytes of activations one pipeline boundary passes forward per "
                                 "micro-batch? Answer: "
                                 "[TP bytes, PP bytes]."),
    "Problem 8.4": (problem_8_4, "A model of {L} layers, width {h}, {a} heads, trains on {s}-token sequences, micro-batch "
                                 "{b}, tensor parallelism over {t} GPUs, selective recomputation, bf16 activations "
                                 "(Korthikanti et al.'s accounting). Bytes of activations per layer per GPU and for all "
                                 "layers, with sequence parallelism, then without. Answer: [layer SP, all SP, layer, "
                                 "all]."),
    "Napkin 2.1": (napkin_2_1, "Tensor parallelism over {t} GPUs, {gpus_per_node} per node (NVLink inside, one NIC per "
                               "GPU, a channel per NIC), all-reduces the bf16 activations of {b} x {s} tokens of width "
                               "{h}. Seconds per all-reduce, with lesson 00's ring model and link numbers?"),
    "Napkin 4.1": (napkin_4_1, "A model of {layers} layers and width {h} keeps 34 s b h bytes of bf16 activations per "
                               "layer for a whole sequence (scores never stored). A batch of {b} sequence(s) of {s} "
                               "tokens runs with context parallelism over {c} GPUs. Bytes per GPU per layer and for all "
                               "layers? Answer: [per layer, all layers]."),
    "Napkin 4.2": (napkin_4_2, "A model of width h = {h} uses grouped-query attention: {kv_heads} K/V heads of "
                               "{head_dim}. A ring-attention step on n local positions computes 4 b n^2 h FLOPs and "
                               "sends the K and V of n positions, {dtype_bytes} bytes per value. At {flops:g} FLOP/s and "
                               "{beta:g} bytes/s, from how many positions per rank does the compute take as long as "
                               "the transfer?"),
    "Napkin 5.1": (napkin_5_1, "An MoE layer routes each of {tokens} tokens on a GPU (width {d_model}, {dtype_bytes} "
                               "bytes per value) to top-{top_k} experts spread evenly over {ep} GPUs. Bytes the GPU "
                               "sends per layer in the forward dispatch and combine?"),
    "Napkin 5.2": (napkin_5_2, "{tokens} tokens, top-{top_k}, {n_experts} experts, capacity factor {capacity_factor:g} "
                               "(capacity ceil(c T k / E) per expert). One expert receives {hot_share:g} of all "
                               "assignments and the others share the rest evenly. How many assignments are dropped? "
                               "(within one assignment)"),
    "Napkin 6.1": (napkin_6_1, "A model of {n_params:g} parameters trains with TP {tp} x PP {pp}, ZeRO-1 over DP "
                               "{dp}, bf16 parameters and gradients and mixed-precision Adam (12 bytes of state per "
                               "parameter). GB per GPU (1 GB = 1e9 bytes) of parameters and gradients together, and "
                               "of optimizer state? Answer: [params and grads, optimizer]."),
    "Napkin 6.2": (napkin_6_2, "GPUs compute {flops:g} FLOP/s; each replica's gradients ({grad_bytes} bytes per "
                               "parameter) are all-reduced with a ring over {dp} replicas at {bandwidth:g} bytes/s "
                               "per GPU. With 6 FLOPs per parameter per token, how many tokens per replica per step "
                               "make the compute last as long as the all-reduce?"),
    "Napkin 6.3": (napkin_6_3, "A run on {gpus} GPUs with TP {tp} and PP {pp} trains on sequences of {seq} tokens, "
                               "{tokens} tokens per step; context parallelism leaves each GPU {positions_per_gpu} "
                               "positions. CP, DP and sequences per data-parallel replica per step? Answer: [cp, dp, "
                               "sequences] (whole numbers)."),
    "Napkin 7.1": (napkin_7_1, "A rank of a {gpus}-GPU job dies; every other GPU waits in its collective until its "
                               "watchdog fires after {timeout_minutes} minutes. How many GPU-hours are spent waiting?"),
    "Napkin 7.2": (napkin_7_2, "{gpus} GPUs each fail once every {gpu_mtbf_hours} hours on average. The job saves a "
                               "checkpoint every {interval_minutes} minutes, which stops training for {save_seconds} s; "
                               "each failure costs {restart_minutes} minutes to detect and restart, plus the work since "
                               "the last checkpoint. Goodput (share of time making progress), to first order?"),
}

# In the order the lessons pose them (Problem 8.1 in lesson 01, 8.3 and 8.4 in 02, 8.2 in 03).
PROBLEMS = {k: PROBLEMS[k] for k in ("Napkin 0.1", "Napkin 0.2", "Napkin 0.3", "Problem 8.1", "Problem 8.3",
                                     "Napkin 2.1", "Problem 8.4", "Problem 8.2", "Napkin 3.1", "Napkin 4.2",
                                     "Napkin 4.1", "Napkin 5.1", "Napkin 5.2", "Napkin 6.1", "Napkin 6.2",
                                     "Napkin 6.3", "Napkin 7.1", "Napkin 7.2")}


def variant(student, problem):
    """The numbers of ``problem`` for ``student``."""
    return PROBLEMS[problem][0](_rng(student, problem))


def statement(student, problem):
    return PROBLEMS[problem][1].format(**variant(student, problem))


def model_answer(problem, p):
    if problem == "Napkin 0.1":
        topo = Topology(gpus_per_node=p["gpus_per_node"])
        return [collective_time("all_reduce", 2 * p["n_params"], p["n_gpus"], topo, channels=c) for c in (1, None)]
    if problem == "Napkin 0.2":
        return busbw("all_reduce", p["nbytes"], p["n"], p["seconds"]) / 1e9
    if problem == "Napkin 0.3":
        return crossover_bytes(p["n"], Link("link", p["alpha"], p["beta"]))
    if problem == "Problem 8.2":
        m = micro_batches_for_bubble(p["p"], p["target"], of="ideal")
        return [m, m * p["seqs_per_micro"], micro_batches_for_bubble(p["p"], p["target"], of="total")]
    if problem == "Napkin 3.1":
        one = {k: v for k, v in p.items() if k != "budget_2"}
        return list(memory_vs_bubble(**one)) + list(memory_vs_bubble(**dict(one, budget=p["budget_2"])))
    if problem == "Problem 8.3":
        return [activations.tp_bytes_per_layer(**p, dtype_bytes=2), activations.pp_bytes_per_boundary(
            p["b"], p["s"], p["h"], 2)]
    if problem == "Problem 8.4":
        per = [activations.activation_bytes_per_layer(p["s"], p["b"], p["h"], p["a"], p["t"], sp, "selective")
               for sp in (True, False)]
        return [per[0], p["L"] * per[0], per[1], p["L"] * per[1]]
    if problem == "Napkin 2.1":
        return collective_time("all_reduce", 2 * p["b"] * p["s"] * p["h"], p["t"],
                               Topology(gpus_per_node=p["gpus_per_node"]))
    if problem == "Napkin 4.1":
        return list(memory_128k(**p))
    if problem == "Napkin 4.2":
        return overlap_length(**p)
    if problem == "Napkin 5.1":
        return moe.all_to_all_bytes_per_layer(**p)
    if problem == "Napkin 5.2":
        return moe.expected_drops(**p)
    if problem == "Napkin 6.1":
        return list(state_per_gpu(**p))
    if problem == "Napkin 6.2":
        return dp_compute_bound_tokens(**p)
    if problem == "Napkin 6.3":
        return list(llama_cp_switch(**p))
    if problem == "Napkin 7.1":
        return watchdog_gpu_hours(**p)
    if problem == "Napkin 7.2":
        return _goodput_first_order(**p)
    parts = {z: zero_bytes_per_gpu(p["n_params"], p["dp_size"], z) for z in range(4)}
    answer = {str(z): [b.params / 1e9, b.grads / 1e9, b.optimizer / 1e9] for z, b in parts.items()}
    answer["fits"] = [z for z, b in parts.items() if b / 1e9 <= p["gpu_gb"]]
    return answer


def _close(got, want):
    try:
        return abs(float(got) - want) <= TOLERANCE * abs(want)
    except (TypeError, ValueError):
        return False


def grade_answer(problem, p, answer):
    """(right?, what is wrong) for one student's answer to ``problem`` with numbers ``p``."""
    want = model_answer(problem, p)
    if problem == "Problem 8.1":
        if not isinstance(answer, dict):
            return False, "expected a dict {stage: [params, grads, optimizer], 'fits': [...]}"
        for z in range(4):
            got = answer.get(str(z), answer.get(z))
            if not (isinstance(got, (list, tuple)) and len(got) == 3):
                return False, f"stage {z}: expected three numbers"
            for what, g, w in zip(("params", "grads", "optimizer"), got, want[str(z)]):
                if not _close(g, w):
                    return False, f"stage {z} {what}: {g} GB is off by more than {TOLERANCE:.0%}"
        if sorted(answer.get("fits", [])) != want["fits"]:
            return False, f"the stages that fit are not {sorted(answer.get('fits', []))}"
        return True, ""
    if isinstance(want, list):
        if not (isinstance(answer, (list, tuple)) and len(answer) == len(want)):
            return False, f"expected {len(want)} numbers"
        bad = [i for i, (g, w) in enumerate(zip(answer, want)) if not (g == w if isinstance(w, int) else _close(g, w))]
        if not bad:
            return True, ""
        exact = isinstance(want[bad[0]], int)
        return False, f"answer {bad[0] + 1} is {'not the exact count' if exact else f'off by more than {TOLERANCE:.0%}'}"
    if problem == "Napkin 7.2":  # first order, or Daly's exact expectation
        ok = _close(answer, want) or _close(answer, _goodput_daly(**p))
        return ok, "" if ok else f"{answer} is off by more than {TOLERANCE:.0%} (to first order: {want:.4f})"
    if problem == "Napkin 5.2":  # a count that may be 0: one assignment of slack
        try:
            ok = abs(float(answer) - want) <= max(1.0, TOLERANCE * want)
        except (TypeError, ValueError):
            ok = False
        return ok, "" if ok else f"{answer} is not {want:g} (within one assignment)"
    return (_close(answer, want), "" if _close(answer, want) else f"{answer} is off by more than {TOLERANCE:.0%}")
