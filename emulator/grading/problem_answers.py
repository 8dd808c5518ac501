"""The model answers of the problem sets, as functions of a variant's numbers
(``answer(**numbers)``), in the shape an answer file holds them: a number, a list of
numbers, or Problem 8.1's dict. Each is a formula of :mod:`emulator.accounting`."""

from ..accounting import activations
from ..accounting.memory import zero_bytes_per_gpu
from ..accounting.pipeline import memory_vs_bubble


def listed(formula):
    """``formula``'s tuple of numbers as the list an answer file holds."""
    def answer(**numbers):
        return list(formula(**numbers))
    answer.__name__ = answer.__qualname__ = formula.__name__
    answer.__doc__ = formula.__doc__
    return answer


def zero_stages(n_params, dp_size, gpu_gb):
    """Problem 8.1: {stage: [params GB, grads GB, optimizer GB], "fits": [stages]}."""
    parts = {z: zero_bytes_per_gpu(n_params, dp_size, z) for z in range(4)}
    answer = {str(z): [b.params / 1e9, b.grads / 1e9, b.optimizer / 1e9] for z, b in parts.items()}
    answer["fits"] = [z for z, b in parts.items() if b / 1e9 <= gpu_gb]
    return answer


def two_budgets(p, per_micro_batch, budget, budget_2, max_m):
    """Napkin 3.1: :func:`memory_vs_bubble` with ``budget``, then with ``budget_2``."""
    return (list(memory_vs_bubble(p, per_micro_batch, budget, max_m))
            + list(memory_vs_bubble(p, per_micro_batch, budget_2, max_m)))


def tp_and_pp_bytes(b, s, h, t):
    """Problem 8.3: [bytes a GPU sends per layer for TP, bytes a pipeline boundary passes], bf16."""
    return [activations.tp_bytes_per_layer(b, s, h, t, dtype_bytes=2), activations.pp_bytes_per_boundary(b, s, h, 2)]

