"""The memory-bound kernels of a transformer step as each software stack runs them: fused
(one kernel for a chain of ops, its operands read once) or one kernel per op, each with its
own HBM traffic. Each function returns a tuple of :class:`~emulator.machine.work.Memory`
kernels for ``rows`` tokens; sizes are bytes per element (``a`` the activations' dtype,
``p`` the weights').

Where the chains come from (``stack.has(fusion)``; the sources of each preset's fusions are
in :mod:`emulator.machine.stack_sources`):

* norms: Transformer Engine's and Apex's fused LayerNorm/RMSNorm are one kernel each way;
  torch's ``layer_norm`` is one kernel forward and two backward (the input gradient, then
  the weights'); a norm written as ops (``x.float()``, ``pow``, ``mean``, ``rsqrt``, two
  ``mul``, ``type_as``) one kernel per op;
* the MLP's activation: Megatron's fused bias-GeLU / bias-SwiGLU one kernel; eager GeLU one
  kernel, eager SwiGLU ``silu(g) * u`` two (three backward);
* bias, dropout and residual: Megatron's fused bias-dropout-add one kernel; eager one per op;
* RoPE: a fused kernel per q and k; eager (torchtitan's complex multiply): a cast, the
  product and a cast back, per tensor;
* the cross-entropy over this rank's ``v`` logits per token: Megatron's vocabulary-parallel
  loss (``megatron/core/tensor_parallel/cross_entropy.py``: ``.float()``, max, subtract,
  ``exp``, sum, divide; backward: the one-hot update and a multiply, then the cast back):
  38 bytes per logit forward and 14 backward; eager torch (``F.cross_entropy(pred.float())``):
  the cast, ``log_softmax`` (two reads, a write), ``nll_loss``; backward its gradient, the
  ``log_softmax`` backward and the cast back.
"""

from .work import Memory, dtype_bytes


def _m(name, op, read, written):
    return Memory(name, op, float(read), float(written))


# ----------------------------------------------------------------- norms
def norm_forward(stack, name, rows, d, act, params, kind="layernorm"):
    a, p = dtype_bytes(act), dtype_bytes(params)
    weights = (2 if kind == "layernorm" else 1) * d * p
    stats = rows * (8 if kind == "layernorm" else 4)  # fp32 mean and rstd (RMSNorm: rstd)
    if stack.has("norm") or kind == "layernorm":  # TE/Apex fused, or torch's native layer_norm kernel
        return (_m(name, "norm", rows * d * a + weights, rows * d * a + stats),)
    f = rows * d * 4  # the ops in fp32
    return (_m(f"{name}: x.float()", "cast", rows * d * a, f), _m(f"{name}: pow", "norm", f, f),
            _m(f"{name}: mean", "norm", f, rows * 4), _m(f"{name}: rsqrt", "norm", rows * 4, rows * 4),
            _m(f"{name}: x * rstd", "norm", f + rows * 4, f), _m(f"{name}: type_as", "cast", f, rows * d * a),
            _m(f"{name}: * weight", "norm", rows * d * a + weights, rows * d * a))


def norm_backward(stack, name, rows, d, act, params, kind="layernorm"):
    a, p = dtype_bytes(act), dtype_bytes(params)
    n_w = 2 if kind == "layernorm" else 1
    stats = rows * (8 if kind == "layernorm" else 4)
    if stack.has("norm"):  # one kernel: dx, and the weights' partial sums
        return (_m(f"{name} backward", "norm_backward", 2 * rows * d * a + stats + d * p, rows * d * a + n_w * d * 4),)
    if kind == "layernorm":  # torch: the input gradient, then gamma's and beta's
        return (_m(f"{name} backward: dx", "norm_backward", 2 * rows * d * a + stats + d * p, rows * d * a),
                _m(f"{name} backward: weights", "norm_backward", 2 * rows * d * a + stats, n_w * d * p))
    f = rows * d * 4  # autograd through the ops above, one kernel each
    return (_m(f"{name} backward: * weight", "norm_backward", 2 * rows * d * a, rows * d * a),
            _m(f"{name} backward: weight grad", "norm_backward", 2 * rows * d * a, d * p),
            _m(f"{name} backward: type_as", "cast", rows * d * a, f),
            _m(f"{name} backward: x * rstd", "norm_backward", 2 * f, f),
            _m(f"{name} backward: rstd", "norm_backward", 2 * f, rows * 4),
            _m(f"{name} backward: mean, pow", "norm_backward", f + rows * 4, f),
            _m(f"{name} backward: add", "norm_backward", 2 * f, f),
            _m(f"{name} backward: x.float()", "cast", f, rows * d * a))


# ----------------------------------------------------------------- bias, dropout, residual
def bias_dropout_add(stack, name, rows, d, act, comp, bias, dropout):
    """out = residual + dropout(x + bias); ``comp``: the dtype x arrives in."""
    a, c = dtype_bytes(act), dtype_bytes(comp)
    mask = rows * d if dropout else 0
    if stack.has("bias_dropout_add"):
        return (_m(name, "bias_dropout_add", rows * d * (a + c), rows * d * a + mask),)
    out = []
    if bias:
        out.append(_m(f"{name}: bias", "bias", rows * d * c, rows * d * c))
    if dropout:
        out.append(_m(f"{name}: dropout", "dropout", rows * d * c, rows * d * c + mask))
    return tuple(out) + (_m(f"{name}: residual add", "residual", rows * d * (a + c), rows * d * a),)


def bias_dropout_add_backward(stack, name, rows, d, act, bias, dropout):
    """The gradient of x (the residual's is the output gradient itself, no kernel)."""
    a = dtype_bytes(act)
    if not (bias or dropout):
        return ()
    mask = rows * d if dropout else 0
    if stack.has("bias_dropout_add"):
        return (_m(f"{name} backward", "bias_dropout_add", rows * d * a + mask, rows * d * a + (d * 4 if bias else 0)),)
    out = []
    if dropout:
        out.append(_m(f"{name} backward: dropout", "dropout", rows * d * a + mask, rows * d * a))
    if bias:
        out.append(_m(f"{name} backward: bias grad", "bias", rows * d * a, d * 4))
    return tuple(out)


def residual_grad(name, rows, d, act):
    """The two gradients of a tensor used twice (a residual stream) summed: one add."""
    a = dtype_bytes(act)
    return (_m(name, "residual", 2 * rows * d * a, rows * d * a),)


# ----------------------------------------------------------------- the MLP's activation
def activation(stack, name, rows, ff, comp, mlp, bias):
    """``ff``: this rank's hidden units; GeLU on (rows, ff), SwiGLU on gate and up (rows, 2 ff)."""
    c = dtype_bytes(comp)
    if mlp == "gelu":
        extra = ff * c if (bias and stack.has("bias_act")) else 0  # the bias, added here (the GEMM skips it)
        return (_m(name, "activation", rows * ff * c + extra, rows * ff * c),)
    if stack.has("bias_act") or stack.has("elementwise"):
        return (_m(name, "activation", 2 * rows * ff * c, rows * ff * c),)
    return (_m(f"{name}: silu(gate)", "activation", rows * ff * c, rows * ff * c),
            _m(f"{name}: * up", "activation", 2 * rows * ff * c, rows * ff * c))


def activation_backward(stack, name, rows, ff, comp, mlp):
    c = dtype_bytes(comp)
    if mlp == "gelu":
        return (_m(f"{name} backward", "activation_backward", 2 * rows * ff * c, rows * ff * c),)
    if stack.has("bias_act") or stack.has("elementwise"):
        return (_m(f"{name} backward", "activation_backward", 3 * rows * ff * c, 2 * rows * ff * c),)
    return (_m(f"{name} backward: d up", "activation_backward", 2 * rows * ff * c, rows * ff * c),
            _m(f"{name} backward: d silu", "activation_backward", 2 * rows * ff * c, rows * ff * c),
            _m(f"{name} backward: silu", "activation_backward", 2 * rows * ff * c, rows * ff * c))


# ----------------------------------------------------------------- RoPE
def rope(stack, name, rows, heads, dh, comp, backward=False):
    """Rotary embeddings of ``heads`` heads of q or k (one tensor of rows x heads x dh)."""
    c, n = dtype_bytes(comp), rows * heads * dh
    what = f"{name} backward" if backward else name
    if stack.has("rope") or stack.has("elementwise"):
        return (_m(what, "rope", n * c + rows * dh * 4, n * c),)  # the tensor, and cos/sin per position
    return (_m(f"{what}: .float()", "cast", n * c, n * 4), _m(f"{what}: * freqs", "rope", n * 4 + rows * dh * 4, n * 4),
            _m(f"{what}: type_as", "cast", n * 4, n * c))


# ----------------------------------------------------------------- the loss
def cross_entropy(stack, rows, v, comp):
    """(forward, backward) kernels of the cross-entropy over ``rows`` tokens of ``v`` logits."""
    c, n = dtype_bytes(comp), rows * v
    if stack.has("cross_entropy"):  # one pass reads the logits for max, sum and target; backward writes the grad
        return (_m("loss: fused cross-entropy", "cross_entropy", n * c, rows * 8),), \
            (_m("loss backward: fused cross-entropy", "cross_entropy", n * c, n * c),)
    if stack.has("elementwise"):  # Inductor: the cast into the two reductions, then one pass for the gradient
        return (_m("loss: max, sum", "cross_entropy", 2 * n * c, rows * 8),), \
            (_m("loss backward: softmax - one-hot", "cross_entropy", n * c, n * c),)
    if stack.name.startswith("megatron"):  # megatron/core/tensor_parallel/cross_entropy.py
        f = n * 4
        return (_m("loss: logits.float()", "cast", n * c, f), _m("loss: max", "cross_entropy", f, rows * 4),
                _m("loss: subtract max", "cross_entropy", f, f), _m("loss: exp", "cross_entropy", f, f),
                _m("loss: sum", "cross_entropy", f, rows * 4), _m("loss: divide", "cross_entropy", f, f)), \
            (_m("loss backward: * grad", "cross_entropy", f, f), _m("loss backward: cast", "cast", f, n * c))
    f = n * 4  # torch: F.cross_entropy(pred.float(), labels)
    return (_m("loss: pred.float()", "cast", n * c, f), _m("loss: log_softmax", "cross_entropy", 2 * f, f)), \
        (_m("loss backward: nll_loss", "cross_entropy", rows * 4, f),
         _m("loss backward: log_softmax", "cross_entropy", 2 * f, f), _m("loss backward: cast", "cast", f, n * c))


# ----------------------------------------------------------------- gradients and the optimizer
def grad_accumulate(stack, name, n, grad, main):
    """A weight gradient (``grad`` dtype, ``n`` elements) added into the main gradient buffer
    (``main``): no kernel where the GEMM accumulates itself."""
    if stack.has("grad_accumulation"):
        return ()
    g, m = dtype_bytes(grad), dtype_bytes(main)
    return (_m(name, "grad_accumulate", n * (g + m), n * m),)


def optimizer_update(stack, n, precision, params="fp32"):
    """Adam over ``n`` parameters (a rank's shard): read the gradient, the master copy and
    both moments, write them back and the weights in their dtype; one multi-tensor kernel
    (``adam`` fused) or, per parameter tensor, several (counted as the same bytes: the
    foreach update reads and writes each once either way)."""
    p = dtype_bytes(precision.of("params", params))
    g = dtype_bytes(precision.of("grads", precision.of("params", params)))
    master = dtype_bytes(precision.master) if precision.master else 0
    moments = 2 * dtype_bytes(precision.of("optimizer", precision.of("params", params)))
    read = n * (g + moments + (master or p))
    written = n * (moments + (master or p) + (p if master else 0))
    return (_m("optimizer: Adam update", "optimizer", read, written),)
