"""Checks for lesson 04 (context parallelism).

Every answer is compared with full softmax attention (``nn.AttentionCore``) on several
ring sizes, causal and not, in both layouts, with scores large enough that an
unstabilised sum of exponentials overflows. The ring's trace is read (point to point
with its neighbours only, the bytes of one K/V block per step), its timeline too (each
transfer runs while the rank computes; each rank's compute is what its causal mask
leaves, quarter-blocks skipped in the zigzag layout), and what the program holds is
measured (``tracemalloc``, beside the library's ring run the same way): a ring holds two
K/V blocks at a time, not the whole sequence's. While a check runs, the library's own
versions refuse, and so does torch (its allocator is invisible to ``tracemalloc``).
"""

import numpy as np

from ..machine.topology import Topology
from ..engine.world import World
from ..accounting import activations, context_parallel
from ..errors import RankError
from ..parallel import context_parallel as cp
from ..parallel.context_parallel import layout as L
from ..parallel.context_parallel import online_softmax as OS
from ..parallel.context_parallel import ring as RING
from .common import CheckFailed, compare_arrays, expect, passed, run_on_emulator
from .lesson04_measured_memory import traced_peak, without_torch
from .lesson04_references import blocks_of_scores, fold_reference, full_attention, qkv
from .lesson04_ring import CASES, compute_per_rank, memory_against_the_library, ring_calls
from .napkins import variants
from .refuse import refusing

ONLINE = (OS.blockwise_attention, OS.OnlineSoftmax, RING.ring_attention)
LAYOUT = (L.split_sequence, L.gather_sequence, L.positions, L.chunks_of, RING.blocks, RING.ring_plan)
FORWARD = (RING.ring_attention, OS.blockwise_attention, OS.OnlineSoftmax, RING.blocks, RING.ring_plan)
BACKWARD = (RING.ring_attention_backward, RING.blocks)
OVERFLOW = 709.0  # e^x overflows float64 above this


# ----------------------------------------------------------------- Exercise 4.1
def check_online_attention(update, attention):
    """Exercise 4.1: update(m, l, acc, scores, v) -> (m, l, acc), one block folded in;
    attention(q, k, v, block, causal) -> softmax attention, one block of keys at a time."""
    what = "Exercise 4.1"
    for rows, n_blocks, width, scale, masked in [(3, 2, 4, 1.0, False), (6, 5, 3, 3.0, True),
                                                  (4, 4, 8, 900.0, False), (8, 6, 2, 1500.0, True)]:
        blocks = blocks_of_scores(rows, n_blocks, width, 5, scale, rows + n_blocks, masked)
        m, l, acc = np.full((2, rows), -np.inf), np.zeros((2, rows)), np.zeros((2, rows, 5))
        label = f"{what}, online_update, {n_blocks} blocks of {width} keys, scores up to {scale * 3:.0f}" + \
            (", some rows masked so far" if masked else "")
        with refusing(what, *ONLINE), without_torch(what):
            for s, v in blocks:
                m, l, acc = (np.asarray(x, np.float64) for x in update(m.copy(), l.copy(), acc.copy(), s.copy(),
                                                                       v.copy()))
        with np.errstate(all="ignore"):  # a wrong answer may divide by zero: reported below
            out, lse = acc / l[..., None], m + np.log(l)
        want, want_lse = fold_reference(blocks)
        if not np.isfinite(out).all():
            if masked and np.isfinite(out[..., :2, :]).all():  # rows 2.. are the ones that start masked
                raise CheckFailed(f"{label}: rows that saw only masked scores (-inf) in the first blocks end as "
                                  f"nan: while the running max m is -inf, e^(m - m') is e^(-inf + inf); "
                                  f"treat such rows as holding nothing (l = 0, acc = 0)")
            raise CheckFailed(f"{label}: the output has inf or nan. e^x overflows once x passes about "
                              f"{OVERFLOW:.0f}: subtract the running max before exponentiating and rescale what "
                              f"you kept by e^(m - m') when the max grows")
        compare_arrays(f"{label}: acc / l", out, want)
        compare_arrays(f"{label}: m + log l (the log-sum-exp backward needs)", lse, want_lse)
    cases = [((1, 1, 8, 4), 8, False, 1.0), ((2, 3, 32, 8), 4, False, 1.0), ((2, 3, 32, 8), 8, True, 1.0),
             ((1, 2, 24, 4), 1, True, 1.0), ((1, 1, 30, 4), 6, True, 1.0), ((1, 2, 32, 4), 8, True, 20.0)]
    for shape, block, causal, scale in cases:
        q, k, v, _ = qkv(shape, block, scale)
        with refusing(what, *ONLINE), without_torch(what):
            got = attention(q.copy(), k.copy(), v.copy(), block, causal)
        label = f"{what}, online_attention, shape {shape}, block {block}, causal={causal}"
        want = full_attention(q, k, v, causal)
        if scale > 1 and not np.isfinite(np.asarray(got, np.float64)).all():
            top = np.abs(q @ k.swapaxes(-1, -2)).max() / np.sqrt(shape[-1])
            raise CheckFailed(f"{label}: scores reach {top:.0f} and your output has inf or nan: e^x overflows once x "
                              f"passes about {OVERFLOW:.0f}; keep the running max and subtract it (online_update)")
        compare_arrays(label, got, want)
    q, k, v, _ = qkv((1, 1, 1024, 8), 0)
    with refusing(what, *ONLINE), without_torch(what):
        _, peak = traced_peak(lambda: attention(q, k, v, 64, True))
    scores = 1024 * 1024 * 8
    expect(peak < scores / 2, f"{what}: with 1024 positions in blocks of 64, your function allocated {peak / 1e6:.1f} MB "
                              f"at its peak; the full score matrix is {scores / 1e6:.1f} MB. Keep only one block of "
                              f"scores (and the running max, sum and output) at a time")
    passed(what, f"online_update folds blocks exactly, with scores past e^x's overflow and fully masked rows; "
                 f"online_attention equals full attention for {len(cases)} shapes and block sizes, with peak memory "
                 f"{peak / 1e6:.2f} MB where the scores alone would be {scores / 1e6:.1f} MB")


# ----------------------------------------------------------------- Exercise 4.2
def check_zigzag(split, gather, visible):
    """Exercise 4.2: split(x, c) / gather(shards) in the zigzag layout; visible(q_pos, k_pos)
    -> None (the whole block is hidden by the causal mask) or a boolean mask."""
    what = "Exercise 4.2"
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


# ----------------------------------------------------------------- Exercise 4.3
def check_ring_forward(fn):
    """Exercise 4.3: fn(comm, q, k, v, causal, layout) -> this rank's rows of attention."""
    what = "Exercise 4.3"
    topo = Topology(flops=1e8)  # compute slow beside the transfers, so that overlap is plain in the timeline
    for c, causal, layout in CASES:
        label = f"{what}, c={c}, {'causal' if causal else 'no mask'}, {layout}"
        q, k, v, _ = qkv((2, 2, 8 * c, 8), c, scale=30.0)  # scores past e^x's overflow
        shards = [cp.split_sequence(a, c, layout) for a in (q, k, v)]
        world = World(c, topology=topo)
        with refusing(what, *FORWARD), without_torch(what):
            got = run_on_emulator(world, lambda comm: fn(comm, *(s[comm.rank].copy() for s in shards), causal=causal,
                                                         layout=layout), label)
        compare_arrays(label, cp.gather_sequence(got, layout), full_attention(q, k, v, causal))
        ring_calls(label, world, c)
        block = 2 * q.nbytes // c
        for r in range(c):
            sent = sum(x.nbytes for x in world.calls[r] if x.op == "send")
            expect(sent == (c - 1) * block, f"{label}: rank {r} sent {sent} bytes; c-1 = {c - 1} steps of one K and V "
                                            f"block ({block} bytes) each are needed: no more, no less")
        if c == 1:
            continue
        tl = world.timeline()
        if not causal:
            computes = tl.of(0, "compute", "compute")
            expect(computes, f"{label}: charge each block's compute with comm.compute(flops=...) (4 x batch x heads "
                             f"x n_q x n_k x d_head)")
            transfers = [e for e in tl.events if e.rank == 0 and e.kind == "comm"]  # a batch's kernel, or lone ops
            hidden = [t for t in transfers if any(t.start < e.end and e.start < t.end for e in computes)]
            expect(len(hidden) == len(transfers), f"{label}: {len(transfers) - len(hidden)} of rank 0's transfers "
                   f"ran while it computed nothing: post the next block's send and receive (batch_isend_irecv) "
                   f"before computing on the current one, and wait after")
        need = compute_per_rank(c, 8, causal, layout, 4, 8) / topo.flops
        done = np.array([tl.total("compute", r) for r in range(c)])
        for r in np.nonzero(np.abs(done - need) > 0.01 * need)[0]:
            if not causal:
                hint = "charge every block: 4 x batch x heads x n_q x n_k x d_head FLOPs"
            elif layout == "contiguous":
                hint = (f"rank r needs r+1 blocks: skip the blocks whose keys all come after the queries "
                        f"(visible() returns None)")
            else:
                hint = (f"with zigzag every rank needs {2 * c + 1} of its {4 * c} quarter-blocks (half of its queries "
                        f"against half of a block's keys): call visible() on each pair of halves and skip the "
                        f"hidden ones, charging only what you compute")
            raise CheckFailed(f"{label}: rank {r} computed {done[r] * 1e6:.1f} us, its mask needs {need[r] * 1e6:.1f} "
                              f"us; {hint}")
    c, n, d = 8, 16, 64  # K/V blocks far larger than a block of scores
    q, k, v, _ = qkv((1, 1, c * n, d), 99)
    shards = [cp.split_sequence(a, c) for a in (q, k, v)]
    memory_against_the_library(what, f"{what}, memory on {c} ranks", fn,
                                lambda comm, q, k, v, causal, layout: cp.ring_attention(comm, q, k, v, causal, layout)[0],
                                shards, c, 2 * q.nbytes // c, {"causal": False, "layout": "contiguous"}, FORWARD)
    passed(what, "equal to full attention on 1, 2, 3, 4 and 8 ranks, causal or not, contiguous or zigzag; neighbours "
                 "only, c-1 steps of one K/V block; transfers overlap compute; each rank computes only what its mask "
                 "leaves (quarter-blocks in zigzag); two K/V blocks held at a time")


def run_layouts(fn, c=4, flops=1e10):
    """Run ``fn`` (a ring forward as Exercise 4.3's) causally in both layouts on ``c`` ranks;
    returns ({layout: timeline}, whose ring ran). An unfinished exercise runs the library's."""
    rng = np.random.default_rng(2)
    seq = rng.standard_normal((3, 1, 4, 64 * c, 16))
    whose = "yours"
    timelines = {}
    for layout in cp.LAYOUTS:
        shards = [cp.split_sequence(x, c, layout) for x in seq]
        world = World(c, topology=Topology(flops=flops))
        try:
            world.run(lambda comm: fn(comm, *(x[comm.rank] for x in shards), causal=True, layout=layout))
        except RankError as exc:
            if not isinstance(exc.original, NotImplementedError):
                raise
            whose = "the library's (Exercise 4.3 is not done yet)"
            world = World(c, topology=Topology(flops=flops))
            world.run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards), causal=True,
                                                     layout=layout))
        timelines[layout] = world.timeline()
    return timelines, whose


# ----------------------------------------------------------------- Exercise 4.4
def check_ring_backward(fn):
    """Exercise 4.4: fn(comm, q, k, v, out, lse, dout, causal, layout) -> (dq, dk, dv) for this rank."""
    what = "Exercise 4.4"
    forwards = {}
    for c, causal, layout in CASES:
        label = f"{what}, c={c}, {'causal' if causal else 'no mask'}, {layout}"
        q, k, v, do = qkv((2, 2, 4 * c, 8), 10 + c)
        want = full_attention(q, k, v, causal, do)
        shards = [cp.split_sequence(a, c, layout) for a in (q, k, v, do)]
        forward = World(c).run(lambda comm: cp.ring_attention(comm, *(s[comm.rank] for s in shards[:3]),
                                                             causal=causal, layout=layout))  # the library's
        forwards[(c, causal, layout)] = forward

        def prog(comm):
            parts = [s[comm.rank].copy() for s in shards]
            out, cache = forward[comm.rank]
            return fn(comm, parts[0], parts[1], parts[2], out.copy(), cache["lse"].copy(), parts[3], causal=causal,
                      layout=layout)

        world = World(c)
        with refusing(what, *BACKWARD), without_torch(what):
            got = run_on_emulator(world, prog, label)
        for i, name in enumerate(("dq", "dk", "dv")):
            compare_arrays(f"{label}: {name}", cp.gather_sequence([g[i] for g in got], layout), want[i + 1])
        ring_calls(label, world, c)
        block = 2 * q.nbytes // c
        for r in range(c):
            sent = sum(x.nbytes for x in world.calls[r] if x.op == "send")
            expect(sent <= 2 * c * block, f"{label}: rank {r} sent {sent} bytes, {sent / block:.1f} K/V blocks; the "
                   f"ring backward sends its K/V block c-1 times and the dK/dV partial sums c times ({2 * c - 1} "
                   f"blocks): keep q and dout home")
    c, n, d = 8, 16, 64
    q, k, v, do = qkv((1, 1, c * n, d), 98)
    shards = [cp.split_sequence(a, c) for a in (q, k, v, do)]
    forward = World(c).run(lambda comm: cp.ring_attention(comm, *(s[comm.rank] for s in shards[:3])))
    outs = [[f[0] for f in forward]] + [[f[1]["lse"] for f in forward]]

    def library(comm, q, k, v, out, lse, dout, causal, layout):
        cache = {"q": q, "k": k, "v": v, "out": out, "lse": lse, "causal": causal, "layout": layout}
        return cp.ring_attention_backward(comm, cache, dout)

    memory_against_the_library(what, f"{what}, memory on {c} ranks", fn, library, shards[:3] + outs + shards[3:], c,
                                2 * q.nbytes // c, {"causal": False, "layout": "contiguous"}, BACKWARD)
    passed(what, "dQ, dK and dV equal full attention's on 1, 2, 3, 4 and 8 ranks, causal or not, in both layouts, "
                 "dK and dV travelling around the ring and home; neighbours only; two K/V blocks held at a time")


# ----------------------------------------------------------------- napkins
memory_128k = context_parallel.cp_activation_bytes  # the model answer of Napkin 4.1
overlap_length = context_parallel.ring_overlap_positions  # the model answer of Napkin 4.2


def napkin_memory(fn):
    """fn(s, b, h, layers, c) -> (bytes per layer per GPU, bytes of all layers)."""
    cases = [dict(s=131072, b=1, h=8192, layers=80, c=16), dict(s=65536, b=1, h=4096, layers=32, c=8),
             dict(s=262144, b=2, h=16384, layers=126, c=32), dict(s=32768, b=4, h=5120, layers=40, c=4)]
    layer, total = variants("Napkin 4.1", fn, cases, memory_128k, " B", ("bytes per layer", "bytes, all layers"),
                            (activations.activation_bytes_per_layer, memory_128k))
    passed("Napkin 4.1", f"{layer / 1e9:.2f} GB per layer, {total / 1e9:.0f} GB for all layers per GPU")


def napkin_overlap(fn):
    """fn(flops, beta, dtype_bytes, h, kv_heads, head_dim) -> positions per rank at which
    compute hides the transfer."""
    cases = [dict(flops=989e12, beta=370e9, dtype_bytes=2, h=16384, kv_heads=8, head_dim=128),
             dict(flops=989e12, beta=48e9, dtype_bytes=2, h=16384, kv_heads=8, head_dim=128),
             dict(flops=312e12, beta=250e9, dtype_bytes=2, h=4096, kv_heads=32, head_dim=128),  # no GQA
             dict(flops=120e12, beta=48e9, dtype_bytes=4, h=8192, kv_heads=8, head_dim=128),
             dict(flops=989e12, beta=370e9, dtype_bytes=1, h=5120, kv_heads=4, head_dim=64)]
    (n,) = variants("Napkin 4.2", lambda **kw: (fn(**kw),), cases, lambda **kw: (overlap_length(**kw),), "",
                    ("positions",), (overlap_length,))
    passed("Napkin 4.2", f"with Llama 3 405B's K/V (8 heads of 128, 16 times narrower than h) the transfer hides once "
                         f"each rank holds {n:,.0f} positions on NVLink, {overlap_length(beta=48e9):,.0f} across nodes")
