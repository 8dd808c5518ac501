"""Lesson 04's checks reject plausible wrong answers and accept other correct ones."""

import numpy as np
import pytest

from emulator import P2POp
from emulator.grading import CheckFailed
from emulator.grading import lesson04 as g
from emulator.nn.attention_core import softmax
from emulator.parallel import context_parallel as cp


# ----------------------------------------------------------------- Exercise 4.1
def update_by_logaddexp(m, l, acc, scores, v):
    """Right, written differently: the new sum as a log-sum-exp, the max taken after."""
    m_new = np.maximum(m, scores.max(-1))
    ref = np.where(np.isfinite(m_new), m_new, 0.0)
    with np.errstate(divide="ignore"):
        log_l = np.logaddexp(np.log(l) + m - ref, np.log(np.exp(scores - ref[..., None]).sum(-1)))
    keep = np.exp(np.where(np.isfinite(m), m - ref, -np.inf))
    return m_new, np.exp(log_l), acc * keep[..., None] + np.exp(scores - ref[..., None]) @ v


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


# ----------------------------------------------------------------- Exercise 4.3
def swap(comm, x, to, frm):
    """One batch: send ``x`` to ``to``, receive the same shape from ``frm``; returns what came."""
    buf = np.empty_like(x)
    for w in comm.batch_isend_irecv([P2POp(comm.isend, x, to), P2POp(comm.irecv, buf, frm)]):
        w.wait()
    return buf


def ring_variant(overlap=True, both_ways=False, separate_messages=False, skip="quarters", gather_all=False,
                 library_state=False, update=update_by_logaddexp):
    """A ring forward; right by default (K and V in one message or two, the student's own
    update), wrong in the way each flag says."""

    def fn(comm, q, k, v, causal=False, layout="contiguous"):
        c, n, d = comm.size, q.shape[-2], q.shape[-1]
        right, left = (comm.rank + 1) % c, (comm.rank - 1) % c
        m, l, acc = np.full(q.shape[:-1], -np.inf), np.zeros(q.shape[:-1]), np.zeros(q.shape)
        state = cp.OnlineSoftmax(q.shape[:-1], d) if library_state else None
        held = []

        def post(kk, vv):
            """One batch; returns (its handles, the buffers that will hold K and V)."""
            if separate_messages:
                bufs = np.empty_like(kk), np.empty_like(vv)
                return comm.batch_isend_irecv([P2POp(comm.isend, kk, right), P2POp(comm.irecv, bufs[0], left),
                                               P2POp(comm.isend, vv, right), P2POp(comm.irecv, bufs[1], left)]), bufs
            buf = np.empty((2,) + kk.shape)
            return comm.batch_isend_irecv([P2POp(comm.isend, np.stack([kk, vv]), right),
                                           P2POp(comm.irecv, buf, left)]), buf

        for t in range(c):
            hs = post(k, v) if t < c - 1 and overlap else None
            src = (comm.rank - t) % c
            if gather_all:  # keep every block, one softmax at the end
                held.append((src, k.copy(), v.copy()))
            pieces = [(cp.positions(comm.rank, c, n, layout), slice(0, n), cp.positions(src, c, n, layout),
                       slice(0, n))]
            if skip == "quarters":
                pieces = [(np.arange(qs, qs + qn), slice(i * qn, (i + 1) * qn), np.arange(ks, ks + kn),
                           slice(j * kn, (j + 1) * kn))
                          for i, (qs, qn) in enumerate(cp.chunks_of(comm.rank, c, n, layout))
                          for j, (ks, kn) in enumerate(cp.chunks_of(src, c, n, layout))]
            for qp, rows, kp, cols in pieces:
                seen = kp[None, :] <= qp[:, None] if causal else np.ones((len(qp), len(kp)), bool)
                if seen.any() or skip == "never":
                    x = np.where(seen, q[..., rows, :] @ k[..., cols, :].swapaxes(-1, -2) / np.sqrt(d), -np.inf)
                    if seen.any() and not gather_all:
                        if state is not None:
                            state.update(x, v[..., cols, :], rows)
                        else:
                            m[..., rows], l[..., rows], acc[..., rows, :] = update(
                                m[..., rows], l[..., rows], acc[..., rows, :], x, v[..., cols, :])
                    comm.compute(flops=4 * np.prod(q.shape[:-2]) * len(qp) * len(kp) * d)
            if t < c - 1 and not overlap:
                hs = post(k, v)
            if both_ways and t < c - 1:
                swap(comm, k, left, right)
            if hs:
                works, bufs = hs
                for w in works:  # one handle for the batch
                    w.wait()
                k, v = bufs
        if gather_all:
            mine = cp.positions(comm.rank, c, n, layout)
            keys = np.concatenate([b[1] for b in held], -2)
            values = np.concatenate([b[2] for b in held], -2)
            pos = np.concatenate([cp.positions(b[0], c, n, layout) for b in held])
            x = q @ keys.swapaxes(-1, -2) / np.sqrt(d)
            if causal:
                x = np.where(pos[None, :] <= mine[:, None], x, -np.inf)
            return softmax(x) @ values
        return state.finish(q.dtype)[0] if state is not None else acc / l[..., None]

    return fn


def test_ring_forward_check(capsys):
    g.check_ring_forward(ring_variant(separate_messages=True))  # K and V apart, another update: right
    assert "PASSED Exercise 4.3" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="while it computed nothing"):
        g.check_ring_forward(ring_variant(overlap=False))  # right values, transfers after compute
    with pytest.raises(CheckFailed, match="talks to|sent"):
        g.check_ring_forward(ring_variant(both_ways=True))  # extra traffic the other way

    def all_gather_instead(comm, q, k, v, causal=False, layout="contiguous"):  # a collective, every K/V held
        return cp.all_gather_attention(comm, q, k, v, causal, layout)

    with pytest.raises(CheckFailed, match="point to point with its neighbours only"):
        g.check_ring_forward(all_gather_instead)
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_ring_forward(lambda comm, q, k, v, causal=False, layout="contiguous": cp.ring_attention(
            comm, q, k, v, causal, layout)[0])
    with pytest.raises(CheckFailed, match="library's own solution"):  # the update is Exercise 4.1's, not the library's
        g.check_ring_forward(ring_variant(library_state=True))
    with pytest.raises(CheckFailed, match="rank r needs r\\+1 blocks"):
        g.check_ring_forward(ring_variant(skip="never"))  # right values, computes the hidden blocks too
    with pytest.raises(CheckFailed, match="quarter-blocks"):  # skips whole blocks only: zigzag no faster
        g.check_ring_forward(ring_variant(skip="blocks"))
    with pytest.raises(CheckFailed, match="K/V blocks each .*two"):  # neighbours only, right bytes, all held
        g.check_ring_forward(ring_variant(gather_all=True))


def test_ring_forward_check_refuses_torch():
    torch = pytest.importorskip("torch")
    ring = ring_variant()

    def with_torch(comm, q, k, v, causal=False, layout="contiguous"):
        torch.zeros(1)
        return ring(comm, q, k, v, causal, layout)

    with pytest.raises(CheckFailed, match="called torch"):
        g.check_ring_forward(with_torch)


def test_layouts_are_measured_on_the_students_ring(capsys):
    """The lesson's 'equal compute, an earlier finish' comes from the student's code: a ring that
    skips whole blocks only is no faster in zigzag; the library's stands in for an unfinished one."""
    tl, whose = g.run_layouts(ring_variant(skip="blocks"))
    assert whose == "yours"
    assert tl["zigzag"].makespan == pytest.approx(tl["contiguous"].makespan)
    tl, _ = g.run_layouts(ring_variant())
    per_rank = [tl["zigzag"].total("compute", r) for r in range(4)]
    assert max(per_rank) == pytest.approx(min(per_rank)) and tl["zigzag"].makespan < 0.6 * tl["contiguous"].makespan

    def unfinished(comm, q, k, v, causal=False, layout="contiguous"):
        raise NotImplementedError("Exercise 4.3: the ring, forward")

    tl, whose = g.run_layouts(unfinished)
    assert whose.startswith("the library's") and tl["zigzag"].makespan < 0.6 * tl["contiguous"].makespan


# ----------------------------------------------------------------- Exercise 4.4
def backward_recomputing_lse(comm, q, k, v, out, lse, dout, causal=False, layout="contiguous", send_home=True):
    """Right, written differently: whole blocks, masked; K/V and dK/dV in one batch, sent
    together even after the last step (K/V home too, unused). With one handle per batch
    every rank waits for its neighbours in each step, so all ranks reach their peak
    together: the whole-block scores are let go before the batch and dK/dV is summed in
    place (a new dK/dV per step, or the scores held through the batch, put every rank
    over the check's bound of two K/V blocks beyond the library's)."""
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
        dkv[0] += ds.swapaxes(-1, -2) @ q / np.sqrt(d)
        dkv[1] += p.swapaxes(-1, -2) @ dout
        del p, ds  # whole-block scores: not held while the batch is in flight
        if t < c - 1 or (send_home and c > 1):
            got = np.empty_like(kv), np.empty_like(dkv)
            for w in comm.batch_isend_irecv([P2POp(comm.isend, kv, right), P2POp(comm.isend, dkv, right),
                                             P2POp(comm.irecv, got[0], left), P2POp(comm.irecv, got[1], left)]):
                w.wait()
            kv, dkv = got
    return dq, dkv[0], dkv[1]


def dense_backward(q_all, k_all, v_all, do_all, out_all, lse_all, causal):
    """(dq, dk, dv) of the whole sequence, densely."""
    d = q_all.shape[-1]
    s = q_all @ k_all.swapaxes(-1, -2) / np.sqrt(d)
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - lse_all[..., None])
    ds = p * (do_all @ v_all.swapaxes(-1, -2) - (do_all * out_all).sum(-1, keepdims=True))
    return ds @ k_all / np.sqrt(d), ds.swapaxes(-1, -2) @ q_all / np.sqrt(d), p.swapaxes(-1, -2) @ do_all


def backward_gathering(collective):
    """Right values, wrong method: gather q, k, v, out, lse and dout (all_gather, or passed
    around the ring point to point and kept), one dense backward, this rank's rows sliced."""

    def fn(comm, q, k, v, out, lse, dout, causal=False, layout="contiguous"):
        c = comm.size
        parts = [q, k, v, dout, out, lse[..., None]]
        if collective:
            whole = [comm.all_gather(x[None]) for x in parts]
            got = [[w[r] for r in range(c)] for w in whole]
        else:
            got = [[None] * c for _ in parts]
            for i, x in enumerate(parts):
                got[i][comm.rank] = x
            held = np.stack(parts[:4])
            small = np.concatenate([out, lse[..., None]], -1)
            for t in range(1, c):
                held = swap(comm, held, (comm.rank + 1) % c, (comm.rank - 1) % c)
                src = (comm.rank - t) % c
                for i in range(4):
                    got[i][src] = held[i]
                if c > 1:  # out and lse travel too
                    small = swap(comm, small, (comm.rank + 1) % c, (comm.rank - 1) % c)
                    got[4][src], got[5][src] = small[..., :-1], small[..., -1:]
        q_all, k_all, v_all, do_all, out_all, lse_all = (cp.gather_sequence(x, layout) for x in got)
        dq, dk, dv = dense_backward(q_all, k_all, v_all, do_all, out_all, lse_all[..., 0], causal)
        mine = cp.positions(comm.rank, c, q.shape[-2], layout)
        return dq[..., mine, :], dk[..., mine, :], dv[..., mine, :]

    return fn


def test_ring_backward_check(capsys):
    g.check_ring_backward(backward_recomputing_lse)  # K/V and dK/dV in one message: also right
    assert "PASSED Exercise 4.4" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="dk"):
        g.check_ring_backward(lambda *a, **kw: backward_recomputing_lse(*a, **kw, send_home=False))  # one rank off
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_ring_backward(lambda comm, q, k, v, out, lse, dout, causal=False, layout="contiguous":
                              cp.ring_attention_backward(comm, {"q": q, "k": k, "v": v, "out": out, "lse": lse,
                                                                "causal": causal, "layout": layout}, dout))
    with pytest.raises(CheckFailed, match="called all_gather"):
        g.check_ring_backward(backward_gathering(collective=True))
    with pytest.raises(CheckFailed, match="keep q and dout home|K/V blocks each"):
        g.check_ring_backward(backward_gathering(collective=False))


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
