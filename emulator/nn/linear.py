"""Linear and Embedding layers."""

import math

import numpy as np

from ..errors import ConfigError

from .module import Module, check_last_dim


class Linear(Module):
    """y = x @ w + b, with w of shape (d_in, d_out). Works on any leading dims.

    backward: dx = dy @ w.T (B); dw = x.T @ dy, db = sum(dy) over all leading dims (W).
    Tensor parallelism splits w by columns (each rank a slice of y) or by rows (each rank
    a partial sum of y). A row-parallel layer must add its bias once, after the partial
    sums are reduced: it calls ``forward`` with params that have no ``"b"`` (no bias is
    added then) and adds the bias itself (:mod:`emulator.parallel.tensor_parallel`).
    """

    def __init__(self, d_in, d_out, bias=True, std=0.02, dtype=np.float32):
        if d_in < 1 or d_out < 1:
            raise ConfigError(f"Linear: d_in and d_out must be positive, got {d_in}, {d_out}")
        self.d_in, self.d_out, self.bias, self.std, self.dtype = d_in, d_out, bias, std, dtype

    def init(self, rng):
        p = {"w": (rng.standard_normal((self.d_in, self.d_out)) * self.std).astype(self.dtype)}
        if self.bias:
            p["b"] = np.zeros(self.d_out, self.dtype)
        return p

    def forward(self, params, x):
        check_last_dim("Linear", x, params["w"].shape[0])
        w = params["w"]
        y = (x.reshape(-1, w.shape[0]) @ w).reshape(*x.shape[:-1], w.shape[1])  # one GEMM, not one per batch row
        if "b" in params:
            y += params["b"]
        return y, {"x": x}

    def backward_input(self, params, cache, dy):
        w = params["w"]
        return (dy.reshape(-1, w.shape[1]) @ w.T).reshape(*dy.shape[:-1], w.shape[0])

    def backward_weight(self, params, cache, dy):
        x = cache["x"]
        x2 = x.reshape(-1, x.shape[-1])
        dy2 = dy.reshape(-1, dy.shape[-1])
        grads = {"w": x2.T @ dy2}
        if "b" in params:
            grads["b"] = dy2.sum(axis=0)
        return grads

    def flops(self, x_shape):
        mm = 2 * math.prod(int(n) for n in x_shape[:-1]) * self.d_in * self.d_out
        return {"forward": mm, "backward_input": mm, "backward_weight": mm}


class Embedding(Module):
    """y = w[idx]: a row of w per token id. Backward: dw[i] = sum of dy where idx == i;
    there is no input gradient (token ids are integers), so B returns None."""

    def __init__(self, vocab, d_model, std=0.02, dtype=np.float32):
        self.vocab, self.d_model, self.std, self.dtype = vocab, d_model, std, dtype

    def init(self, rng):
        return {"w": (rng.standard_normal((self.vocab, self.d_model)) * self.std).astype(self.dtype)}

    def forward(self, params, idx):
        idx = np.asarray(idx)
        if not np.issubdtype(idx.dtype, np.integer):
            raise ConfigError(f"Embedding: expected integer token ids, got dtype {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= params["w"].shape[0]):
            raise ConfigError(f"Embedding: token ids must lie in [0, {params['w'].shape[0]}), "
                             f"got min {idx.min()} max {idx.max()}")
        return params["w"][idx], {"idx": idx}

    def backward_input(self, params, cache, dy):
        return None

    def backward_weight(self, params, cache, dy):
        # sum the rows of dy that share a token id: sort by id, add each run of equal ids
        idx = cache["idx"].reshape(-1)
        rows = dy.reshape(-1, dy.shape[-1])
        dw = np.zeros_like(params["w"], dtype=dy.dtype)
        if idx.size:
            order = np.argsort(idx, kind="stable")
            ids = idx[order]
            starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
            dw[ids[starts]] = np.add.reduceat(rows[order], starts, axis=0)
        return {"w": dw}
