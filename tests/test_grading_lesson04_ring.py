"""Lesson 04's checks of the ring (Exercise 4.3, its forward; 4.4, its backward) reject
plausible wrong rings and accept other correct ones."""

import numpy as np
import pytest

from emulator import P2POp
from emulator.grading import CheckFailed
from emulator.grading import lesson04 as g
from emulator.nn.attention_core import softmax
from emulator.parallel import context_parallel as cp
from tests._lesson04_answers import update_by_logaddexp


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
