"""A mixture-of-experts MLP: a router sends each token to ``top_k`` of ``n_experts`` MLPs.

Forward, for tokens x (T, d) (any leading dims are flattened):

1. **route**: p = softmax(x @ W_r) over the experts; each token picks its ``top_k``
   largest; their probabilities, renormalised to sum to 1 over the k chosen, are the
   token's weights;
2. **capacity** (``capacity_factor`` c): an expert takes at most
   ``ceil(c * T * top_k / n_experts)`` assignments, first come (token order) first
   served; the rest are dropped: the token gets nothing from that expert (the residual
   around the layer carries it). ``capacity_factor=None`` is dropless;
3. **permute**: the kept (token, expert) assignments sorted by expert, stable in token
   order, so each expert's tokens are one contiguous block;
4. **experts**: expert e computes GELU(X_e W1[e] + b1[e]) W2[e] + b2[e] on its block
   (``mlp="swiglu"``: (SiLU(X_e G[e]) * (X_e U[e])) D[e], as DeepSeek, Mixtral and Qwen);
5. **combine**: each token's output is the weighted sum of its experts' outputs.

Parameters: ``router.w`` (d, E); ``experts.fc1.w`` (E, d, d_ff), ``experts.fc1.b`` (E,
d_ff), ``experts.fc2.w`` (E, d_ff, d), ``experts.fc2.b`` (E, d) (SwiGLU experts:
``experts.gate.w``, ``experts.up.w`` (E, d, d_ff), ``experts.down.w`` (E, d_ff, d)): the
experts stacked along dim 0, which is how expert parallelism splits them.

With ``aux_loss_coef`` > 0 the layer adds Switch Transformer's load-balancing loss,
``E * sum_e f_e P_e`` (f_e: the share of assignments routed to e, P_e: the mean router
probability of e), times the coefficient, to the gradient of the router; its value is in
``cache["aux_loss"]``. The auxiliary loss is part of the training loss, so its gradient
is scaled as the loss is (by ``1/micro-batches`` and the data-parallel average):
:func:`scale_aux_loss` sets that scale in a forward's cache before backward, as
Megatron's ``MoEAuxLossAutoScaler.set_loss_scale`` does.

The pieces (routing, capacity, the stacked experts) are functions, so expert
parallelism (:mod:`emulator.parallel.expert_parallel`) runs the same code on each rank.
"""

import math

import numpy as np

from ..errors import ConfigError
from .activations import gelu, gelu_backward, silu, silu_backward
from .attention_core import softmax
from .module import Module, check_last_dim

EXPERT_KEYS = ("experts.fc1.w", "experts.fc1.b", "experts.fc2.w", "experts.fc2.b")
SWIGLU_EXPERT_KEYS = ("experts.gate.w", "experts.up.w", "experts.down.w")


def expert_keys(params):
    """The stacked experts' keys in ``params`` (GELU or SwiGLU experts)."""
    return SWIGLU_EXPERT_KEYS if "experts.gate.w" in params else EXPERT_KEYS


def scale_aux_loss(cache, scale):
    """Scale the auxiliary loss's gradient of every MoE layer in a forward's ``cache`` (any
    nesting of dicts and lists) by ``scale``, the factor the loss is scaled by."""
    if isinstance(cache, dict):
        if "aux_dp" in cache:
            cache["aux_scale"] = scale
        for v in cache.values():
            if isinstance(v, (dict, list)):
                scale_aux_loss(v, scale)
    elif isinstance(cache, list):
        for v in cache:
            scale_aux_loss(v, scale)


# ----------------------------------------------------------------- routing
def route(w, x2, top_k):
    """(expert ids (T, k), weights (T, k), cache): top-k of softmax(x W_r), renormalised."""
    p = softmax(x2 @ w)
    idx = np.argsort(-p, axis=1, kind="stable")[:, :top_k]
    sel = np.take_along_axis(p, idx, axis=1)
    return idx, sel / sel.sum(1, keepdims=True), {"x": x2, "p": p, "idx": idx, "sel": sel}


def route_backward(w, rc, dweights, dp_extra=None):
    """(dx, dlogits) from the gradient of the weights (and an extra gradient of p)."""
    sel, p, idx = rc["sel"], rc["p"], rc["idx"]
    total = sel.sum(1, keepdims=True)
    weights = sel / total
    dsel = (dweights - (dweights * weights).sum(1, keepdims=True)) / total  # through the renormalisation
    dp = np.zeros_like(p) if dp_extra is None else dp_extra.copy()
    np.add.at(dp, (np.arange(len(p))[:, None], idx), dsel)
    dlogits = p * (dp - (dp * p).sum(1, keepdims=True))
    return dlogits @ w.T, dlogits


def capacity(n_tokens, top_k, n_experts, factor):
    """Assignments an expert takes: ceil(factor * T * k / E); None (dropless) for no factor."""
    return None if factor is None else int(math.ceil(factor * n_tokens * top_k / n_experts - 1e-9))  # float noise


def keep_first(expert_ids, n_experts, cap):
    """Which assignments (in the given order) fit: the first ``cap`` of each expert."""
    if cap is None:
        return np.ones(len(expert_ids), bool)
    onehot = expert_ids[:, None] == np.arange(n_experts)[None, :]
    position = np.cumsum(onehot, axis=0)[np.arange(len(expert_ids)), expert_ids] - 1
    return position < cap


def keep_first_choices_first(expert_ids, n_experts, cap, top_k):
    """Which assignments fit when every token's first choice is served before any second
    choice (GShard's order; DeepSpeed's ``top2gating`` in ``deepspeed/moe/sharded_moe.py``
    places second choices after all first choices: ``locations2 += sum(mask1)``).
    ``expert_ids`` lists the assignments token by token, ``top_k`` each, best first; within
    one choice rank, token order. :func:`keep_first` is first come (token order)."""
    expert_ids = np.asarray(expert_ids)
    if len(expert_ids) % top_k:
        raise ConfigError(f"keep_first_choices_first: {len(expert_ids)} assignments are not whole tokens of "
                          f"top_k = {top_k}")
    by_choice = np.arange(len(expert_ids)).reshape(-1, top_k).T.ravel()  # every first choice, then every second
    keep = np.empty(len(expert_ids), bool)
    keep[by_choice] = keep_first(expert_ids[by_choice], n_experts, cap)
    return keep


def permutation(expert_ids, keep):
    """Indices of the kept assignments sorted by expert (stable: token order within one)."""
    kept = np.nonzero(keep)[0]
    return kept[np.argsort(expert_ids[kept], kind="stable")]


def load_balancing(p, expert_ids, n_experts):
    """Switch's auxiliary loss E sum_e f_e P_e and its gradient with respect to p."""
    f = np.bincount(expert_ids, minlength=n_experts) / len(expert_ids)
    return n_experts * float((f * p.mean(0)).sum()), np.broadcast_to(n_experts * f / len(p), p.shape)


# ----------------------------------------------------------------- the stacked experts
def experts_forward(params, xs, counts):
    """Expert e (local index) on rows ``xs[start_e : start_e + counts[e]]``."""
    if "experts.gate.w" in params:
        return _swiglu_experts_forward(params, xs, counts)
    w1, b1, w2, b2 = (params[k] for k in EXPERT_KEYS)
    starts = np.concatenate([[0], np.cumsum(counts)])
    h = np.empty_like(xs, shape=(len(xs), w1.shape[2]))
    ys = np.empty_like(xs, shape=(len(xs), w2.shape[2]))
    for e in range(len(counts)):
        r = slice(starts[e], starts[e + 1])
        h[r] = xs[r] @ w1[e] + b1[e]
        ys[r] = gelu(h[r]) @ w2[e] + b2[e]
    return ys, {"xs": xs, "h": h, "starts": starts}


def _swiglu_experts_forward(params, xs, counts):
    wg, wu, wd = (params[k] for k in SWIGLU_EXPERT_KEYS)
    starts = np.concatenate([[0], np.cumsum(counts)])
    g = np.empty_like(xs, shape=(len(xs), wg.shape[2]))
    u = np.empty_like(g)
    ys = np.empty_like(xs, shape=(len(xs), wd.shape[2]))
    for e in range(len(counts)):
        r = slice(starts[e], starts[e + 1])
        g[r], u[r] = xs[r] @ wg[e], xs[r] @ wu[e]
        ys[r] = (silu(g[r]) * u[r]) @ wd[e]
    return ys, {"xs": xs, "g": g, "u": u, "starts": starts}


def experts_backward_input(params, ec, dys):
    if "g" in ec:
        return _swiglu_experts_backward_input(params, ec, dys)
    w1, w2 = params["experts.fc1.w"], params["experts.fc2.w"]
    starts, h = ec["starts"], ec["h"]
    dh, dxs = np.empty_like(h), np.empty_like(ec["xs"])
    for e in range(len(starts) - 1):
        r = slice(starts[e], starts[e + 1])
        dh[r] = gelu_backward(h[r], dys[r] @ w2[e].T)
        dxs[r] = dh[r] @ w1[e].T
    ec["dh"] = dh
    return dxs


def _swiglu_experts_backward_input(params, ec, dys):
    wg, wu, wd = (params[k] for k in SWIGLU_EXPERT_KEYS)
    starts, g, u = ec["starts"], ec["g"], ec["u"]
    dg, du, dxs = np.empty_like(g), np.empty_like(u), np.empty_like(ec["xs"])
    for e in range(len(starts) - 1):
        r = slice(starts[e], starts[e + 1])
        da = dys[r] @ wd[e].T
        dg[r], du[r] = silu_backward(g[r], da * u[r]), silu(g[r]) * da
        dxs[r] = dg[r] @ wg[e].T + du[r] @ wu[e].T
    ec["dg"], ec["du"] = dg, du
    return dxs


def experts_backward_weight(params, ec, dys):
    starts, xs = ec["starts"], ec["xs"]
    if "g" in ec:
        grads = {k: np.zeros_like(params[k]) for k in SWIGLU_EXPERT_KEYS}
        for e in range(len(starts) - 1):
            r = slice(starts[e], starts[e + 1])
            grads["experts.down.w"][e] = (silu(ec["g"][r]) * ec["u"][r]).T @ dys[r]
            grads["experts.gate.w"][e] = xs[r].T @ ec["dg"][r]
            grads["experts.up.w"][e] = xs[r].T @ ec["du"][r]
        return grads
    h, dh = ec["h"], ec["dh"]
    g = {k: np.zeros_like(params[k]) for k in EXPERT_KEYS}
    for e in range(len(starts) - 1):
        r = slice(starts[e], starts[e + 1])
        g["experts.fc2.w"][e] = gelu(h[r]).T @ dys[r]
        g["experts.fc2.b"][e] = dys[r].sum(0)
        g["experts.fc1.w"][e] = xs[r].T @ dh[r]
        g["experts.fc1.b"][e] = dh[r].sum(0)
    return g


class MoE(Module):
    """``MoE(d_model, d_ff, n_experts, top_k, capacity_factor=None)``: see the module
    docstring. ``forward(params, x)`` -> (y, cache); ``cache["dropped"]`` counts the
    dropped assignments and ``cache["counts"]`` the tokens each expert computed."""

    def __init__(self, d_model, d_ff, n_experts, top_k, capacity_factor=None, aux_loss_coef=0.0, std=0.02,
                 dtype=np.float32, mlp="gelu"):
        for name, v in (("d_model", d_model), ("d_ff", d_ff), ("n_experts", n_experts), ("top_k", top_k)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ConfigError(f"MoE: {name} must be a positive integer, got {v!r}")
        if top_k > n_experts:
            raise ConfigError(f"MoE: top_k ({top_k}) cannot exceed n_experts ({n_experts})")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ConfigError(f"MoE: capacity_factor must be positive or None (dropless), got {capacity_factor!r}")
        if mlp not in ("gelu", "swiglu"):
            raise ConfigError(f"MoE: mlp must be 'gelu' or 'swiglu', got {mlp!r}")
        self.mlp = mlp
        self.d_model, self.d_ff, self.n_experts, self.top_k = d_model, d_ff, n_experts, top_k
        self.capacity_factor, self.aux_loss_coef, self.std, self.dtype = capacity_factor, aux_loss_coef, std, dtype

    def init(self, rng):
        d, f, e = self.d_model, self.d_ff, self.n_experts
        if self.mlp == "swiglu":
            return {"router.w": (rng.standard_normal((d, e)) * self.std).astype(self.dtype),
                    **{k: (rng.standard_normal((e, f, d) if k.endswith("down.w") else (e, d, f)) * self.std
                           ).astype(self.dtype) for k in SWIGLU_EXPERT_KEYS}}
        return {"router.w": (rng.standard_normal((d, e)) * self.std).astype(self.dtype),
                "experts.fc1.w": (rng.standard_normal((e, d, f)) * self.std).astype(self.dtype),
                "experts.fc1.b": np.zeros((e, f), self.dtype),
                "experts.fc2.w": (rng.standard_normal((e, f, d)) * self.std).astype(self.dtype),
                "experts.fc2.b": np.zeros((e, d), self.dtype)}

    def forward(self, params, x):
        check_last_dim("MoE", x, self.d_model)
        x2 = np.asarray(x).reshape(-1, self.d_model)
        idx, weights, rc = route(params["router.w"], x2, self.top_k)
        e_ids, tokens = idx.ravel(), np.repeat(np.arange(len(x2)), self.top_k)
        keep = keep_first(e_ids, self.n_experts, capacity(len(x2), self.top_k, self.n_experts,
                                                          self.capacity_factor))
        order = permutation(e_ids, keep)
        counts = np.bincount(e_ids[order], minlength=self.n_experts)
        ys, ec = experts_forward(params, x2[tokens[order]], counts)
        w_flat = weights.ravel()
        y = np.zeros_like(x2)
        np.add.at(y, tokens[order], w_flat[order, None] * ys)
        cache = {"route": rc, "weights": weights, "order": order, "tokens": tokens, "ys": ys, "experts": ec,
                 "counts": counts, "dropped": int((~keep).sum()), "shape": np.shape(x)}
        if self.aux_loss_coef:
            cache["aux_loss"], cache["aux_dp"] = load_balancing(rc["p"], e_ids, self.n_experts)
        return y.reshape(np.shape(x)), cache

    def backward_input(self, params, cache, dy):
        dy2 = dy.reshape(-1, self.d_model)
        order, tokens, ys = cache["order"], cache["tokens"], cache["ys"]
        w_flat = cache["weights"].ravel()
        dys = w_flat[order, None] * dy2[tokens[order]]
        dweights = np.zeros(len(w_flat), dy2.dtype)
        dweights[order] = (dy2[tokens[order]] * ys).sum(-1)
        dxs = experts_backward_input(params, cache["experts"], dys)
        extra = self.aux_loss_coef * cache.get("aux_scale", 1.0) * cache["aux_dp"] if self.aux_loss_coef else None
        dx, dlogits = route_backward(params["router.w"], cache["route"], dweights.reshape(-1, self.top_k), extra)
        np.add.at(dx, tokens[order], dxs)
        cache["dys"], cache["dlogits"] = dys, dlogits
        return dx.reshape(cache["shape"])

    def backward_weight(self, params, cache, dy):
        if "dys" not in cache:
            self.backward_input(params, cache, dy)
        grads = experts_backward_weight(params, cache["experts"], cache["dys"])
        grads["router.w"] = cache["route"]["x"].T @ cache["dlogits"]
        return grads

    def flops(self, x_shape):
        """Matmul FLOPs when the tokens spread over the experts as routed (k per token)."""
        t = math.prod(int(n) for n in x_shape[:-1])
        router = 2 * t * self.d_model * self.n_experts
        experts = 2 * t * self.top_k * (3 if self.mlp == "swiglu" else 2) * self.d_model * self.d_ff
        return {"forward": router + experts, "backward_input": router + experts, "backward_weight": router + experts}

    def active_parameters(self):
        """Parameters one token uses: the router and top_k experts."""
        return self._parameters(self.top_k)

    def parameters(self):
        """Every parameter: the router and all the experts."""
        return self._parameters(self.n_experts)

    def _parameters(self, experts):
        per_expert = 3 * self.d_model * self.d_ff if self.mlp == "swiglu" else \
            2 * self.d_model * self.d_ff + self.d_ff + self.d_model
        return self.d_model * self.n_experts + experts * per_expert
