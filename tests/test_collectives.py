"""The global view: every algorithm against its one-line NumPy reference, and the steps."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from emulator import ShapeError
from emulator.algorithms import global_view as C

SIZES = [1, 2, 3, 4, 8]
ALGS = ["ring", "tree", "naive"]
DTYPES = [np.float32, np.float64, np.int64]


def make(n, shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(shape) * 10).astype(dtype) for _ in range(n)]


def close(a, b, dtype):
    if np.issubdtype(dtype, np.integer):
        return np.array_equal(a, b)
    tol = 1e-4 if dtype == np.float32 else 1e-12
    return np.allclose(a, b, rtol=tol, atol=tol)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("dtype,op", [(d, op) for d in DTYPES for op in ("sum", "max", "min", "avg", "product")
                                      if not (op == "avg" and d == np.int64)])  # refused: tested below
def test_all_reduce_matches_reference(n, alg, dtype, op):
    bufs = make(n, (5, 3), dtype)
    if op == "product":  # keep products of n values in range
        bufs = [(np.abs(b) % 3 + 1).astype(dtype) for b in bufs]
    out, _ = C.run_plan(C.plan_all_reduce(bufs, op, alg))
    ref = C.reference_all_reduce(bufs, op)
    assert all(o.shape == (5, 3) and o.dtype == dtype for o in out)
    assert all(close(o, r, dtype) for o, r in zip(out, ref))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_and_all_gather_match_reference(n, alg, dtype):
    bufs = make(n, (3 * n, 2), dtype, seed=1)
    out, _ = C.run_plan(C.plan_reduce_scatter(bufs, "sum", alg))
    assert all(close(o, r, dtype) for o, r in zip(out, C.reference_reduce_scatter(bufs)))
    shards = make(n, (2, 5), dtype, seed=2)
    out, _ = C.run_plan(C.plan_all_gather(shards, alg))
    assert all(np.array_equal(o, r) for o, r in zip(out, C.reference_all_gather(shards)))


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("alg", ["tree", "naive"])
@pytest.mark.parametrize("src", [0, -1])
def test_broadcast(n, alg, src):
    src = src % n
    bufs = make(n, (4,), np.float32)
    out, _ = C.run_plan(C.plan_broadcast(bufs, src, alg))
    assert all(np.array_equal(o, bufs[src]) for o in out)


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_ring_step_counts_and_bytes(n):
    S = 4 * n * 6  # float32 elements divisible by n
    bufs = make(n, (S // 4,), np.float32)
    _, steps = C.run_plan(C.plan_all_reduce(bufs, "sum", "ring"))
    assert len(steps) == 2 * (n - 1)
    sent = np.zeros(n)
    for m in steps:
        np.add.at(sent, m.src, m.nbytes)
        assert sorted(m.src) == list(range(n)) and sorted(m.dst) == list(range(n))
    assert np.all(sent == 2 * (n - 1) / n * bufs[0].nbytes)
    _, steps = C.run_plan(C.plan_reduce_scatter(bufs, "sum", "ring"))
    assert len(steps) == n - 1
    assert sum(m.nbytes.sum() for m in steps) == (n - 1) * bufs[0].nbytes


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_tree_is_logarithmic_and_naive_is_two_steps(n):
    bufs = make(n, (16,), np.float64)
    _, tree = C.run_plan(C.plan_all_reduce(bufs, "sum", "tree"))
    assert len(tree) == 2 * int(np.ceil(np.log2(n)))
    _, naive = C.run_plan(C.plan_all_reduce(bufs, "sum", "naive"))
    assert len(naive) == 2
    assert naive[0].nbytes.sum() == (n - 1) * bufs[0].nbytes  # everything lands on rank 0


@pytest.mark.parametrize("n", [1, 2, 3, 4, 8])
def test_steps_generator_draws_the_ring(n):
    bufs = make(n, (2 * n,), np.float64)
    gen = C.ring_all_reduce_steps(bufs)
    steps = []
    try:
        while True:
            steps.append(next(gen))
    except StopIteration as stop:
        result = stop.value
    assert len(steps) == 2 * (n - 1)
    for k, step in enumerate(steps[: n - 1]):
        # after reduce-scatter step k, the chunk a rank just received holds k+2 contributions
        for i in range(n):
            d, (c,) = step.dst[i], step.chunks[i]
            assert len(step.contributors(d, c)) == k + 2
    if steps:
        last = steps[-1]
        assert all(last.complete(r, c) for r in range(n) for c in range(n))
        for r in range(n):
            assert np.allclose(last.buffers[r].reshape(-1), result[r])
    ref = C.reference_all_reduce(bufs)
    assert all(np.allclose(a, b) for a, b in zip(result, ref))


def test_reduce_scatter_steps_end_with_owned_chunks():
    n = 4
    steps = list(C.ring_reduce_scatter_steps(make(n, (8,), np.float64)))
    assert [steps[-1].complete(r, r) for r in range(n)] == [True] * n
    assert not steps[-1].complete(0, 1)


def test_uneven_reduce_scatter_is_refused():
    with pytest.raises(ShapeError, match="does not split into 3"):
        C.ring_reduce_scatter(make(3, (4,), np.float32))


def test_mismatched_buffers_and_unknown_names():
    with pytest.raises(ShapeError, match="rank 1 has shape"):
        C.ring_all_reduce([np.zeros(3), np.zeros(4)])
    with pytest.raises(ValueError, match="unknown reduce op"):
        C.ring_all_reduce([np.zeros(3)] * 2, op="prod")
    with pytest.raises(ValueError, match="torch calls the mean 'avg'"):
        C.ring_all_reduce([np.zeros(3)] * 2, op="mean")
    with pytest.raises(ShapeError, match="avg"):
        C.ring_all_reduce([np.zeros(3, int)] * 2, op="avg")


def test_inputs_are_untouched():
    bufs = make(4, (8,), np.float64)
    before = [b.copy() for b in bufs]
    for alg in ALGS:
        C.run_plan(C.plan_all_reduce(bufs, "sum", alg))
    assert all(np.array_equal(a, b) for a, b in zip(bufs, before))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), rows=st.integers(1, 4), cols=st.integers(1, 5), seed=st.integers(0, 99))
def test_all_reduce_is_reduce_scatter_then_all_gather(n, rows, cols, seed):
    bufs = make(n, (rows * n, cols), np.int64, seed)
    ar = C.ring_all_reduce(bufs)
    rs = C.ring_reduce_scatter(bufs)
    ag = C.ring_all_gather(rs)
    assert all(np.array_equal(a, b) for a, b in zip(ar, ag))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 8), elems=st.integers(0, 50), alg=st.sampled_from(ALGS))
def test_every_chunk_travels_n_minus_1_times_per_phase(n, elems, alg):
    bufs = make(n, (elems,), np.float32)
    _, steps = C.run_plan(C.plan_all_reduce(bufs, "sum", alg))
    total = sum(int(m.nbytes.sum()) for m in steps)
    S = bufs[0].nbytes
    expected = {"ring": 2 * (n - 1) * S, "naive": 2 * (n - 1) * S,
                "tree": 2 * (n - 1) * S}[alg]  # a binomial tree also has n-1 edges each way
    assert total == expected


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 99))
def test_all_to_all_is_its_own_inverse(n, seed):
    rng = np.random.default_rng(seed)
    chunks = [[rng.standard_normal(rng.integers(0, 4)) for _ in range(n)] for _ in range(n)]
    once, steps = C.all_to_all_pairwise(chunks)
    assert len(steps) == n - 1
    for r in range(n):
        for i in range(n):
            assert np.array_equal(once[r][i], chunks[i][r])  # transposed chunks
    twice, _ = C.all_to_all_pairwise(once)
    assert all(np.array_equal(twice[r][i], chunks[r][i]) for r in range(n) for i in range(n))


@settings(max_examples=30, deadline=None)
@given(n=st.integers(1, 6), seed=st.integers(0, 99))
def test_grouped_all_to_all_moves_the_same_data_in_one_step(n, seed):
    """NCCL's schedule (every message at once) delivers what the pairwise one does, in one step
    of n(n-1) messages, each the bytes of its chunk."""
    rng = np.random.default_rng(seed)
    chunks = [[rng.standard_normal(rng.integers(0, 4)) for _ in range(n)] for _ in range(n)]
    grouped, steps = C.all_to_all_grouped(chunks)
    pairwise, _ = C.all_to_all_pairwise(chunks)
    assert all(np.array_equal(grouped[r][i], pairwise[r][i]) for r in range(n) for i in range(n))
    assert len(steps) == (1 if n > 1 else 0)
    if n > 1:
        (m,) = steps
        assert len(m.src) == n * (n - 1) and not (m.src == m.dst).any()
        assert all(m.nbytes[k] == chunks[m.src[k]][m.dst[k]].nbytes for k in range(len(m.src)))


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("elems", [7, 1000, 40000])  # below and above the small-buffer threshold
@pytest.mark.parametrize("op", ["sum", "max"])
def test_small_buffers_give_the_stepped_ring_bit_for_bit(n, elems, op):
    """run_plan takes a chunk-major shortcut for small buffers; it must add in the ring's order."""
    bufs = [b.astype(np.float32) for b in make(n, (elems,), np.float64, seed=elems)]
    fast, _ = C.run_plan(C.plan_all_reduce(bufs, op, "ring"))
    stepped = C.ring_all_reduce_steps(bufs, op)
    try:
        while True:
            next(stepped)
    except StopIteration as stop:
        slow = stop.value
    assert all(np.array_equal(a, b) for a, b in zip(fast, slow))
    rs_bufs = [b[: elems - elems % n] for b in bufs]
    fast_rs, _ = C.run_plan(C.plan_reduce_scatter(rs_bufs, op, "ring"))
    steps = list(C.ring_reduce_scatter_steps(rs_bufs, op))
    for r in range(n):
        last = steps[-1].buffers[r][r] if steps else rs_bufs[r]
        assert np.array_equal(fast_rs[r], last)


def test_completeness_knows_gathers_from_reductions():
    n = 4
    gather = list(C.ring_all_gather_steps(make(n, (2,), np.float64)))
    assert sum(gather[0].complete(r, c) for r in range(n) for c in range(n)) == 2 * n  # own + one received
    assert all(gather[-1].complete(r, c) for r in range(n) for c in range(n))
    plan = C.plan_all_reduce(make(n, (8,), np.float64))
    start = C.initial_step(plan)
    assert start.index == -1 and not any(start.complete(r, c) for r in range(n) for c in range(n))
