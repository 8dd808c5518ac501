"""Lesson 06's napkins as the checks ask them: each called with the problem's own numbers
and with others (:func:`~.napkins.variants`), while the library's answer refuses."""

from ..accounting import context_parallel, traffic
from ..accounting import memory as accounting_memory
from .common import passed
from .napkins import variants

state_per_gpu = accounting_memory.zero1_state_gb  # the model answer of Napkin 6.1
dp_compute_bound_tokens = traffic.dp_compute_bound_tokens  # of Napkin 6.2
llama_cp_switch = context_parallel.cp_dp_split  # of Napkin 6.3


def napkin_state(fn):
    """Napkin 6.1: fn(n_params, dp, tp, pp) -> (params+grads GB, optimizer GB) per GPU under ZeRO-1."""
    cases = [dict(n_params=70e9, dp=4, tp=8, pp=2), dict(n_params=405e9, dp=128, tp=8, pp=16),
             dict(n_params=13e9, dp=32, tp=2, pp=1), dict(n_params=1e12, dp=6, tp=8, pp=64)]
    want = variants("Napkin 6.1", fn, cases, state_per_gpu, " GB", ("params and grads", "optimizer"),
                    (state_per_gpu,))
    passed("Napkin 6.1", f"{want[0]:.2f} GB of parameters and gradients, {want[1]:.2f} GB of optimizer state per GPU")


def napkin_dp_tokens(fn):
    """Napkin 6.2: fn(flops, bandwidth, dp, grad_bytes) -> tokens per replica per step that
    keep the data axis compute-bound."""
    cases = [dict(flops=989e12, bandwidth=48e9, dp=64, grad_bytes=2), dict(flops=312e12, bandwidth=24e9, dp=8,
                                                                            grad_bytes=2),
             dict(flops=989e12, bandwidth=370e9, dp=2, grad_bytes=4), dict(flops=989e12, bandwidth=48e9, dp=1024,
                                                                             grad_bytes=2)]
    want = variants("Napkin 6.2", lambda **kw: (fn(**kw),) if kw else (fn(),), cases,
                    lambda **kw: (dp_compute_bound_tokens(**kw),), " tokens", ("tokens per replica",),
                    (dp_compute_bound_tokens,), rel=0.02)
    passed("Napkin 6.2", f"{want[0]:,.0f} tokens per replica per step keep the gradient all-reduce behind compute")


def napkin_llama_cp(fn):
    """Napkin 6.3: fn(seq, tokens, positions_per_gpu, gpus, tp, pp) -> (cp, dp, sequences per replica)."""
    cases = [dict(seq=131072, tokens=16 * 2**20, positions_per_gpu=8192, gpus=16384, tp=8, pp=16),
             dict(seq=8192, tokens=16 * 2**20, positions_per_gpu=8192, gpus=16384, tp=8, pp=16),
             dict(seq=65536, tokens=8 * 2**20, positions_per_gpu=4096, gpus=4096, tp=8, pp=4)]
    want = variants("Napkin 6.3", fn, cases, llama_cp_switch, "", ("cp", "dp", "sequences per replica"),
                    (llama_cp_switch,), rel=0)
    passed("Napkin 6.3", f"at 131k tokens: CP {want[0]}, DP {want[1]}, {want[2]} sequences per replica: each GPU "
                         f"still holds 8,192 positions")
