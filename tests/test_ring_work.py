"""Ring attention's declared work keeps each step's blocks as shapes and the clock sums the
steps over their distinct shapes: both must give what the steps one by one give."""

import pickle

import pytest

from emulator.errors import ConfigError

from emulator.machine.ring_work import RingAttention
from emulator.parallel.context_parallel.ring import blocks, step_blocks
from emulator.planner import cluster_preset
from emulator.planner.collective_times import ring_attention_seconds

RINGS = [(c, causal, layout, rank) for c in (1, 2, 3, 4, 8, 16) for causal in (True, False)
         for layout in ("contiguous", "zigzag") if not (layout == "zigzag" and c == 3) for rank in {0, c // 2, c - 1}]


def _ring(c, causal, layout, rank, forward=True, n=64):
    return RingAttention("attention: ring", "cp", c, forward, step_blocks(rank, c, n, causal, layout), 2.0e6,
                         "bf16", heads=32, head_dim=128, passes=2 if forward else 5, compute="bf16")


def _one_by_one(ring, ranks, topology):
    """The steps in order, each its kernels' time or the hop's, whichever is longer (the
    definition :func:`ring_attention_seconds` sums in closed form)."""
    n = len(ranks)
    crosses = len({r // topology.gpus_per_node for r in ranks}) > 1
    hop = (topology.nic if crosses else topology.nvlink).time(ring.kv_bytes)
    back = 0.0 if ring.forward else hop
    total = 0.0
    for t, (kernels, _) in enumerate(ring.steps):
        compute = sum(topology.device.time(k) for k in kernels)
        shift = 0.0 if (n == 1 or t == n - 1) else hop
        total += max(compute, shift) + back
    return total


@pytest.mark.parametrize("c,causal,layout,rank", RINGS)
def test_step_blocks_are_the_blocks_the_ring_computes(c, causal, layout, rank):
    for t, step in enumerate(step_blocks(rank, c, 64, causal, layout)):
        want = tuple((q.stop - q.start, k.stop - k.start)
                     for q, k, _ in blocks(rank, (rank - t) % c, c, 64, causal, layout))
        assert step == want, (t, step, want)


@pytest.mark.parametrize("c,causal,layout,rank", RINGS)
def test_distinct_steps_count_every_step_once(c, causal, layout, rank):
    ring = _ring(c, causal, layout, rank)
    assert sum(n for _, n in ring.distinct) == c
    assert ring.kernel_count == sum(len(k) for k, _ in ring.steps)
    assert ring.flops == pytest.approx(sum(k.flops for ks, _ in ring.steps for k in ks), rel=1e-12)
    for t, (kernels, kv) in enumerate(ring.steps):
        assert kv == ring.kv_bytes
        assert all(k.name == f"attention: ring step {t}" for k in kernels)  # the names the engine charges
        assert tuple((k.s_q, k.s_k) for k in kernels) == ring.blocks[t]


@pytest.mark.parametrize("forward", [True, False])
@pytest.mark.parametrize("c,causal,layout,rank", RINGS)
def test_the_closed_form_is_the_steps_one_by_one(c, causal, layout, rank, forward):
    topo = cluster_preset("h100", nodes=4).topology
    ring = _ring(c, causal, layout, rank, forward)
    for ranks in (tuple(range(c)), tuple(range(0, 8 * c, 8))):  # inside a node, and across nodes
        want = _one_by_one(ring, ranks, topo)
        assert ring_attention_seconds(ring, ranks, topo) == pytest.approx(want, rel=1e-12)


def test_the_closed_form_sees_every_step():
    """A ring whose steps differ in one place only takes another time: no step is left out
    of the closed form (the steps' kernels outlast the hop, so each one counts)."""
    topo = cluster_preset("h100", nodes=1).topology
    c = 8
    base = _ring(c, False, "contiguous", 0, n=4096)
    ranks = tuple(range(c))
    t0 = ring_attention_seconds(base, ranks, topo)
    for t in range(c):
        changed = list(base.blocks)
        changed[t] = ()  # step t computes nothing
        other = RingAttention(base.name, base.group, c, True, tuple(changed), base.kv_bytes, base.dtype,
                              base.heads, base.head_dim, base.passes, base.compute)
        assert ring_attention_seconds(other, ranks, topo) < t0, t
        assert ring_attention_seconds(other, ranks, topo) == pytest.approx(_one_by_one(other, ranks, topo), rel=1e-12)


def test_a_ring_hashes_as_its_fields_and_survives_pickling():
    a, b = _ring(8, True, "zigzag", 3), _ring(8, True, "zigzag", 3)
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != _ring(8, True, "contiguous", 3) and _ring(8, True, "contiguous", 3) != _ring(8, True, "contiguous", 2)
    copy = pickle.loads(pickle.dumps(a))
    assert copy == a and hash(copy) == hash(a) and {a: 1}[copy] == 1
    copy.__dict__["_hash"] = (-1, 12345)  # a hash kept by another process is computed again
    assert hash(copy) == hash(a)


@pytest.mark.parametrize("rank", [-1, 4, 5])
def test_a_rank_outside_the_ring_is_refused(rank):
    with pytest.raises(ConfigError, match=f"over 4 ranks has no rank {rank}"):
        step_blocks(rank, 4, 8, True, "zigzag")
