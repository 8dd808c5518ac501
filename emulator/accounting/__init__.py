"""Formulas the lessons compare measurements with, split by idea: ``memory`` (training
state per GPU, by ZeRO stage), ``activations`` (activation memory of a layer, and the
bytes TP and PP move), ``traffic`` (bytes sent per GPU by data parallelism),
``pipeline`` (the bubble, and the micro-batches memory allows), ``context_parallel``
(activations over a split sequence, ring attention's overlap), ``all_reduce_time``
(seconds and bus bandwidth of all-reduces on a cluster), ``moe`` and ``failures``.
The napkins' model answers are these formulas.
``from emulator.accounting import zero_bytes_per_gpu`` keeps working."""

from .activations import (activation_bytes_per_layer, activation_terms, pp_bytes_per_boundary,
                          selective_activation_bytes, tp_bytes_per_layer)
from .all_reduce_time import (activation_all_reduce_seconds, all_reduce_busbw_gb, gradient_all_reduce_seconds,
                              latency_crossover_bytes)
from .context_parallel import cp_activation_bytes, cp_dp_split, ring_overlap_positions
from .failures import goodput_daly, goodput_first_order, watchdog_gpu_hours
from .moe import CASE_STUDIES, all_to_all_bytes_per_layer, expected_drops, experts_per_gpu
from .pipeline import bubble_micro_batches, memory_vs_bubble, micro_batches_for_bubble, peak_in_flight, pipeline_bubble
from .memory import GB, ZeroBytes, check_zero_stage, zero1_state_gb, zero_bytes_per_gpu
from .traffic import dp_compute_bound_tokens, zero_traffic_per_gpu

__all__ = ["GB", "ZeroBytes", "check_zero_stage", "zero_bytes_per_gpu", "zero_traffic_per_gpu",
           "activation_bytes_per_layer", "activation_terms", "tp_bytes_per_layer", "pp_bytes_per_boundary",
           "pipeline_bubble", "micro_batches_for_bubble", "peak_in_flight", "CASE_STUDIES",
           "all_to_all_bytes_per_layer", "expected_drops", "experts_per_gpu",
           "selective_activation_bytes", "gradient_all_reduce_seconds", "activation_all_reduce_seconds",
           "all_reduce_busbw_gb", "latency_crossover_bytes", "cp_activation_bytes", "ring_overlap_positions",
           "cp_dp_split", "goodput_first_order", "goodput_daly", "watchdog_gpu_hours", "bubble_micro_batches",
           "memory_vs_bubble", "zero1_state_gb", "dp_compute_bound_tokens"]
