"""Checks for lesson 04 (context parallelism).

Every answer is compared with full softmax attention (``nn.AttentionCore``) on several
ring sizes, causal and not; the ring's trace is read (neighbours only, c - 1 steps, the
bytes of one K/V block per step), its timeline too (each transfer runs while the rank
computes), and the one-device exercise is measured for memory (the T x T scores never
exist). While a check runs, the library's own versions refuse.
"""

import tracemalloc

import numpy as np

from .. import Topology, World, nn
from ..accounting import activations
from ..parallel import context_parallel as cp
from ..parallel.context_parallel import layout as L
from ..parallel.context_parallel import online_softmax as OS
from ..parallel.context_parallel import ring as RING
from .common import CheckFailed, compare_arrays, expect, passed, run_on_emulator
from .napkins import variants
from .refuse import refusing

ONLINE = (OS.blockwise_attention, OS.OnlineSoftmax.update, RING.ring_attention)
FORWARD = (RING.ring_attention, OS.blockwise_attention, RING.blocks, RING.ring_plan)
LAYOUT = (L.split_sequence, L.gather_sequence, L.positions, L.chunks_of, RING.blocks, RING.ring_plan)
BACKWARD = (RING.ring_attention_backward, RING.blocks)


def _qkv(shape, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(4)]


def _full(q, k, v, causal, do=None):
    core = nn.AttentionCore(causal)
    o, cache = core.forward({}, (q, k, v))
    return o if do is None else (o,) + core.backward_input({}, cache, do)


def check_online_attention(fn):
    """Exercise 4.1: fn(q, k, v, block, causal) -> attention, one block of keys at a time."""
    what = "Exercise 4.1"
    for shape, block, causal in [((1, 1, 8, 4), 8, False), ((2, 3, 32, 8), 4, False), ((2, 3, 32, 8), 8, True),
                                 ((1, 2, 24, 4), 1, True), ((1, 1, 30, 4), 6, True)]:
        q, k, v, _ = _qkv(shape, block)
        with refusing(what, *ONLINE):
            got = fn(q.copy(), k.copy(), v.copy(), block, causal)
        compare_arrays(f"{what}, shape {shape}, block {block}, causal={causal}", got, _full(q, k, v, causal))
    q, k, v, _ = _qkv((1, 1, 1024, 8), 0)
    tracemalloc.start()
    try:
        with refusing(what, *ONLINE):
            fn(q, k, v, 64, True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    scores = 1024 * 1024 * 8
    expect(peak < scores / 2, f"{what}: with 1024 positions in blocks of 64, your function allocated {peak / 1e6:.1f} MB "
                              f"at its peak; the full score matrix is {scores / 1e6:.1f} MB. Keep only one block of "
                              f"scores (and the running max, sum and output) at a time")
    passed(what, f"equal to full attention for 5 shapes and block sizes, causal and not; peak memory "
                 f"{peak / 1e6:.2f} MB where the scores alone would be {scores / 1e6:.1f} MB")


CASES = [(c, causal, layout) for c in (1, 2, 3, 4, 8) for causal in (False, True) for layout in L.LAYOUTS]


def check_ring_forward(fn):
    """Exercise 4.2: fn(comm, q, k, v, causal, layout) -> this rank's rows of attention."""
    what = "Exercise 4.2"
    topo = Topology(flops=1e8)  # compute slow beside the transfers, so that overlap is plain in the timeline
    for c, causal, layout in CASES:
        label = f"{what}, c={c}, {'causal' if causal else 'no mask'}, {layout}"
        q, k, v, _ = _qkv((2, 2, 8 * c, 8), c)
        shards = [cp.split_sequence(a, c, layout) for a in (q, k, v)]
        world = World(c, topology=topo)
        with refusing(what, *FORWARD):
            got = run_on_emulator(world, lambda comm: fn(comm, *(s[comm.rank].copy() for s in shards), causal=causal,
                                                         layout=layout), label)
        compare_arrays(label, cp.gather_sequence(got, layout), _full(q, k, v, causal))
        block = 2 * q.nbytes // c
        for r in range(c):
            calls = world.calls[r]
            bad = [x for x in calls if x.op not in ("send", "recv")]
            if bad:
                raise CheckFailed(f"{label}: rank {r} called {bad[0]!r}; the ring needs point to point only")
            sends = [x for x in calls if x.op == "send"]
            expect(all(x.peer == (r + 1) % c for x in sends) and
                   all(x.peer == (r - 1) % c for x in calls if x.op == "recv"),
                   f"{label}: rank {r} talks to {sorted({x.peer for x in calls})}; send to rank r+1 and receive from "
                   f"r-1 only")
            expect(sum(x.nbytes for x in sends) == (c - 1) * block,
                   f"{label}: rank {r} sent {sum(x.nbytes for x in sends)} bytes; c-1 = {c - 1} steps of one K and "
                   f"V block ({block} bytes) each are needed: no more, no less")
        if c > 1 and not causal:
            tl = world.timeline()
            computes = tl.of(0, "compute", "compute")
            expect(computes, f"{what}: charge each block's compute with comm.compute(flops=...) (4 x batch x heads "
                             f"x n_q x n_k x d_head)")
            transfers = [e for e in tl.events if e.rank == 0 and e.stream.startswith("p2p") and e.kind == "comm"]
            hidden = [t for t in transfers if any(t.start < e.end and e.start < t.end for e in computes)]
            expect(len(hidden) == len(transfers), f"{label}: {len(transfers) - len(hidden)} of rank 0's transfers "
                   f"ran while it computed nothing: post the next block's send and receive (batch_isend_irecv) "
                   f"before computing on the current one, and wait after")
        if causal and layout == "contiguous" and c > 1:
            tl = world.timeline()
            first, last = tl.total("compute", 0), tl.total("compute", c - 1)
            expect(last >= c * first * 0.99, f"{label}: rank 0 computed {first * 1e6:.1f} us, rank {c - 1} "
                   f"{last * 1e6:.1f} us; rank 0's queries come first, so skip the blocks whose keys all come later")
    passed(what, "equal to full attention on 1, 2, 3, 4 and 8 ranks, causal or not, contiguous or zigzag; "
                 "neighbours only, c-1 steps of one K/V block; transfers overlap compute; hidden blocks skipped")


def check_zigzag(split, gather, visible):
    """Exercise 4.3: split(x, c) / gather(shards) in the zigzag layout; visible(q_pos, k_pos)
    -> None (the whole block is hidden by the causal mask) or a boolean mask."""
    what = "Exercise 4.3"
    for c in (1, 2, 3, 4):
        x = np.random.default_rng(c).standard_normal((2, 8 * c, 3))
        with refusing(what, *LAYOUT):
            shards = split(x.copy(), c)
            back = gather([s.copy() for s in shards])
        expect(len(shards) == c, f"{what}: split into {c} shards, got {len(shards)}")
        for r, s in enumerate(shards):
            want = np.concatenate([x[:, r * 4:(r + 1) * 4], x[:, (2 * c - 1 - r) * 4:(2 * c - r) * 4]], axis=1)
            compare_arrays(f"{what}, c={c}: rank {r}'s shard (chunks {r} and {2 * c - 1 - r} of {2 * c})", s, want)
        compare_arrays(f"{what}, c={c}: gather(split(x))", back, x)
    rng = np.random.default_rng(5)
    for _ in range(30):
        qs, ks, n = int(rng.integers(0, 40)), int(rng.integers(0, 40)), int(rng.integers(1, 6))
        qp, kp = np.arange(qs, qs + n), np.arange(ks, ks + n)
        with refusing(what, *LAYOUT):
            got = visible(qp, kp)
        want = kp[None, :] <= qp[:, None]
        if not want.any():
            expect(got is None, f"{what}: keys {kp[0]}..{kp[-1]} all come after queries {qp[0]}..{qp[-1]}; return "
                                f"None so the block is skipped")
        else:
            expect(got is not None, f"{what}: queries {qp[0]}..{qp[-1]} see some of keys {kp[0]}..{kp[-1]}; this "
                                    f"block must be computed")
            compare_arrays(f"{what}: mask of queries {qp[0]}..{qp[-1]} against keys {kp[0]}..{kp[-1]}",
                           np.asarray(got, bool).astype(int), want.astype(int))
    passed(what, "zigzag split and gather equal the layout (rank i: chunks i and 2c-1-i) on 1 to 4 ranks; masks "
                 "right and hidden blocks skipped")


def check_ring_backward(fn):
    """Exercise 4.4: fn(comm, q, k, v, out, lse, dout, causal, layout) -> (dq, dk, dv) for this rank."""
    what = "Exercise 4.4"
    for c, causal, layout in CASES:
        label = f"{what}, c={c}, {'causal' if causal else 'no mask'}, {layout}"
        q, k, v, do = _qkv((2, 2, 4 * c, 8), 10 + c)
        want = _full(q, k, v, causal, do)
        shards = [cp.split_sequence(a, c, layout) for a in (q, k, v, do)]

        forward = World(c).run(lambda comm: cp.ring_attention(comm, *(s[comm.rank] for s in shards[:3]),
                                                             causal=causal, layout=layout))  # the library's

        def prog(comm):
            parts = [s[comm.rank].copy() for s in shards]
            out, cache = forward[comm.rank]
            return fn(comm, parts[0], parts[1], parts[2], out.copy(), cache["lse"].copy(), parts[3], causal=causal,
                      layout=layout)

        world = World(c)
        with refusing(what, *BACKWARD):
            got = run_on_emulator(world, prog, label)
        for i, name in enumerate(("dq", "dk", "dv")):
            compare_arrays(f"{label}: {name}", cp.gather_sequence([g[i] for g in got], layout), want[i + 1])
        for r in range(c):
            calls = [x for x in world.calls[r] if x.op == "send"]
            expect(all(x.peer == (r + 1) % c for x in calls), f"{label}: rank {r} sends to "
                   f"{sorted({x.peer for x in calls})}; the ring sends to rank r+1 only")
    passed(what, "dQ, dK and dV equal full attention's on 1, 2, 3, 4 and 8 ranks, causal or not, in both layouts, "
                 "dK and dV travelling around the ring and home")


def memory_128k(s, b, h, layers, c):
    """Model answer of Napkin 4.1: (activations per GPU per layer, for all layers): the
    34 sbh of a layer's bf16 activations (the s^2 scores never stored) over s / c positions."""
    per_layer = 34 * (s / c) * b * h
    return per_layer, layers * per_layer


def napkin_memory(fn):
    """fn(s, b, h, layers, c) -> (bytes per layer per GPU, bytes of all layers)."""
    cases = [dict(s=131072, b=1, h=8192, layers=80, c=16), dict(s=65536, b=1, h=4096, layers=32, c=8),
             dict(s=262144, b=2, h=16384, layers=126, c=32), dict(s=32768, b=4, h=5120, layers=40, c=4)]
    layer, total = variants("Napkin 4.1", fn, cases, memory_128k, " B", ("bytes per layer", "bytes, all layers"),
                            (activations.activation_bytes_per_layer,))
    passed("Napkin 4.1", f"{layer / 1e9:.2f} GB per layer, {total / 1e9:.0f} GB for all layers per GPU")


def overlap_length(flops=989e12, beta=370e9, dtype_bytes=2):
    """Model answer of Napkin 4.2: the fewest local positions n for which one ring step's
    compute (4 b n^2 h FLOPs) takes as long as its K/V transfer (2 b n h dtype_bytes)."""
    return flops * dtype_bytes / (2 * beta)


def napkin_overlap(fn):
    """fn(flops, beta, dtype_bytes) -> positions per rank at which compute hides the transfer."""
    cases = [dict(flops=989e12, beta=370e9, dtype_bytes=2), dict(flops=989e12, beta=48e9, dtype_bytes=2),
             dict(flops=312e12, beta=250e9, dtype_bytes=2), dict(flops=120e12, beta=48e9, dtype_bytes=4)]
    (n,) = variants("Napkin 4.2", lambda **kw: (fn(**kw),), cases, lambda **kw: (overlap_length(**kw),), "",
                    ("positions",))
    passed("Napkin 4.2", f"on NVLink the transfer hides once each rank holds {n:,.0f} positions; across nodes "
                         f"{overlap_length(beta=48e9):,.0f}")
