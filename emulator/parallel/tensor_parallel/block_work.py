"""The declaration of one tensor-parallel block's work (:mod:`emulator.machine.work`), which
the emulator charges as :class:`~.block.TensorParallelBlock` runs and the planner sums:
the norms, attention (:func:`~.attention.attention_work`), the MLP (:func:`~.mlp.mlp_work`)
or the experts, the bias-dropout-adds and the residual stream's gradient sums."""

from functools import lru_cache

from ...machine import elementwise
from ...machine.work import Collective, Work, dtype_bytes
from ..attention_cores import core_work
from ..expert_parallel import moe_work
from .attention import attention_work
from .mlp import mlp_work
from .op_checkpoint import check as check_op_checkpoint, split_forward


@lru_cache(maxsize=512)
def declared_block(s, ctx, cp_rank=0):
    """:func:`block_work`, kept for each shape."""
    return block_work(s, ctx, cp_rank)


def block_work(s, ctx, cp_rank=0):
    """One block's :class:`~emulator.machine.work.Work` on a rank, for a micro-batch of shape
    ``s``: the two norms, attention (its core as the stack and ``s`` say), the MLP or the
    experts, the two bias-dropout-adds, and in backward the residual stream's gradient sums;
    ``recompute`` (full recomputation) is the forward again; under torchtitan's per-op
    checkpointing (``s.recompute == "op"``) it is the forward's ops whose outputs the
    policy does not keep, which backward runs first (:mod:`.op_checkpoint`)."""
    st, a, c, p = ctx.stack, ctx.dtype("activations"), ctx.dtype("tp"), ctx.dtype("params")
    r, d = s.rows_sp, s.d
    attn = attention_work(s, ctx, core_work(s, ctx, cp_rank))
    mlp = moe_work(s, ctx) if s.n_experts else mlp_work(s, ctx)
    norm = [elementwise.norm_forward(st, f"ln{i}", r, d, a, p, s.norm) for i in (1, 2)]
    bda = [elementwise.bias_dropout_add(st, f"bias-dropout-add {i}", r, d, a, c, s.bias, s.dropout) for i in (1, 2)]
    F = norm[0] + attn.forward + bda[0] + norm[1] + mlp.forward + bda[1]
    B = elementwise.bias_dropout_add_backward(st, "bias-dropout-add 2", r, d, a, s.bias, s.dropout) + \
        mlp.backward_input + elementwise.norm_backward(st, "ln2", r, d, a, p, s.norm) + \
        elementwise.residual_grad("residual 2 grad", r, d, a) + \
        elementwise.bias_dropout_add_backward(st, "bias-dropout-add 1", r, d, a, s.bias, s.dropout) + \
        attn.backward_input + elementwise.norm_backward(st, "ln1", r, d, a, p, s.norm) + \
        elementwise.residual_grad("residual 1 grad", r, d, a)
    W = mlp.backward_weight + attn.backward_weight
    if s.partial_grads:  # the norms' and the row-parallel biases' gradients, summed over tp by the block itself
        g = ctx.dtype("grads")
        n = 4 * d + d + (d if s.mlp == "gelu" and not s.n_experts else 0)
        W += (Collective("block: all-reduce partial grads", "all_reduce", "tp", s.tp, n * dtype_bytes(g), g),)
    if s.recompute == "full":  # the block keeps its input only and runs its forward again first
        B = F + B
    if s.recompute == "op":  # its input and the kept ops' outputs; the other ops run again first
        check_op_checkpoint(st, s.cp, s.n_experts)
        again = split_forward(F)[1]
        return Work("block", F, again + B, W, again,
                    notes=("per-op checkpointing: backward_input begins with the recompute pass (the "
                           "forward's ops whose outputs are not kept), listed under recompute",))
    return Work("block", F, B, W, F)
