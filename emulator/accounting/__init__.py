"""Formulas the lessons compare measurements with, split by idea: ``memory`` (training
state per GPU, by ZeRO stage), ``activations`` (activation memory of a layer, and the
bytes TP and PP move), ``traffic`` (bytes sent per GPU by data parallelism).
``from emulator.accounting import zero_bytes_per_gpu`` keeps working."""

from .activations import activation_bytes_per_layer, activation_terms, pp_bytes_per_boundary, tp_bytes_per_layer
from .moe import CASE_STUDIES, all_to_all_bytes_per_layer, expected_drops, experts_per_gpu
from .pipeline import micro_batches_for_bubble, peak_in_flight, pipeline_bubble
from .memory import GB, ZeroBytes, check_zero_stage, zero_bytes_per_gpu
from .traffic import zero_traffic_per_gpu

__all__ = ["GB", "ZeroBytes", "check_zero_stage", "zero_bytes_per_gpu", "zero_traffic_per_gpu",
           "activation_bytes_per_layer", "activation_terms", "tp_bytes_per_layer", "pp_bytes_per_boundary",
           "pipeline_bubble", "micro_batches_for_bubble", "peak_in_flight", "CASE_STUDIES",
           "all_to_all_bytes_per_layer", "expected_drops", "experts_per_gpu"]
