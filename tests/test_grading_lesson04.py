"""Lesson 04's checks reject plausible wrong answers and accept other correct ones: the
online softmax (Exercise 4.1), the zigzag layout (4.2) and the napkins (the ring forward and
backward, Exercises 4.3 and 4.4: tests/test_grading_lesson04_ring.py)."""

import numpy as np
import pytest

from emulator.grading import CheckFailed
from emulator.grading import lesson04 as g
from emulator.nn.attention_core import softmax
from emulator.parallel import context_parallel as cp
from tests._lesson04_answers import update_by_logaddexp


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


def key_update(m, l, acc, scores, v):
    m_new = np.maximum(m, scores.max(-1))
    safe = np.where(np.isfinite(m_new), m_new, 0.0)
    p = np.exp(scores - safe[..., None])
    scale = np.exp(m - safe)
    return m_new, l * scale + p.sum(-1), acc * scale[..., None] + p @ v


def attention_with(update):
    def attention(q, k, v, block, causal=False):
        n, d = q.shape[-2], q.shape[-1]
        m, l, acc = np.full(q.shape[:-1], -np.inf), np.zeros(q.shape[:-1]), np.zeros(q.shape)
        for j0 in range(0, k.shape[-2], block):
            x = q @ k[..., j0:j0 + block, :].swapaxes(-1, -2) / np.sqrt(d)
            if causal:
                x = np.where(np.arange(j0, j0 + x.shape[-1])[None, :] <= np.arange(n)[:, None], x, -np.inf)
            m, l, acc = update(m, l, acc, x, v[..., j0:j0 + block, :])
        return acc / l[..., None]
    return attention


def no_max_update(m, l, acc, scores, v):  # e^x with no running max (m stays 0): right for small scores only
    p = np.exp(scores)
    return np.zeros_like(m), l + p.sum(-1), acc + p @ v


def unguarded_update(m, l, acc, scores, v):  # e^(m - m') with m = m' = -inf is nan
    m_new = np.maximum(m, scores.max(-1))
    p = np.exp(scores - m_new[..., None])
    scale = np.exp(m - m_new)
    return m_new, l * scale + p.sum(-1), acc * scale[..., None] + p @ v


def no_rescale_update(m, l, acc, scores, v):  # forgets to rescale what was kept when the max grows
    m_new = np.maximum(m, scores.max(-1))
    p = np.exp(scores - np.where(np.isfinite(m_new), m_new, 0)[..., None])
    return m_new, l + p.sum(-1), acc + p @ v


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning",
                            "ignore:invalid value encountered:RuntimeWarning")  # the wrong answers' own
def test_online_attention_check(capsys):
    g.check_online_attention(key_update, online_by_logsumexp)
    g.check_online_attention(update_by_logaddexp, attention_with(update_by_logaddexp))
    assert capsys.readouterr().out.count("PASSED Exercise 4.1") == 2

    def full_matrix(q, k, v, block, causal=False):  # right values, the whole score matrix at once
        x = q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1])
        if causal:
            x = np.where(np.tril(np.ones(x.shape[-2:], bool)), x, -np.inf)
        return softmax(x) @ v

    with pytest.raises(CheckFailed, match="peak"):
        g.check_online_attention(key_update, full_matrix)
    with pytest.raises(CheckFailed, match="differ from the reference"):
        g.check_online_attention(no_rescale_update, attention_with(no_rescale_update))
    with pytest.raises(CheckFailed, match="overflows"):  # small scores would pass: these reach past 709
        g.check_online_attention(no_max_update, attention_with(key_update))
    with pytest.raises(CheckFailed, match="overflows"):
        g.check_online_attention(key_update, attention_with(no_max_update))
    with pytest.raises(CheckFailed, match="saw only masked scores"):
        g.check_online_attention(unguarded_update, attention_with(key_update))
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_online_attention(key_update, lambda q, k, v, block, causal=False: cp.blockwise_attention(
            q, k, v, block, causal))


def test_online_attention_check_refuses_torch():
    torch = pytest.importorskip("torch")
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    def by_sdpa(q, k, v, block, causal=False):  # right values; torch's memory is invisible to tracemalloc
        t = [torch.from_numpy(x) for x in (q, k, v)]
        return sdpa(*t, is_causal=causal).numpy()

    with pytest.raises(CheckFailed, match="called torch.*NumPy"):
        g.check_online_attention(key_update, by_sdpa)

    def softmax_in_torch(m, l, acc, scores, v):
        torch.softmax(torch.zeros(1), 0)
        return key_update(m, l, acc, scores, v)

    with pytest.raises(CheckFailed, match="called torch"):
        g.check_online_attention(softmax_in_torch, attention_with(key_update))


# ----------------------------------------------------------------- Exercise 4.2
def zigzag_split(x, c):
    n = x.shape[-2] // (2 * c)
    return [np.concatenate([x[..., i * n:(i + 1) * n, :], x[..., (2 * c - 1 - i) * n:(2 * c - i) * n, :]], -2)
            for i in range(c)]


def zigzag_gather(shards):
    c, n = len(shards), shards[0].shape[-2] // 2
    out = [None] * (2 * c)
    for i, s in enumerate(shards):
        out[i], out[2 * c - 1 - i] = s[..., :n, :], s[..., n:, :]
    return np.concatenate(out, axis=-2)


def visible(qp, kp):
    mask = kp[None, :] <= qp[:, None]
    return mask if mask.any() else None


def test_zigzag_check(capsys):
    g.check_zigzag(zigzag_split, zigzag_gather, visible)
    assert "PASSED Exercise 4.2" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="rank 0's shard \\(chunks 0 and 3 of 4\\)"):
        g.check_zigzag(lambda x, c: np.split(x, c, axis=-2), zigzag_gather, visible)  # contiguous, not zigzag
    with pytest.raises(CheckFailed, match="skipped"):
        g.check_zigzag(zigzag_split, zigzag_gather, lambda qp, kp: kp[None, :] <= qp[:, None])  # never skips
    with pytest.raises(CheckFailed, match="mask of queries"):
        g.check_zigzag(zigzag_split, zigzag_gather,
                       lambda qp, kp: None if kp.min() > qp.max() else kp[None, :] < qp[:, None])


# ----------------------------------------------------------------- napkins
def test_napkin_checks(capsys):
    g.napkin_memory(lambda s=131072, b=1, h=8192, layers=80, c=16: (34 * s * b * h / c, layers * 34 * s * b * h / c))

    def overlap(flops=989e12, beta=370e9, dtype_bytes=2, h=16384, kv_heads=8, head_dim=128):
        kv_bytes = 2 * kv_heads * head_dim * dtype_bytes  # per position: K and V
        return kv_bytes / beta / (4 * h / flops)  # n (4 n h / flops) = n kv_bytes / beta, per position pair

    g.napkin_overlap(overlap)
    out = capsys.readouterr().out
    assert "PASSED Napkin 4.1" in out and "PASSED Napkin 4.2" in out
    with pytest.raises(CheckFailed):  # forgot to divide by c
        g.napkin_memory(lambda s=131072, b=1, h=8192, layers=80, c=16: (34 * s * b * h, layers * 34 * s * b * h))
    with pytest.raises(CheckFailed):  # the problem's number only
        g.napkin_overlap(lambda flops=989e12, beta=370e9, dtype_bytes=2, h=16384, kv_heads=8, head_dim=128: 167.0)
    with pytest.raises(CheckFailed):  # K/V as wide as h: grouped-query attention ignored
        g.napkin_overlap(lambda flops=989e12, beta=370e9, dtype_bytes=2, h=16384, kv_heads=8, head_dim=128:
                         flops * dtype_bytes / (2 * beta))
