"""A transformer block split by Megatron's tensor parallelism (and sequence parallelism),
keeping for backward exactly what Korthikanti et al. (2022) count.

h = x + drop(attn(LN1(x))); y = h + drop(MLP(LN2(h))), pre-norm, as ``emulator.nn``'s
block (same parameter names), on the ranks of a tp group (``comm``; size 1 is one device):

* q, k, v and fc1 are column-parallel (rank r: heads r*a/t..., columns r*d_ff/t...); o and
  fc2 are row-parallel, their biases added once after the reduction; the norms are
  replicated. Forward: two all-reduces (after o, after fc2); backward: two more (the input
  gradients of q/k/v and of fc1).
* ``sequence_parallel=True``: x and y are this rank's slice of the sequence (b, s/t, h);
  the norms, dropouts and residuals work on the slice; each all-reduce becomes an
  all-gather before the column-parallel layers and a reduce-scatter after the row-parallel
  ones. The norms' weights and the row-parallel biases then see only a slice of the
  sequence, so their gradients are partial and must be all-reduced over the group.
* Activations are kept in ``act_dtype`` (bf16 for the accounting), dropout masks as one
  byte per element, under the names of :func:`emulator.accounting.activation_terms`:
  ``nn.cache_bytes(cache)`` equals the formula term by term. ``recompute="selective"``
  recomputes the softmax and its dropout in backward; ``"full"`` keeps only the input.
"""

import math

import numpy as np

from ..errors import ConfigError
from ..nn.activations import gelu, gelu_backward
from ..nn.attention_core import softmax
from ..nn.dropout import apply as drop, dropout_mask
from ..nn.layernorm import layer_norm, layer_norm_backward
from . import sequence_parallel as sp

RECOMPUTE = ("none", "selective", "full")
PARTIAL_UNDER_SP = ("ln1.g", "ln1.b", "ln2.g", "ln2.b", "attn.o.b", "mlp.fc2.b")


class TensorParallelBlock:
    def __init__(self, comm, d_model, n_heads, d_ff, causal=True, sequence_parallel=False, dropout=0.0, seed=0,
                 act_dtype=np.float32, recompute="none"):
        t = comm.size
        if n_heads % t or d_ff % t or d_model % n_heads:
            raise ConfigError(f"tensor parallelism over {t} ranks needs heads ({n_heads}) and d_ff ({d_ff}) divisible "
                              f"by {t}, and d_model ({d_model}) by the heads")
        if recompute not in RECOMPUTE:
            raise ConfigError(f"recompute must be one of {RECOMPUTE}, got {recompute!r}")
        self.comm, self.d, self.a, self.ff, self.causal = comm, d_model, n_heads, d_ff, causal
        self.sp, self.p, self.seed, self.act, self.recompute = sequence_parallel, dropout, seed, act_dtype, recompute
        self.dh = d_model // n_heads
        r = comm.rank
        self.cols = slice(r * d_model // t, (r + 1) * d_model // t)  # this rank's heads' columns
        self.ff_cols = slice(r * d_ff // t, (r + 1) * d_ff // t)

    def shard(self, full):
        """This rank's parameters, cut from the single-device block's."""
        out = {}
        for k, v in full.items():
            if k.endswith(("q.w", "k.w", "v.w")):
                out[k] = v[:, self.cols]
            elif k.endswith(("q.b", "k.b", "v.b")):
                out[k] = v[self.cols]
            elif k == "attn.o.w":
                out[k] = v[self.cols]
            elif k == "mlp.fc1.w":
                out[k] = v[:, self.ff_cols]
            elif k == "mlp.fc1.b":
                out[k] = v[self.ff_cols]
            elif k == "mlp.fc2.w":
                out[k] = v[self.ff_cols]
            else:  # norms and the row-parallel biases: replicated
                out[k] = v
        return {k: np.array(v, copy=True) for k, v in out.items()}

    # ----------------------------------------------------------------- helpers
    def _keep(self, x):
        return np.asarray(x, dtype=self.act)

    def _mask(self, which, global_shape, index):
        seed = self.seed * 7919 + {"attn": 1, "drop1": 2, "drop2": 3}[which]
        return dropout_mask(seed, global_shape, index, self.p)

    def _seq(self, local_s):
        """(global sequence length, this rank's slice of it)."""
        if not self.sp:
            return local_s, slice(None)
        s = local_s * self.comm.size
        return s, sp.sequence_slice(self.comm, s)

    def _gather(self, a):  # before a column-parallel layer
        return sp.gather_from_sp_region(self.comm, a) if self.sp else a

    def _reduce(self, y):  # after a row-parallel layer
        return sp.reduce_scatter_to_sp_region(self.comm, y) if self.sp else self.comm.all_reduce(y)

    def _gather_back(self, dy):  # backward of _gather (f's backward without SP)
        return sp.gather_from_sp_region_backward(self.comm, dy) if self.sp else self.comm.all_reduce(dy)

    def _reduce_back(self, dy):  # backward of _reduce (g's backward: identity without SP)
        return sp.reduce_scatter_to_sp_region_backward(self.comm, dy) if self.sp else dy

    def _heads(self, t):
        b, s, _ = t.shape
        return t.reshape(b, s, -1, self.dh).transpose(0, 2, 1, 3)

    @staticmethod
    def _merge(t):
        b, h, s, dh = t.shape
        return t.transpose(0, 2, 1, 3).reshape(b, s, h * dh)

    def _attention_probs(self, q, k, b, s):
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(self.dh)
        if self.causal:
            scores = np.where(np.tri(s, dtype=bool), scores, -np.inf)
        p = softmax(scores)
        heads = slice(self.comm.rank * p.shape[1], (self.comm.rank + 1) * p.shape[1])
        mask = self._mask("attn", (b, self.a, s, s), (slice(None), heads, slice(None), slice(None)))
        return p, mask

    # ----------------------------------------------------------------- forward
    def forward(self, params, x):
        """y and the cache; x is (b, s, d), or (b, s/t, d) with sequence parallelism."""
        if self.recompute == "full":
            y, _ = self._forward(params, x)
            return y, {"layer input": self._keep(x)}
        return self._forward(params, x)

    def _forward(self, P, x):
        c = {}
        b, s_loc, d = x.shape
        s, seq = self._seq(s_loc)
        c["LayerNorm 1 input"] = self._keep(x)
        a = layer_norm(x, P["ln1.g"], P["ln1.b"])
        c["q, k, v projections' input"] = self._keep(a)
        a = self._gather(a)  # (b, s, d)
        q, k, v = (self._heads(a @ P[f"attn.{n}.w"] + P[f"attn.{n}.b"]) for n in "qkv")  # (b, a/t, s, dh)
        c["Q and K"], c["V"] = {"Q": self._keep(q), "K": self._keep(k)}, self._keep(v)
        p, mask = self._attention_probs(q, k, b, s)
        pd = drop(p, mask, self.p)
        if self.recompute == "none":
            c["softmax output"], c["softmax dropout mask"] = self._keep(p), mask
            c["dropout output (times V)"] = self._keep(pd)
        heads = self._merge(pd @ v)  # (b, s, d/t)
        c["output projection input"] = self._keep(heads)
        o = self._reduce(heads @ P["attn.o.w"]) + P["attn.o.b"]  # (b, s_loc, d): bias once
        c["attention dropout mask"] = m1 = self._mask("drop1", (b, s, d), (slice(None), seq, slice(None)))
        h = x + drop(o, m1, self.p)
        c["LayerNorm 2 input"] = self._keep(h)
        a2 = layer_norm(h, P["ln2.g"], P["ln2.b"])
        c["fc1 input"] = self._keep(a2)
        u = self._gather(a2) @ P["mlp.fc1.w"] + P["mlp.fc1.b"]  # (b, s, d_ff/t)
        c["GELU input"] = self._keep(u)
        g = gelu(u)
        c["fc2 input"] = self._keep(g)
        z = self._reduce(g @ P["mlp.fc2.w"]) + P["mlp.fc2.b"]
        c["MLP dropout mask"] = m2 = self._mask("drop2", (b, s, d), (slice(None), seq, slice(None)))
        return h + drop(z, m2, self.p), c

    # ----------------------------------------------------------------- backward
    def backward(self, P, c, dy):
        """(dx, grads of this rank's parameters), the sequence-parallel ones all-reduced."""
        if "layer input" in c:  # full recomputation: run the forward again first
            _, c = self._forward(P, np.asarray(c["layer input"], dtype=dy.dtype))
        w = dy.dtype
        f = lambda name: np.asarray(c[name], dtype=w)  # noqa: E731
        x = f("LayerNorm 1 input")
        b, s_loc, d = x.shape
        s, _ = self._seq(s_loc)
        grads = {}
        dz = drop(dy, c["MLP dropout mask"], self.p)  # MLP branch: y = h + drop(z)
        grads["mlp.fc2.b"] = dz.sum((0, 1))
        dz = self._reduce_back(dz)  # (b, s, d)
        g = f("fc2 input")
        grads["mlp.fc2.w"] = g.reshape(-1, g.shape[-1]).T @ dz.reshape(-1, d)
        du = gelu_backward(f("GELU input"), dz @ P["mlp.fc2.w"].T)
        a2 = self._gather(f("fc1 input"))
        grads["mlp.fc1.w"] = a2.reshape(-1, d).T @ du.reshape(-1, du.shape[-1])
        grads["mlp.fc1.b"] = du.sum((0, 1))
        da2 = self._gather_back(du @ P["mlp.fc1.w"].T)
        dh_ln, grads["ln2.g"], grads["ln2.b"] = layer_norm_backward(f("LayerNorm 2 input"), P["ln2.g"], da2)
        dh = dy + dh_ln
        do = drop(dh, c["attention dropout mask"], self.p)  # attention branch: h = x + drop(o)
        grads["attn.o.b"] = do.sum((0, 1))
        do = self._reduce_back(do)
        heads = f("output projection input")
        grads["attn.o.w"] = heads.reshape(-1, heads.shape[-1]).T @ do.reshape(-1, d)
        dctx = self._heads(do @ P["attn.o.w"].T)
        q, k = (np.asarray(c["Q and K"][n], dtype=w) for n in "QK")
        v = f("V")
        if "softmax output" in c:
            p, mask, pd = f("softmax output"), c["softmax dropout mask"], f("dropout output (times V)")
        else:  # selective recomputation: the s^2 terms again, from Q and K
            p, mask = self._attention_probs(q, k, b, s)
            pd = drop(p, mask, self.p)
        dv = pd.transpose(0, 1, 3, 2) @ dctx
        dp = drop(dctx @ v.transpose(0, 1, 3, 2), mask, self.p)
        ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / math.sqrt(self.dh)
        a = self._gather(f("q, k, v projections' input"))
        da = 0
        for n, gh in (("q", ds @ k), ("k", ds.transpose(0, 1, 3, 2) @ q), ("v", dv)):
            gm = self._merge(gh)
            grads[f"attn.{n}.w"] = a.reshape(-1, d).T @ gm.reshape(-1, gm.shape[-1])
            grads[f"attn.{n}.b"] = gm.sum((0, 1))
            da = da + gm @ P[f"attn.{n}.w"].T
        dx_ln, grads["ln1.g"], grads["ln1.b"] = layer_norm_backward(x, P["ln1.g"], self._gather_back(da))
        if self.sp:
            grads = self.sync_sequence_parallel_grads(grads)
        return dh + dx_ln, grads

    def sync_sequence_parallel_grads(self, grads):
        """Under SP the norms and the row-parallel biases saw only this rank's slice of the
        sequence: their gradients are partial sums. One all-reduce of them all."""
        flat = self.comm.all_reduce(np.concatenate([grads[k].reshape(-1) for k in PARTIAL_UNDER_SP]))
        out, i = dict(grads), 0
        for k in PARTIAL_UNDER_SP:
            out[k] = flat[i:i + grads[k].size].reshape(grads[k].shape)
            i += grads[k].size
        return out


def cached_terms(cache):
    """Bytes kept, by the accounting's term (a term may hold several tensors)."""
    from ..nn.module import cache_bytes

    out = {}
    for path, nbytes in cache_bytes(cache).items():
        term = path.split(".")[0] if not path.startswith("q, k, v") else "q, k, v projections' input"
        out[term] = out.get(term, 0) + nbytes
    return out
