"""Per-op selective activation checkpointing, torchtitan's policy (``recompute="op"``).

torchtitan wraps each transformer block in ``torch.utils.checkpoint`` with a policy that
decides op by op what the forward keeps. Its rule (torchtitan ``parallelize_llama.py``,
``_save_list`` and ``_custom_policy``, lines 213-276 at 9dec370 of 2024-12-26, the commit
its Llama 3.1 benchmarks name, whose ``train_configs/llama3_8b.toml`` sets
``selective_ac_option = 'op'``; for a dense block without biases the same decisions at
b5bcd76, ``distributed/activation_checkpoint.py``, ``_get_default_save_ops`` and
``_get_custom_policy``, lines 31-94 and 243-287):

* the outputs of the matrix multiplies are kept, except every second one of the block
  (the count restarts with each block): in a Llama block ``wq, wk, wv, wo, w1, w3, w2``
  the outputs of ``wq``, ``wv``, ``w1`` and ``w2`` are kept, ``wk``, ``wo`` and ``w3`` are
  computed again;
* the attention kernel's outputs (the output and its log-sum-exp) are kept;
* a ``reduce_scatter``'s output is kept (the all-gathers and all-reduces run again);
* everything else (norms, RoPE, SiLU, the product, residual adds, dropout) is computed
  again in backward, from the block's input, which the checkpoint keeps. (At 9dec370 the
  RNG state is not preserved, so a model with dropout would draw other masks there; Llama
  has none. The emulator's masks follow positions, and are drawn the same again.)

Here the rule reads a block's declared forward (:mod:`emulator.machine.work`):
:func:`split_forward` parts it into what is kept and what backward runs again first; the
emulator's block keeps exactly the kept items' outputs (:class:`SavedOps`) and the planner
counts the same bytes (:func:`saved_bytes`). It needs each projection as its own GEMM, as
eager PyTorch runs a model written the way torchtitan writes it (a stack with
``op_checkpoint``), a fused attention kernel, a dense MLP and no context parallelism.
torchtitan's models have no biases, so each of their projections is one ``mm``; the rule
counts every declared GEMM that way, also in a block with biases, where torch would run a
biased projection as ``addmm``, which the count skips and which is recomputed at 9dec370
(not in ``_save_list``) and kept at b5bcd76 (one of torch's compute-intensive ops): a
simplification for biased blocks that matches neither.
"""

from ...errors import ConfigError
from ...machine.work import Attention, Collective, Gemm, dtype_bytes
from ..dims import RECOMPUTE

SAVED_COLLECTIVES = ("reduce_scatter",)


def problems(stack, cp=1, experts=0):
    """Why torchtitan's policy cannot apply to a block over ``cp`` context-parallel ranks
    (with ``experts`` experts, 0: a dense MLP) as ``stack`` runs it, each a sentence that
    begins "recompute='op' ..." (an empty list: it can)."""
    bad = []
    if not getattr(stack, "op_checkpoint", False):
        bad.append(f"the {stack.name} stack has no per-op checkpointing (it is torchtitan's: use "
                   f"pytorch-eager or pytorch-compile, or recompute='selective' or 'full')")
    elif stack.fuses_projections:
        bad.append(f"the {stack.name} stack fuses q, k, v (and gate, up) into one GEMM each; the policy counts "
                   f"the projections one by one, as eager PyTorch runs them")
    if stack.attention != "flash":
        bad.append("it keeps a fused attention kernel's outputs: the stack's attention must be 'flash'")
    if cp > 1:
        bad.append(f"context parallelism (cp={cp}) is not supported with it: use cp=1 or recompute='full'")
    if experts:
        bad.append("experts are not supported with it: use a dense MLP or recompute='full'")
    return [f"recompute='op' (torchtitan's per-op checkpointing): {b}" for b in bad]


def check(stack, cp=1, experts=0):
    """A :class:`~emulator.errors.ConfigError` naming every one of :func:`problems`, if any."""
    bad = problems(stack, cp, experts)
    if bad:
        raise ConfigError("; ".join(bad))


def recompute_modes(stack, cp=1, experts=0):
    """The recomputation modes a plan can use under ``stack``, in the order a search tries
    them (``"op"``, where :func:`problems` allows it, before ``"full"``; with tensor and
    sequence parallelism it can keep more than ``"none"``: w2's output before its
    reduce-scatter, whole, beside the reduce-scatters' outputs)."""
    return RECOMPUTE if not problems(stack, cp, experts) else tuple(r for r in RECOMPUTE if r != "op")


def split_forward(forward):
    """(kept, again): the items of a block's declared ``forward`` whose outputs the policy
    keeps, and those backward runs again first (in the forward's order)."""
    kept, again, mm = [], [], 0
    for x in forward:
        if isinstance(x, Gemm):
            mm += 1
            (kept if mm % 2 else again).append(x)
        elif isinstance(x, Attention) or (isinstance(x, Collective) and x.op in SAVED_COLLECTIVES):
            kept.append(x)
        else:
            again.append(x)
    return tuple(kept), tuple(again)


def cached_bytes(kept, act_bytes, rope=False):
    """Bytes of the kept outputs that the block's whole cache, built again in backward, holds
    as they are (shared, not copied): the q, k and v projections' outputs (q and k only
    without RoPE, which the cache holds rotated), the MLP's widening output(s) and the
    attention kernel's log-sum-exp; the kernel's output is cached with its heads merged (a
    copy), and the down projection's and the reduce-scatters' outputs are not cached."""
    n = 0.0
    for x in kept:
        if isinstance(x, Gemm):
            name = x.name.rsplit(": ", 1)[-1]
            if x.name.startswith("mlp: fc1") or name == "v" or (name in ("q", "k") and not rope):
                n += x.m * x.n * x.count * act_bytes
        elif isinstance(x, Attention):
            n += x.b * x.h * x.s_q * 4
    return n


def saved_bytes(kept, act_bytes):
    """Bytes the kept outputs take, held in the activations' dtype (``act_bytes`` each): a
    GEMM's m x n; the attention kernel's output and its fp32 log-sum-exp per row; a
    reduce-scatter's output, 1/size of its input."""
    n = 0.0
    for x in kept:
        if isinstance(x, Gemm):
            n += x.m * x.n * x.count * act_bytes
        elif isinstance(x, Attention):
            n += x.b * x.h * x.s_q * (x.d * act_bytes + 4)
        else:
            n += x.input_bytes / dtype_bytes(x.dtype) / x.size * act_bytes
    return n


class SavedOps:
    """One block's kept outputs, by the declared name of the op that made them: recorded
    while the forward runs, replayed while backward runs it again.

    ``saved(name, compute)`` returns ``compute()``; for a kept op it also stores the result
    (recording) or, replaying, returns the stored one instead of computing it (cast to
    ``dtype``) and tells ``on_replay(name)`` (the rank's open pass, which then charges the op
    nothing). ``save`` and ``restore`` convert what is stored for an op whose result is not
    one array (the attention core's)."""

    def __init__(self, names, keep, values=None, dtype=None, on_replay=None):
        self.names, self.keep = frozenset(names), keep
        self.values = {} if values is None else values
        self.replaying, self.dtype, self.on_replay = values is not None, dtype, on_replay

    def __call__(self, name, compute, save=None, restore=None):
        if name not in self.names:
            return compute()
        if self.replaying:
            kept = self.values[name]
            self.on_replay(name)
            return restore(kept) if restore else kept.astype(self.dtype, copy=False)
        out = compute()
        self.values[name] = save(out) if save else self.keep(out)
        return out


def passthrough(name, compute, save=None, restore=None):
    """What a module computes with when no per-op checkpoint is open: everything."""
    return compute()
