"""Activation memory of one transformer layer, and the bytes tensor and pipeline
parallelism move, in the formulas of Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models" (2022).

The layer keeps, for backward, with 16-bit activations and 1-byte dropout masks
(s: sequence, b: micro-batch, h: hidden, a: heads, t: tensor-parallel size):

======================================  ==========  ===========  ==================
tensor                                  bytes       with TP      with TP and SP
======================================  ==========  ===========  ==================
LayerNorm 1 input                       2 sbh       2 sbh        2 sbh / t
q, k, v projections' input              2 sbh       2 sbh        2 sbh / t
Q and K                                 4 sbh       4 sbh / t    4 sbh / t
softmax output                          2 as^2 b    / t          / t
softmax dropout mask                    as^2 b      / t          / t
dropout output (times V)                2 as^2 b    / t          / t
V                                       2 sbh       2 sbh / t    2 sbh / t
output projection input                 2 sbh       2 sbh / t    2 sbh / t
attention dropout mask                  sbh         sbh          sbh / t
LayerNorm 2 input                       2 sbh       2 sbh        2 sbh / t
fc1 input                               2 sbh       2 sbh        2 sbh / t
GELU input (4h wide)                    8 sbh       8 sbh / t    8 sbh / t
fc2 input (GELU output)                 8 sbh       8 sbh / t    8 sbh / t
MLP dropout mask                        sbh         sbh          sbh / t
======================================  ==========  ===========  ==================

That is attention as Megatron ran it then: the softmax's scores written to HBM and kept.
A fused kernel (FlashAttention, ``attention="flash"``, the default stack's) keeps none of
the three as^2 b terms, only the softmax's statistics (one fp32 log-sum-exp per row: 4 asb
bytes, / t with TP), and recomputes the scores in backward.

Summed: sbh (34 + 5 as/h) without parallelism; sbh (10 + 24/t + 5 as/(h t)) with TP (the
10 sbh of norms, dropouts and their inputs replicated on every rank); sbh (34/t + 5
as/(h t)) with sequence parallelism too. Selective recomputation recomputes the three
as^2 b terms in backward (5 as/h gone); full recomputation keeps only the layer's input,
2 sbh (2 sbh / t with SP).
"""

from ..errors import ConfigError

RECOMPUTE = ("none", "selective", "full")
TERMS = ("LayerNorm 1 input", "q, k, v projections' input", "Q and K", "softmax output", "softmax dropout mask",
         "dropout output (times V)", "V", "output projection input", "attention dropout mask", "LayerNorm 2 input",
         "fc1 input", "GELU input", "fc2 input", "MLP dropout mask", "layer input", "softmax statistics")
ATTENTION = ("unfused", "flash")


def _check(s, b, h, a=None, t=1):
    for name, v in (("s", s), ("b", b), ("h", h), ("a", a or 1), ("t", t)):
        if not (isinstance(v, (int, float)) and v > 0 and float(v) == int(v)):
            raise ConfigError(f"{name} must be a positive whole number, got {v!r}")
    if a is not None and h % a:
        raise ConfigError(f"h ({h}) must be divisible by the number of heads a ({a})")
    if a is not None and a % t:
        raise ConfigError(f"the heads a ({a}) must be divisible by the tensor-parallel size t ({t})")


def activation_terms(s, b, h, a, t=1, sp=False, recompute="none", attention="unfused"):
    """The table above: {tensor: bytes} kept by one layer on one GPU; ``attention="flash"``:
    a fused kernel's (no scores kept, their statistics instead)."""
    _check(s, b, h, a, t)
    if recompute not in RECOMPUTE:
        raise ConfigError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
    if attention not in ATTENTION:
        raise ConfigError(f"attention must be one of {ATTENTION}, got {attention!r}")
    sbh, att = s * b * h, a * s * s * b
    rep = t if sp else 1  # the replicated regions: split along the sequence with SP
    if recompute == "full":
        return {"layer input": 2 * sbh / rep}
    terms = {"LayerNorm 1 input": 2 * sbh / rep, "q, k, v projections' input": 2 * sbh / rep,
             "Q and K": 4 * sbh / t, "softmax output": 2 * att / t, "softmax dropout mask": att / t,
             "dropout output (times V)": 2 * att / t, "V": 2 * sbh / t, "output projection input": 2 * sbh / t,
             "attention dropout mask": sbh / rep, "LayerNorm 2 input": 2 * sbh / rep, "fc1 input": 2 * sbh / rep,
             "GELU input": 8 * sbh / t, "fc2 input": 8 * sbh / t, "MLP dropout mask": sbh / rep}
    if recompute == "selective" or attention == "flash":
        for k in ("softmax output", "softmax dropout mask", "dropout output (times V)"):
            del terms[k]
    if attention == "flash":
        terms["softmax statistics"] = 4 * a * s * b / t
    return terms


def activation_bytes_per_layer(s, b, h, a, t=1, sp=False, recompute="none", attention="unfused"):
    """Bytes one transformer layer keeps for backward on one GPU (Korthikanti et al.):
    sbh (34 + 5as/h) alone; sbh (10 + 24/t + 5as/(ht)) with TP; sbh (34/t + 5as/(ht))
    with TP and SP; ``recompute="selective"`` drops the attention terms, ``"full"``
    keeps only the layer input; ``attention="flash"`` keeps the softmax's statistics, not its scores."""
    return float(sum(activation_terms(s, b, h, a, t, sp, recompute, attention).values()))


def tp_bytes_per_layer(b, s, h, t, dtype_bytes=2):
    """Bytes each GPU sends per layer for tensor parallelism over t GPUs, forward and
    backward: four all-reduces of the b x s x h activations (two in forward, two in
    backward), each 2 (t-1)/t of its size: 8 b s h dtype_bytes (t-1)/t."""
    _check(s, b, h, t=t)
    return 8 * b * s * h * dtype_bytes * (t - 1) / t


def pp_bytes_per_boundary(b, s, h, dtype_bytes=2):
    """Bytes a pipeline stage sends to the next per micro-batch: the activations, b s h."""
    _check(s, b, h)
    return float(b * s * h * dtype_bytes)


def selective_activation_bytes(h, a, L, s, b, t):
    """(bytes per layer with sequence parallelism, for all ``L`` layers with it, per layer
    without, all layers without) on one of ``t`` tensor-parallel GPUs, with selective
    recomputation (:func:`activation_bytes_per_layer`)."""
    per = [activation_bytes_per_layer(s, b, h, a, t, sp, "selective") for sp in (True, False)]
    return per[0], L * per[0], per[1], L * per[1]
