"""The layers lesson 02's checks run: their sizes, and the sequence-parallel MLP sublayer
y = x + MLP(LN(x)) of Exercises 2.3 and 2.4, with its one-device reference, its shards and
the collectives its forward must make."""

import numpy as np

from .. import nn
from .common import CheckFailed, expect


D, A, FF, B, S = 16, 4, 32, 2, 8  # width, heads, d_ff, batch and sequence of the tensor-parallel layers
SP_S, SP_FF = 12, 48  # the sequence-parallel sublayer: 12 positions and d_ff 48 split over 1, 2, 3 or 4 ranks


def sp_sublayer(t):
    """Parameters of the MLP sublayer y = x + MLP(LN(x)) (biases and norm not at their
    initial values, so a missing or doubled term shows), an input and an output gradient."""
    rng = np.random.default_rng(20 + t)
    mlp = nn.MLP(D, SP_FF, dtype=np.float64)
    full = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in mlp.init(rng).items()}
    full["ln.g"], full["ln.b"] = 1 + 0.2 * rng.standard_normal(D), 0.2 * rng.standard_normal(D)
    x, dy = rng.standard_normal((B, SP_S, D)), rng.standard_normal((B, SP_S, D))
    return full, x, dy


def sp_reference(full, x, dy):
    """One device: (y, dx, grads) of y = x + MLP(LN(x))."""
    mlp = nn.MLP(D, SP_FF, dtype=np.float64)
    a = nn.layer_norm(x, full["ln.g"], full["ln.b"])
    mp = {k: v for k, v in full.items() if not k.startswith("ln.")}
    z, cache = mlp.forward(mp, a)
    da, grads = mlp.backward(mp, cache, dy)
    dx_ln, grads["ln.g"], grads["ln.b"] = nn.layer_norm_backward(x, full["ln.g"], da)
    return x + z, dy + dx_ln, grads


def sp_shard(full, r, t):
    cols = slice(r * SP_FF // t, (r + 1) * SP_FF // t)
    return {"ln.g": full["ln.g"], "ln.b": full["ln.b"], "fc1.w": full["fc1.w"][:, cols], "fc1.b": full["fc1.b"][cols],
            "fc2.w": full["fc2.w"][cols], "fc2.b": full["fc2.b"]}


def positions(r, t):
    return slice(r * SP_S // t, (r + 1) * SP_S // t)


def expect_sp_forward_calls(what, t, calls):
    """The forward's collectives: one all-gather of the norm's output, one reduce-scatter
    of fc2's partial output, nothing else."""
    local, whole = B * (SP_S // t) * D * 8, B * SP_S * D * 8
    want = [("all_gather", local), ("reduce_scatter", whole)]
    got = [(c.op, c.nbytes) for c in calls]
    if any(op == "all_reduce" for op, _ in got):
        raise CheckFailed(f"{what}, t={t}: the forward made {got}; an all-reduce after fc2 hands every rank the whole "
                          f"sequence, as tensor parallelism alone does. Under sequence parallelism reduce-scatter it "
                          f"along the sequence, so each rank keeps the sum for its own positions ({whole} bytes in, "
                          f"{local} out)")
    expect(got == want, f"{what}, t={t}: the forward made {got}; it needs {want}: the norm on this rank's "
                        f"positions, one all-gather of its output before fc1 (the column-parallel layer needs the "
                        f"whole sequence), one reduce-scatter of fc2's partial output")
