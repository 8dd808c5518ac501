"""The tensor-parallel block as an nn module: B then W equals B+W, every variant (GQA,
SwiGLU, ring and Ulysses cores over a context-parallel group) equals the single-device
block, keeping the gathered input trades the re-gather for memory, placements shard."""

import numpy as np
import pytest

from emulator import World, nn
from emulator.mesh import Mesh
from emulator.parallel.attention_cores import RingCore, UlyssesCore
from emulator.parallel.context_parallel import gather_sequence, split_sequence
from emulator.parallel.tp_block import TensorParallelBlock

D, A, B, S, FF = 16, 4, 2, 8, 32


def reference(kv=A, mlp="gelu"):
    blk = nn.TransformerBlock(D, A, FF, dtype=np.float64, n_kv_heads=kv, mlp=mlp)
    P = blk.init(np.random.default_rng(0))
    P = {k: v + np.random.default_rng(9).standard_normal(v.shape) * 0.05 for k, v in P.items()}
    x = np.random.default_rng(1).standard_normal((B, S, D))
    y, cache = blk.forward(P, x)
    dy = np.random.default_rng(2).standard_normal(y.shape)
    dx, g = blk.backward(P, cache, dy)
    return P, x, dy, y, dx, g


# (tp, K/V heads, MLP): every tp that divides the K/V heads (each rank holds whole heads)
SPLITS = [(t, kv, mlp) for t in (1, 2, 4) for kv, mlp in ((A, "gelu"), (2, "swiglu"), (1, "gelu")) if kv % t == 0]


@pytest.mark.parametrize("t,kv,mlp", SPLITS)
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_split_backward_equals_one_device(t, sp, kv, mlp, recompute):
    P, x, dy, y_ref, dx_ref, g_ref = reference(kv, mlp)

    def prog(comm):
        tb = TensorParallelBlock(comm, D, A, FF, sequence_parallel=sp, act_dtype=np.float64, n_kv_heads=kv, mlp=mlp,
                                 recompute=recompute)
        p = tb.shard(P)
        sl = slice(comm.rank * S // t, (comm.rank + 1) * S // t) if sp else slice(None)
        y, c = tb.forward(p, x[:, sl])
        dx = tb.backward_input(p, c, dy[:, sl])
        g = tb.backward_weight(p, c, dy[:, sl])
        return y, dx, g, tb.shard(g_ref)

    out = World(t).run(prog)
    cat = (lambda k: np.concatenate([o[k] for o in out], axis=1)) if sp else (lambda k: out[0][k])
    assert np.allclose(cat(0), y_ref) and np.allclose(cat(1), dx_ref)
    for _, _, g, want in out:
        assert sorted(g) == sorted(want)
        assert all(np.allclose(g[k], want[k]) for k in want), [k for k in want if not np.allclose(g[k], want[k])]


def test_keeping_the_gathered_input_skips_the_regather():
    P, x, dy, y_ref, dx_ref, g_ref = reference()
    t = 2

    def prog(comm, keep):
        tb = TensorParallelBlock(comm, D, A, FF, sequence_parallel=True, act_dtype=np.float64,
                                 keep_gathered_input=keep)
        p = tb.shard(P)
        sl = slice(comm.rank * S // t, (comm.rank + 1) * S // t)
        y, c = tb.forward(p, x[:, sl])
        held = nn.cache_bytes(c)
        dx, g = tb.backward(p, c, dy[:, sl])
        return dx, g, sum(held.values())

    sent = {}
    for keep in (False, True):
        w = World(t)
        out = w.run(prog, keep)
        for r, (dx, g, _) in enumerate(out):
            assert np.allclose(dx, dx_ref[:, r * S // t:(r + 1) * S // t])
        sent[keep] = (sum(c.nbytes for c in w.calls[0]), out[0][2])
    assert sent[True][0] < sent[False][0]  # two all-gathers fewer in backward
    assert sent[True][1] > sent[False][1]  # the whole sequence's inputs held instead


@pytest.mark.parametrize("core", ["ring", "ulysses"])
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("t,c", [(1, 2), (2, 2), (1, 4)])
def test_context_parallel_cores_equal_one_device(core, layout, t, c):
    kv = 2 if core == "ring" else A
    P, x, dy, y_ref, dx_ref, g_ref = reference(kv)
    # positions are the model's business (the embedding); a block sees its shard only

    def prog(comm):
        tp, cp = comm.group("tp"), comm.group("cp")
        Core = RingCore if core == "ring" else UlyssesCore
        tb = TensorParallelBlock(tp, D, A, FF, act_dtype=np.float64, n_kv_heads=kv, core=Core(cp, True, layout))
        p = tb.shard(P)
        xs, dys = split_sequence(x, c, layout, dim=1), split_sequence(dy, c, layout, dim=1)
        y, cache = tb.forward(p, xs[cp.rank])
        dx, g = tb.backward(p, cache, dys[cp.rank])
        return y, dx, g, tb.shard(g_ref), cp.rank, tp.rank

    out = World(mesh=Mesh({"cp": c, "tp": t})).run(prog)
    ys = [o[0] for o in out if o[5] == 0]
    dxs = [o[1] for o in out if o[5] == 0]
    assert np.allclose(gather_sequence(ys, layout, dim=1), y_ref)
    assert np.allclose(gather_sequence(dxs, layout, dim=1), dx_ref)
    for tpr in range(t):  # weight gradients: partial over cp, summed they are one device's
        mine = [o for o in out if o[5] == tpr]
        want = mine[0][3]
        for k in want:
            assert np.allclose(sum(o[2][k] for o in mine), want[k]), k


def test_the_ring_carries_kv_heads_only():
    """Grouped-query attention on a ring: K/V travel with their own heads (2 of 4 here), not
    repeated for every query head."""
    P, x, dy, *_ = reference(kv=2)

    def prog(comm):
        tb = TensorParallelBlock(comm.new_group([comm.global_rank]), D, A, FF, act_dtype=np.float64, n_kv_heads=2,
                                 core=RingCore(comm, True, "zigzag"))
        y, c = tb.forward(tb.shard(P), split_sequence(x, 2, "zigzag", dim=1)[comm.rank])
        return y

    w = World(2)
    w.run(prog)
    sends = [c for c in w.calls[0] if c.op == "send"]
    assert sends and all(c.nbytes == 2 * B * 2 * (S // 2) * (D // A) * 8 for c in sends)  # K and V, 2 heads
