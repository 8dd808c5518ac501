"""Lesson 04's checks reject plausible wrong answers and accept other correct ones."""

import numpy as np
import pytest

from emulator import P2POp
from emulator.grading import CheckFailed
from emulator.grading import lesson04 as g
from emulator.nn.attention_core import softmax
from emulator.parallel import context_parallel as cp


# ----------------------------------------------------------------- Exercise 4.1
def online_by_logsumexp(q, k, v, block, causal=False):
    """Right, written differently: keep the running log-sum-exp instead of max and sum."""
    n, d = q.shape[-2], q.shape[-1]
    lse = np.full(q.shape[:-1], -np.inf)
    o = np.zeros(q.shape)
    for j0 in range(0, k.shape[-2], block):
        x = q @ k[..., j0:j0 + block, :].swapaxes(-1, -2) / np.sqrt(d)
        if causal:
            x = np.where(np.arange(j0, j0 + x.shape[-1])[None, :] <= np.arange(n)[:, None], x, -np.inf)
        top = np.maximum(lse, x.max(-1))
        safe = np.where(np.isfinite(top), top, 0)
        new = safe + np.log(np.exp(lse - safe) + np.exp(x - safe[..., None]).sum(-1))
        w_old = np.exp(lse - new)
        o = o * w_old[..., None] + np.exp(x - new[..., None]) @ v[..., j0:j0 + block, :]
        lse = new
    return o


def test_online_attention_check(capsys):
    g.check_online_attention(online_by_logsumexp)
    assert "PASSED Exercise 4.1" in capsys.readouterr().out

    def full_matrix(q, k, v, block, causal=False):  # right values, the whole score matrix at once
        x = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        if causal:
            x = np.where(np.tril(np.ones(x.shape[-2:], bool)), x, -np.inf)
        return softmax(x) @ v

    with pytest.raises(CheckFailed, match="peak"):
        g.check_online_attention(full_matrix)

    def no_rescale(q, k, v, block, causal=False):  # forgets to rescale what was kept when the max grows
        m, l, o = np.full(q.shape[:-1], -np.inf), 0, 0
        for j0 in range(0, k.shape[-2], block):
            x = q @ k[..., j0:j0 + block, :].swapaxes(-1, -2) / np.sqrt(q.shape[-1])
            if causal:
                x = np.where(np.arange(j0, j0 + x.shape[-1])[None, :] <= np.arange(q.shape[-2])[:, None], x,
                             -np.inf)
            m = np.maximum(m, x.max(-1))
            p = np.exp(x - np.where(np.isfinite(m), m, 0)[..., None])
            l, o = l + p.sum(-1), o + p @ v[..., j0:j0 + block, :]
        return o / l[..., None]

    with pytest.raises(CheckFailed, match="differ from the reference"):
        g.check_online_attention(no_rescale)
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_online_attention(lambda q, k, v, block, causal=False: cp.blockwise_attention(q, k, v, block, causal))


# ----------------------------------------------------------------- Exercise 4.2
def ring_variant(overlap=True, both_ways=False, separate_messages=False, skip=True):
    def fn(comm, q, k, v, causal=False, layout="contiguous"):
        c, n, d = comm.size, q.shape[-2], q.shape[-1]
        right, left = (comm.rank + 1) % c, (comm.rank - 1) % c
        state = cp.OnlineSoftmax(q.shape[:-1], d)
        mine = cp.positions(comm.rank, c, n, layout)

        def post(kk, vv):
            if separate_messages:  # K and V as two messages: also right
                return comm.batch_isend_irecv([P2POp(comm.isend, kk, right), P2POp(comm.irecv, np.empty_like(kk), left),
                                               P2POp(comm.isend, vv, right), P2POp(comm.irecv, np.empty_like(vv), left)])
            hs = comm.batch_isend_irecv([P2POp(comm.isend, np.stack([kk, vv]), right),
                                         P2POp(comm.irecv, np.empty((2,) + kk.shape), left)])
            return hs

        for t in range(c):
            hs = post(k, v) if t < c - 1 and overlap else None
            theirs = cp.positions((comm.rank - t) % c, c, n, layout)
            seen = theirs[None, :] <= mine[:, None] if causal else np.ones((n, n), bool)
            if seen.any() or not skip:
                x = q @ k.swapaxes(-1, -2) / np.sqrt(d)
                if seen.any():
                    state.update(np.where(seen, x, -np.inf), v)
                comm.compute(flops=4 * np.prod(q.shape[:-2]) * n * n * d)
            if t < c - 1 and not overlap:
                hs = post(k, v)
            if both_ways and t < c - 1:
                comm.batch_isend_irecv([P2POp(comm.isend, k, left), P2POp(comm.irecv, np.empty_like(k), right)])[1].wait()
            if hs:
                if separate_messages:
                    k, v = hs[1].wait(), hs[3].wait()
                else:
                    k, v = hs[1].wait()
        return state.finish(q.dtype)[0]

    return fn


def test_ring_forward_check(capsys):
    g.check_ring_forward(ring_variant(separate_messages=True))
    assert "PASSED Exercise 4.2" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="while it computed nothing"):
        g.check_ring_forward(ring_variant(overlap=False))  # right values, transfers after compute
    with pytest.raises(CheckFailed, match="talks to|sent"):
        g.check_ring_forward(ring_variant(both_ways=True))  # extra traffic the other way

    def all_gather_instead(comm, q, k, v, causal=False, layout="contiguous"):  # a collective, every K/V held
        return cp.all_gather_attention(comm, q, k, v, causal, layout)

    with pytest.raises(CheckFailed, match="point to point only"):
        g.check_ring_forward(all_gather_instead)
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_ring_forward(lambda comm, q, k, v, causal=False, layout="contiguous": cp.ring_attention(
            comm, q, k, v, causal, layout)[0])
    with pytest.raises(CheckFailed, match="skip the blocks"):
        g.check_ring_forward(ring_variant(skip=False))  # right values, computes the hidden blocks too


# ----------------------------------------------------------------- Exercise 4.3
def test_zigzag_check(capsys):
    def split(x, c):
        n = x.shape[-2] // (2 * c)
        return [np.concatenate([x[..., i * n:(i + 1) * n, :], x[..., (2 * c - 1 - i) * n:(2 * c - i) * n, :]], -2)
                for i in range(c)]

    def gather(shards):
        c, n = len(shards), shards[0].shape[-2] // 2
        out = [None] * (2 * c)
        for i, s in enumerate(shards):
            out[i], out[2 * c - 1 - i] = s[..., :n, :], s[..., n:, :]
        return np.concatenate(out, axis=-2)

    def visible(qp, kp):
        mask = kp[None, :] <= qp[:, None]
        return mask if mask.any() else None

    g.check_zigzag(split, gather, visible)
    assert "PASSED Exercise 4.3" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="rank 0's shard \\(chunks 0 and 3 of 4\\)"):
        g.check_zigzag(lambda x, c: np.split(x, c, axis=-2), gather, visible)  # contiguous, not zigzag
    with pytest.raises(CheckFailed, match="skipped"):
        g.check_zigzag(split, gather, lambda qp, kp: kp[None, :] <= qp[:, None])  # never skips
    with pytest.raises(CheckFailed, match="mask of queries"):
        g.check_zigzag(split, gather, lambda qp, kp: None if kp.min() > qp.max() else kp[None, :] < qp[:, None])


# ----------------------------------------------------------------- Exercise 4.4
def test_ring_backward_check(capsys):
    def backward_recomputing_lse(comm, q, k, v, out, lse, dout, causal=False, layout="contiguous", send_home=True):
        c, n, d = comm.size, q.shape[-2], q.shape[-1]
        right, left = (comm.rank + 1) % c, (comm.rank - 1) % c
        mine = cp.positions(comm.rank, c, n, layout)
        delta = (dout * out).sum(-1, keepdims=True)
        dq, kv, dkv = np.zeros_like(q), np.stack([k, v]), np.zeros((2,) + k.shape)
        for t in range(c):
            theirs = cp.positions((comm.rank - t) % c, c, n, layout)
            seen = theirs[None, :] <= mine[:, None] if causal else True
            p = np.where(seen, np.exp(q @ kv[0].swapaxes(-1, -2) / np.sqrt(d) - lse[..., None]), 0.0)
            ds = p * (dout @ kv[1].swapaxes(-1, -2) - delta)
            dq += ds @ kv[0] / np.sqrt(d)
            dkv = dkv + np.stack([ds.swapaxes(-1, -2) @ q / np.sqrt(d), p.swapaxes(-1, -2) @ dout])
            if t < c - 1 or (send_home and c > 1):
                both = np.stack([kv, dkv])
                got = comm.batch_isend_irecv([P2POp(comm.isend, both, right),
                                              P2POp(comm.irecv, np.empty_like(both), left)])[1].wait()
                kv, dkv = got[0], got[1]
        return dq, dkv[0], dkv[1]

    g.check_ring_backward(backward_recomputing_lse)  # K/V and dK/dV in one message: also right
    assert "PASSED Exercise 4.4" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="dk"):
        g.check_ring_backward(lambda *a, **kw: backward_recomputing_lse(*a, **kw, send_home=False))  # one rank off
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_ring_backward(lambda comm, q, k, v, out, lse, dout, causal=False, layout="contiguous":
                              cp.ring_attention_backward(comm, {"q": q, "k": k, "v": v, "out": out, "lse": lse,
                                                                "causal": causal, "layout": layout}, dout))


# ----------------------------------------------------------------- napkins
def test_napkin_checks(capsys):
    g.napkin_memory(lambda s=131072, b=1, h=8192, layers=80, c=16: (34 * s * b * h / c, layers * 34 * s * b * h / c))
    g.napkin_overlap(lambda flops=989e12, beta=370e9, dtype_bytes=2: flops / beta * dtype_bytes / 2)
    out = capsys.readouterr().out
    assert "PASSED Napkin 4.1" in out and "PASSED Napkin 4.2" in out
    with pytest.raises(CheckFailed):  # forgot to divide by c
        g.napkin_memory(lambda s=131072, b=1, h=8192, layers=80, c=16: (34 * s * b * h, layers * 34 * s * b * h))
    with pytest.raises(CheckFailed):  # the problem's number only
        g.napkin_overlap(lambda flops=989e12, beta=370e9, dtype_bytes=2: 2673.0)
