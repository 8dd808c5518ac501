"""Per-student variants of the napkin problems and Problems 8.1 to 8.4, and their model answers.

Each student gets the same problems with other numbers, drawn from their id (so a sheet
can be made again and graded later without storing anything). A problem is a record of
the registry (:mod:`.problem_registry`): its variant (:mod:`.problem_variants`), its model
answer, a formula of :mod:`emulator.accounting` (:mod:`.problem_answers`), its statement
and how an answer is graded (:mod:`.problem_grades`); the model answers are the formulas
the notebook checks compare with. ``tools/problem_set.py`` writes the sheets and grades
answer files.
"""

from ..accounting import activations, moe
from ..accounting.all_reduce_time import (activation_all_reduce_seconds, all_reduce_busbw_gb,
                                          gradient_all_reduce_seconds, latency_crossover_bytes)
from ..accounting.context_parallel import cp_activation_bytes, cp_dp_split, ring_overlap_positions
from ..accounting.failures import goodput_first_order, watchdog_gpu_hours
from ..accounting.memory import zero1_state_gb
from ..accounting.pipeline import bubble_micro_batches
from ..accounting.traffic import dp_compute_bound_tokens
from . import problem_variants as V
from .problem_answers import listed, tp_and_pp_bytes, two_budgets, zero_stages
from .problem_grades import TOLERANCE, grade_drops, grade_goodput, grade_zero_stages
from .problem_registry import PROBLEMS, Problem, lookup, register
from .problem_variants import (napkin_0_1, napkin_0_2, napkin_0_3, napkin_2_1, napkin_3_1, napkin_4_1, napkin_4_2,
                               napkin_5_1, napkin_5_2, napkin_6_1, napkin_6_2, napkin_6_3, napkin_7_1, napkin_7_2,
                               problem_8_1, problem_8_2, problem_8_3, problem_8_4)

# In the order the lessons pose them (Problem 8.1 in lesson 01, 8.3 and 8.4 in 02, 8.2 in 03).
register("Napkin 0.1", V.napkin_0_1, listed(gradient_all_reduce_seconds), (
    "A model of {n_params:g} parameters keeps bf16 gradients. Data parallelism over {n_gpus} GPUs, "
    "{gpus_per_node} per node (one 400G NIC per GPU), all-reduces them once per step. Seconds with one flat "
    "ring (one channel), and with a channel per NIC? Answer: [flat seconds, channels seconds]."))
register("Napkin 0.2", V.napkin_0_2, all_reduce_busbw_gb, (
    "nccl-tests ran all_reduce_perf on {n} GPUs; for {nbytes:g} bytes per rank it measured {seconds:g} s. "
    "What bus bandwidth does it print, in GB/s?"))
register("Napkin 0.3", V.napkin_0_3, latency_crossover_bytes, (
    "Below what message size (bytes per rank) does a ring all-reduce on {n} GPUs of one node, over a link of "
    "alpha = {alpha:g} s and beta = {beta:g} bytes/s, spend more time on latency than on bandwidth?"))
register("Problem 8.1", V.problem_8_1, zero_stages, (
    "A model of {n_params:g} parameters trains with 16 bytes per parameter (bf16 parameters and gradients, "
    "fp32 master weights and Adam moments) on {dp_size} GPUs. GB per GPU (1 GB = 1e9 bytes) for parameters, "
    "gradients and optimizer state under ZeRO stages 0 to 3, and which stages fit in {gpu_gb} GB? Answer: "
    "{{\"0\": [params, grads, optimizer], ..., \"3\": [...], \"fits\": [stages]}}."), grade=grade_zero_stages)
register("Problem 8.3", V.problem_8_3, tp_and_pp_bytes, (
    "A transformer layer of width {h} runs micro-batches of {b} sequences of {s} tokens in bf16. Bytes each "
    "GPU sends per layer (forward and backward) with tensor parallelism over {t} GPUs, and bytes of "
    "activations one pipeline boundary passes forward per micro-batch? Answer: [TP bytes, PP bytes]."))
register("Napkin 2.1", V.napkin_2_1, activation_all_reduce_seconds, (
    "Tensor parallelism over {t} GPUs, {gpus_per_node} per node (NVLink inside, one NIC per GPU, a channel "
    "per NIC), all-reduces the bf16 activations of {b} x {s} tokens of width {h}. Seconds per all-reduce, "
    "with lesson 00's ring model and link numbers?"))
register("Problem 8.4", V.problem_8_4, listed(activations.selective_activation_bytes), (
    "A model of {L} layers, width {h}, {a} heads, trains on {s}-token sequences, micro-batch {b}, tensor "
    "parallelism over {t} GPUs, selective recomputation, bf16 activations (Korthikanti et al.'s accounting). "
    "Bytes of activations per layer per GPU and for all layers, with sequence parallelism, then without. "
    "Answer: [layer SP, all SP, layer, all]."))
register("Problem 8.2", V.problem_8_2, listed(bubble_micro_batches), (
    "A model is pipelined over {p} stages. How many micro-batches keep the bubble at or under {target:g} of "
    "the ideal step ((p-1)/m)? With {seqs_per_micro} sequences per micro-batch, how many sequences per step? "
    "And how many micro-batches keep the idle share of the whole step ((p-1)/(m+p-1)) at or under {target:g}? "
    "Answer: [micro-batches, sequences, micro-batches]."))
register("Napkin 3.1", V.napkin_3_1, two_budgets, (
    "A {p}-stage pipeline's first stage can spend {budget:g} bytes on activations; one micro-batch costs it "
    "{per_micro_batch:g} bytes; the global batch allows at most {max_m} micro-batches. The most micro-batches "
    "GPipe can run and its bubble (idle share of the step), then the same for 1F1B. Then again with "
    "{budget_2:g} bytes. Answer: [m, bubble, m, bubble] for the first budget, then the same four for the "
    "second."))
register("Napkin 4.2", V.napkin_4_2, ring_overlap_positions, (
    "A model of width h = {h} uses grouped-query attention: {kv_heads} K/V heads of {head_dim}. A "
    "ring-attention step on n local positions computes 4 b n^2 h FLOPs and sends the K and V of n positions, "
    "{dtype_bytes} bytes per value. At {flops:g} FLOP/s and {beta:g} bytes/s, from how many positions per "
    "rank does the compute take as long as the transfer?"))
register("Napkin 4.1", V.napkin_4_1, listed(cp_activation_bytes), (
    "A model of {layers} layers and width {h} keeps 34 s b h bytes of bf16 activations per layer for a whole "
    "sequence (scores never stored). A batch of {b} sequence(s) of {s} tokens runs with context parallelism "
    "over {c} GPUs. Bytes per GPU per layer and for all layers? Answer: [per layer, all layers]."))
register("Napkin 5.1", V.napkin_5_1, moe.all_to_all_bytes_per_layer, (
    "An MoE layer routes each of {tokens} tokens on a GPU (width {d_model}, {dtype_bytes} bytes per value) to "
    "top-{top_k} experts spread evenly over {ep} GPUs. Bytes the GPU sends per layer in the forward dispatch "
    "and combine?"))
register("Napkin 5.2", V.napkin_5_2, moe.expected_drops, (
    "{tokens} tokens, top-{top_k}, {n_experts} experts, capacity factor {capacity_factor:g} (capacity ceil(c "
    "T k / E) per expert). One expert receives {hot_share:g} of all assignments and the others share the rest "
    "evenly. How many assignments are dropped? (within one assignment)"), grade=grade_drops)
register("Napkin 6.1", V.napkin_6_1, listed(zero1_state_gb), (
    "A model of {n_params:g} parameters trains with TP {tp} x PP {pp}, ZeRO-1 over DP {dp}, bf16 parameters "
    "and gradients and mixed-precision Adam (12 bytes of state per parameter). GB per GPU (1 GB = 1e9 bytes) "
    "of parameters and gradients together, and of optimizer state? Answer: [params and grads, optimizer]."))
register("Napkin 6.2", V.napkin_6_2, dp_compute_bound_tokens, (
    "GPUs compute {flops:g} FLOP/s; each replica's gradients ({grad_bytes} bytes per parameter) are "
    "all-reduced with a ring over {dp} replicas at {bandwidth:g} bytes/s per GPU. With 6 FLOPs per parameter "
    "per token, how many tokens per replica per step make the compute last as long as the all-reduce?"))
register("Napkin 6.3", V.napkin_6_3, listed(cp_dp_split), (
    "A run on {gpus} GPUs with TP {tp} and PP {pp} trains on sequences of {seq} tokens, {tokens} tokens per "
    "step; context parallelism leaves each GPU {positions_per_gpu} positions. CP, DP and sequences per "
    "data-parallel replica per step? Answer: [cp, dp, sequences] (whole numbers)."))
register("Napkin 7.1", V.napkin_7_1, watchdog_gpu_hours, (
    "A rank of a {gpus}-GPU job dies; every other GPU waits in its collective until its watchdog fires after "
    "{timeout_minutes} minutes. How many GPU-hours are spent waiting?"))
register("Napkin 7.2", V.napkin_7_2, goodput_first_order, (
    "{gpus} GPUs each fail once every {gpu_mtbf_hours} hours on average. The job saves a checkpoint every "
    "{interval_minutes} minutes, which stops training for {save_seconds} s; each failure costs "
    "{restart_minutes} minutes to detect and restart, plus the work since the last checkpoint. Goodput (share "
    "of time making progress), to first order?"), grade=grade_goodput)


def variant(student, problem):
    """The numbers of ``problem`` for ``student``."""
    return lookup(problem).variant(V.rng_for(student, problem))


def statement(student, problem):
    return lookup(problem).statement.format(**variant(student, problem))


def model_answer(problem, p):
    """The model answer of ``problem`` (a label) for the numbers ``p`` (a :func:`variant`)."""
    return lookup(problem).answer(**p)


def grade_answer(problem, p, answer):
    """(right?, what is wrong) for one student's answer to ``problem`` with numbers ``p``."""
    record = lookup(problem)
    return record.grade(p, answer, record.answer(**p))


__all__ = ["PROBLEMS", "Problem", "TOLERANCE", "register", "lookup", "variant", "statement", "model_answer",
           "grade_answer", "napkin_0_1", "napkin_0_2", "napkin_0_3", "problem_8_1", "problem_8_2", "problem_8_3",
           "problem_8_4", "napkin_2_1", "napkin_3_1", "napkin_4_1", "napkin_4_2", "napkin_5_1", "napkin_5_2",
           "napkin_6_1", "napkin_6_2", "napkin_6_3", "napkin_7_1", "napkin_7_2"]
