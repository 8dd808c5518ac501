"""What the regions of :mod:`.regions` declare (:mod:`emulator.machine.work`): each
operator's collective over the ``tp`` axis, in the precision policy's ``tp`` dtype, with the
overlap Transformer Engine gives it where the stack has one (:mod:`.overlap`); and the
weight-gradient GEMMs beside them. A layer's declaration (:func:`~.mlp.mlp_work`,
:func:`~.attention.attention_work`) is built from these; the planner sums the same."""

from ...machine import elementwise
from ...machine.work import Collective, Gemm, dtype_bytes

PIPELINE_SPLITS = 4  # Transformer Engine's chunks of a pipelined reduce-scatter (stack_sources: tp_overlap_splits)
OVERLAPPED = ("attention", "mlp")  # TE's layers (linear_qkv, linear_proj, linear_fc1, linear_fc2)


def te_overlap(s, ctx, part):
    """Whether Transformer Engine pipelines this part's tensor-parallel collectives with
    its GEMMs (the stack's ``tp_comm_overlap``; Megatron requires sequence parallelism; the
    embedding and the output layer are Megatron's own layers, not TE's)."""
    return ctx.stack.tp_comm_overlap and s.sequence_parallel and part in OVERLAPPED


def _tp(s, ctx, name, op, overlap=None):
    dt = ctx.dtype("tp")
    return (Collective(name, op, "tp", s.tp, s.rows * s.d * dtype_bytes(dt), dt, overlap),)


def _bulk(s, ctx, part):
    """The backward's all-gather of the input (beside the input-gradient GEMM) and
    reduce-scatter of the input gradient (beside the weight-gradient GEMMs), as Megatron's
    linear layers issue them; TE's bulk overlap takes its SMs from those GEMMs."""
    if part not in OVERLAPPED:
        return None
    return ("bulk", ctx.stack.tp_overlap_sms if te_overlap(s, ctx, part) else 0)


def region_gather(s, ctx, part):
    """``gather`` before a column-parallel layer: an all-gather along the sequence under SP."""
    if not s.sequence_parallel:
        return ()
    return _tp(s, ctx, f"{part}: all-gather input", "all_gather",
               ("ring_exchange", s.tp) if te_overlap(s, ctx, part) else None)


def region_reduce(s, ctx, part):
    """``reduce`` after a row-parallel layer: reduce-scatter (SP) or all-reduce."""
    if s.tp == 1:
        return ()
    overlap = ("pipeline", PIPELINE_SPLITS, ctx.stack.tp_overlap_sms) if te_overlap(s, ctx, part) else None
    return _tp(s, ctx, f"{part}: reduce output", "reduce_scatter" if s.sequence_parallel else "all_reduce", overlap)


def region_reduce_back(s, ctx, part):
    """``reduce``'s backward: the output gradient all-gathered along the sequence under SP."""
    if not s.sequence_parallel:
        return ()
    return _tp(s, ctx, f"{part}: all-gather output grad", "all_gather",
               ("ring_exchange", s.tp) if te_overlap(s, ctx, part) else None)


def region_gather_back(s, ctx, part):
    """``gather``'s backward: the input gradient reduce-scattered (SP) or all-reduced."""
    if s.tp == 1:
        return ()
    return _tp(s, ctx, f"{part}: reduce input grad", "reduce_scatter" if s.sequence_parallel else "all_reduce",
               _bulk(s, ctx, part))


def region_gather_again(s, ctx, part):
    """Under SP the weight gradients need the whole input: gathered again, as Megatron does,
    unless the layer kept the gathered copy."""
    return _tp(s, ctx, f"{part}: all-gather input again", "all_gather", _bulk(s, ctx, part)) \
        if (s.sequence_parallel and not s.keep_gathered) else ()


def wgrad(ctx, name, m, n, k):
    """A weight-gradient GEMM (m x k) @ (k x n): accumulating into the fp32 main gradients
    where the stack fuses that (Megatron's gradient-accumulation fusion), else written in
    the compute dtype and added into the gradient buffer by a kernel of its own."""
    c, g = ctx.dtype("compute"), ctx.dtype("grads")
    if ctx.stack.has("grad_accumulation"):
        return (Gemm(name, m, n, k, c, out_dtype=g, accumulate=True),)
    return (Gemm(name, m, n, k, c),) + elementwise.grad_accumulate(ctx.stack, f"{name}: accumulate", m * n, c, g)
