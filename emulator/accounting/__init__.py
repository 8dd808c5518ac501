"""Formulas the lessons compare measurements with, split by idea: ``memory`` (bytes held
per GPU), ``traffic`` (bytes sent per GPU). ``from emulator.accounting import
zero_bytes_per_gpu`` keeps working."""

from .memory import GB, ZeroBytes, check_zero_stage, zero_bytes_per_gpu
from .traffic import zero_traffic_per_gpu

__all__ = ["GB", "ZeroBytes", "check_zero_stage", "zero_bytes_per_gpu", "zero_traffic_per_gpu"]
