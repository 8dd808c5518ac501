"""Context parallelism: layouts, online softmax, ring attention forward and backward against
full attention, the trace, the timeline (overlap, causal balance), and the alternatives."""

import time

import numpy as np
import pytest
from ml_dtypes import bfloat16

from emulator import ConfigError, World, nn
from emulator.parallel import context_parallel as cp
from emulator.parallel.attention_cores import UlyssesCore, core_work
from emulator.parallel.layer_shape import LayerShape

CASES = [(c, causal, layout) for c in (1, 2, 3, 4, 8) for causal in (False, True)
         for layout in ("contiguous", "zigzag")]


def full_attention(q, k, v, causal, do):
    core = nn.AttentionCore(causal)
    o, cache = core.forward({}, (q, k, v))
    return (o,) + core.backward_input({}, cache, do)


def qkvd(shape, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(4)]


# ----------------------------------------------------------------- layouts
def test_split_and_gather_are_inverse_and_zigzag_pairs_ends():
    x = np.arange(16)[:, None]
    z = cp.split_sequence(x, 4, "zigzag")
    assert [s.ravel().tolist() for s in z] == [[0, 1, 14, 15], [2, 3, 12, 13], [4, 5, 10, 11], [6, 7, 8, 9]]
    assert cp.positions(1, 4, 4, "zigzag").tolist() == [2, 3, 12, 13]
    y = np.random.default_rng(0).standard_normal((2, 3, 24, 5))
    for layout in cp.LAYOUTS:
        for c in (1, 2, 3, 4):
            assert np.array_equal(cp.gather_sequence(cp.split_sequence(y, c, layout), layout), y)
    t = y.swapaxes(1, 2)  # the sequence on dim 1
    assert np.array_equal(cp.gather_sequence(cp.split_sequence(t, 2, "zigzag", dim=1), "zigzag", dim=1), t)


@pytest.mark.parametrize("call, words", [
    (lambda: cp.split_sequence(np.zeros((10, 2)), 4), "does not split into 4 equal chunks"),
    (lambda: cp.split_sequence(np.zeros((12, 2)), 4, "zigzag"), "divisible by 8"),
    (lambda: cp.split_sequence(np.zeros((8, 2)), 2, "striped"), "layout must be one of"),
    (lambda: cp.split_sequence(np.zeros((8, 2)), 0), "positive number of ranks"),
    (lambda: cp.gather_sequence([np.zeros((2, 2)), np.zeros((3, 2))]), "different shapes"),
])
def test_bad_layout_arguments_raise_value_error(call, words):
    with pytest.raises(ValueError, match=words):
        call()


# ----------------------------------------------------------------- one device
@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_online_softmax_equals_full_attention(causal):
    q, k, v, do = qkvd((2, 3, 32, 8))
    o = full_attention(q, k, v, causal, do)[0]
    for block in (1, 4, 32):
        np.testing.assert_allclose(cp.blockwise_attention(q, k, v, block, causal), o, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------- the ring
@pytest.mark.parametrize("c, causal, layout", CASES)
def test_ring_attention_equals_full_attention_forward_and_backward(c, causal, layout):
    s = 48
    q, k, v, do = qkvd((2, 2, s, 8), seed=c)
    want = full_attention(q, k, v, causal, do)
    shards = [cp.split_sequence(a, c, layout) for a in (q, k, v, do)]

    def prog(comm):
        out, cache = cp.ring_attention(comm, *(x[comm.rank] for x in shards[:3]), causal=causal, layout=layout)
        return (out,) + cp.ring_attention_backward(comm, cache, shards[3][comm.rank])

    world = World(c)
    got = world.run(prog)
    for i, name in enumerate(("out", "dq", "dk", "dv")):
        np.testing.assert_allclose(cp.gather_sequence([g[i] for g in got], layout), want[i], rtol=1e-10,
                                   atol=1e-12, err_msg=name)
    # the trace: neighbour-only point to point; forward c-1 K/V steps of 2 x shard bytes
    shard_bytes = q.nbytes // c
    for r in range(c):
        sends = [x for x in world.calls[r] if x.op == "send"]
        assert all(x.peer == (r + 1) % c for x in sends)
        assert all(x.peer == (r - 1) % c for x in world.calls[r] if x.op == "recv")
        assert [x.op for x in world.calls[r]] == [x.op for x in world.calls[0]]
        assert all(x.nbytes == 2 * shard_bytes for x in sends)  # K and V (or dK and dV) of one shard
        # K/V: c-1 steps forward and c-1 backward; dK/dV: c steps, the last one home
        assert len(sends) == 2 * (c - 1) + (c if c > 1 else 0)


def test_ring_forward_trace_and_overlap():
    c, s = 4, 64
    q, k, v, _ = qkvd((1, 2, s, 16), dtype=np.float32)
    shards = [cp.split_sequence(a, c) for a in (q, k, v)]
    world = World(c)
    world.run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards)))
    for r in range(c):
        assert [(x.op, x.nbytes) for x in world.calls[r]] == [("send", 2 * q.nbytes // c),
                                                               ("recv", 2 * q.nbytes // c)] * (c - 1)
    tl = world.timeline()
    for r in range(c):  # each transfer runs while the rank computes on the block it holds
        computes = tl.of(r, "compute", "compute")
        transfers = [e for e in tl.events if e.rank == r and e.stream == "comm world" and e.kind == "comm"]
        assert len(computes) == c and transfers
        assert all(any(t.start < e.end and e.start < t.end for e in computes) for t in transfers)


def test_causal_work_per_rank_contiguous_grows_zigzag_is_even():
    c, s = 4, 64
    q, k, v, _ = qkvd((1, 1, s, 8))
    work = {}
    for layout in cp.LAYOUTS:
        shards = [cp.split_sequence(a, c, layout) for a in (q, k, v)]
        world = World(c)
        world.run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards), causal=True, layout=layout))
        work[layout] = [world.timeline().total("compute", r) for r in range(c)]
    w = work["contiguous"]
    assert w[-1] == pytest.approx(c * w[0]) and w == sorted(w)
    assert max(work["zigzag"]) == pytest.approx(min(work["zigzag"]))
    assert sum(work["zigzag"]) < sum(w)  # and skipping the hidden half-blocks saves work in all
    plan = cp.ring_plan(c, causal=True, layout="zigzag")
    assert all(sum(len(plan[t][r][1]) for t in range(c)) == 2 * c + 1 for r in range(c))
    assert [plan[t][0][0] for t in range(c)] == [0, 3, 2, 1]  # rank 0 holds K/V of 0, then 3, 2, 1


def test_bf16_accumulation_error_grows_with_the_ring():
    s = 256
    q, k, v, do = qkvd((1, 2, s, 16), dtype=np.float32)
    o = full_attention(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64), False, do)[0]
    rms = {}
    for acc in (np.float32, bfloat16):
        for c in (1, 16):
            shards = [cp.split_sequence(a, c) for a in (q, k, v)]
            got = World(c).run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards),
                                                              accumulate=acc)[0])
            rms[(acc, c)] = np.sqrt(((cp.gather_sequence(got) - o) ** 2).mean())
    assert rms[(np.float32, 16)] < 1e-6
    assert rms[(bfloat16, 1)] > 100 * rms[(np.float32, 16)]  # one rounding of the output
    assert rms[(bfloat16, 16)] > 1.3 * rms[(bfloat16, 1)]  # and one more per block folded in


@pytest.mark.parametrize("call, words", [
    (lambda comm: cp.ring_attention(comm, np.zeros((2, 4)), np.zeros((2, 4)), np.zeros((3, 4))), "one shape"),
    (lambda comm: cp.ring_attention(comm, *[np.zeros((3, 4))] * 3, layout="zigzag"), "two halves"),
    (lambda comm: cp.ring_attention(comm, *[np.zeros((2, 4))] * 3, layout="spiral"), "layout must be"),
])
def test_ring_misuse_fails_fast_naming_the_rank(call, words):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match=f"rank 0: .*{words}|{words}"):
        World(2).run(call)
    assert time.perf_counter() - t0 < 1


def test_ring_backward_refuses_a_wrong_gradient_shape():
    def prog(comm):
        out, cache = cp.ring_attention(comm, *[np.ones((4, 2))] * 3)
        return cp.ring_attention_backward(comm, cache, np.ones((2, 2)))

    with pytest.raises(ConfigError, match="dout has shape"):
        World(2).run(prog)


# ----------------------------------------------------------------- the alternatives
def test_all_gather_and_ulysses_equal_full_attention_and_move_what_they_should():
    c, b, h, s, d = 4, 1, 4, 32, 8
    q, k, v, do = qkvd((b, h, s, d))
    for causal in (False, True):
        o = full_attention(q, k, v, causal, do)[0]
        for layout in cp.LAYOUTS:
            shards = [cp.split_sequence(a, c, layout) for a in (q, k, v)]
            world = World(c)
            got = world.run(lambda comm: cp.all_gather_attention(comm, *(x[comm.rank] for x in shards), causal,
                                                                 layout))
            np.testing.assert_allclose(cp.gather_sequence(got, layout), o, rtol=1e-12, atol=1e-12)
            assert [x.op for x in world.calls[0]] == ["all_gather"]
            assert world.memory[0].peak_by_kind["buffers"] == 2 * q.nbytes  # the whole sequence's K and V
        shards = [cp.split_sequence(a, c) for a in (q, k, v)]
        world = World(c)
        got = world.run(lambda comm: cp.ulysses_attention(comm, *(x[comm.rank] for x in shards), causal))
        np.testing.assert_allclose(cp.gather_sequence(got), o, rtol=1e-12, atol=1e-12)
        assert [x.op for x in world.calls[0]] == ["all_to_all", "all_to_all"]
    with pytest.raises(ConfigError, match="at most the number of heads"):
        World(8).run(lambda comm: cp.ulysses_attention(comm, *(np.zeros((1, 4, 4, 2)),) * 3))


@pytest.mark.parametrize("c", [2, 4])
@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("causal", [False, True])
def test_ulysses_attention_and_the_blocks_ulysses_core_agree(c, layout, causal):
    """The lesson's ``ulysses_attention`` and the block's ``UlyssesCore`` are one Ulysses: the
    same output on every rank, the same bytes through all-to-alls (q, k and v stacked into
    one call, or one call each)."""
    b, h, n, d = 2, 4, 4, 3
    q, k, v = qkvd((b, h, c * n, d), seed=c)[:3]
    shards = [cp.split_sequence(a, c, layout) for a in (q, k, v)]
    shape = LayerShape(b, n, h * d, h, h, 1, head_dim=d, cp=c, cp_attention="ulysses", cp_layout=layout,
                       causal=causal)

    def core(comm):
        work = core_work(shape, comm.work_context(np.float64), comm.rank)
        with comm.declared(lambda: work.forward, "Ulysses core forward"):
            return UlyssesCore(comm, causal, layout).forward(*(x[comm.rank] for x in shards))[0]

    def function(comm):
        return cp.ulysses_attention(comm, *(x[comm.rank] for x in shards), causal, layout)

    by_core, by_function = World(c), World(c)
    for a, f in zip(by_core.run(core), by_function.run(function)):
        np.testing.assert_allclose(a, f, rtol=1e-13, atol=1e-13)
    assert [x.op for x in by_core.calls[0]] == ["all_to_all"] * 4
    assert [x.op for x in by_function.calls[0]] == ["all_to_all"] * 2
    assert sum(x.nbytes for x in by_core.calls[0]) == sum(x.nbytes for x in by_function.calls[0])
    o = full_attention(q, k, v, causal, q)[0]
    np.testing.assert_allclose(cp.gather_sequence(by_function.run(function), layout), o, rtol=1e-12, atol=1e-12)


def test_the_ulysses_swap_and_its_inverse_move_heads_and_positions():
    c, b, h, n, d = 4, 1, 8, 3, 2
    x = np.random.default_rng(0).standard_normal((b, h, c * n, d))
    shards = cp.split_sequence(x, c)

    def prog(comm):
        heads = cp.to_head_shards(comm, shards[comm.rank])
        return heads, cp.to_sequence_shards(comm, heads, n)

    for r, (heads, back) in enumerate(World(c).run(prog)):
        np.testing.assert_array_equal(heads, x[:, r * h // c:(r + 1) * h // c])  # every position, my heads
        np.testing.assert_array_equal(back, shards[r])
    with pytest.raises(ConfigError, match="at most the number of heads"):
        World(3).run(lambda comm: cp.to_head_shards(comm, shards[0]))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_alternatives_keep_the_inputs_dtype_and_ulysses_sends_its_four_tensors(dtype):
    """A float32 sequence stays float32 through both alternatives; Ulysses sends q, k, v out
    and the output back, (c-1)/c of each: 4 x (c-1)/c of one shard, in the inputs' dtype."""
    c, b, h, s, d = 4, 1, 4, 32, 8
    q, k, v = (a.astype(dtype) for a in qkvd((b, h, s, d))[:3])
    shards = [cp.split_sequence(a, c) for a in (q, k, v)]
    for fn in (cp.all_gather_attention, cp.ulysses_attention):
        world = World(c)
        got = world.run(lambda comm: fn(comm, *(x[comm.rank] for x in shards)))
        assert all(g.dtype == dtype for g in got), fn.__name__
    shard = q.nbytes // c
    assert world.stats().bytes_sent[0] == 4 * shard * (c - 1) // c


@pytest.mark.parametrize("c", [2, 3, 4])
def test_the_ring_holds_two_kv_blocks_in_its_ledger_forward_and_backward(c):
    """Forward: the block it computes with and the one arriving, two K/V blocks at the peak;
    backward: the same for K/V and for the travelling dK/dV; nothing left held after."""
    q, k, v, do = qkvd((1, 2, 4 * c, 8))
    shards = [cp.split_sequence(a, c) for a in (q, k, v, do)]
    block = 2 * q.nbytes // c  # one rank's K and V

    def prog(comm):
        out, cache = cp.ring_attention(comm, *(x[comm.rank] for x in shards[:3]))
        after_forward = comm.memory.peak_by_kind["buffers"]
        cp.ring_attention_backward(comm, cache, shards[3][comm.rank])
        return after_forward, comm.memory.current["buffers"]

    world = World(c)
    for forward_peak, left in world.run(prog):
        assert forward_peak == 2 * block and left == 0
    assert all(world.memory[r].peak_by_kind["buffers"] == 4 * block for r in range(c))
