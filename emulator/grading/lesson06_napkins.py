"""Lesson 06's napkins as the checks in :mod:`.lesson06` ask them: the model answers, and
the other numbers each answer is called with beside the problem's own
(:func:`~.napkins.variants`)."""

from ..accounting import context_parallel, traffic
from ..accounting import memory as accounting_memory

state_per_gpu = accounting_memory.zero1_state_gb  # the model answer of Napkin 6.1
dp_compute_bound_tokens = traffic.dp_compute_bound_tokens  # of Napkin 6.2
llama_cp_switch = context_parallel.cp_dp_split  # of Napkin 6.3

STATE_CASES = [dict(n_params=70e9, dp=4, tp=8, pp=2), dict(n_params=405e9, dp=128, tp=8, pp=16),
               dict(n_params=13e9, dp=32, tp=2, pp=1), dict(n_params=1e12, dp=6, tp=8, pp=64)]
DP_TOKENS_CASES = [dict(flops=989e12, bandwidth=48e9, dp=64, grad_bytes=2),
                   dict(flops=312e12, bandwidth=24e9, dp=8, grad_bytes=2),
                   dict(flops=989e12, bandwidth=370e9, dp=2, grad_bytes=4),
                   dict(flops=989e12, bandwidth=48e9, dp=1024, grad_bytes=2)]
LLAMA_CP_CASES = [dict(seq=131072, tokens=16 * 2**20, positions_per_gpu=8192, gpus=16384, tp=8, pp=16),
                  dict(seq=8192, tokens=16 * 2**20, positions_per_gpu=8192, gpus=16384, tp=8, pp=16),
                  dict(seq=65536, tokens=8 * 2**20, positions_per_gpu=4096, gpus=4096, tp=8, pp=4)]
