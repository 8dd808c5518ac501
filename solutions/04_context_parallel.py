# %% [markdown]
# # Lesson 04 — Context parallelism
#
# Tensor parallelism splits a layer's width, pipeline parallelism its depth, ZeRO its
# state. None of them splits the sequence, and at long context the sequence is what
# overflows: activations grow with its length, attention's scores with its square.
# Context parallelism gives each GPU a slice of the sequence. Everything a transformer
# does is per position except attention, where every query needs every earlier key; ring
# attention passes the keys and values around the GPUs while each computes with the
# block it holds, one block at a time, with the online softmax of FlashAttention.
#
# You will write the online softmax (Exercise 4.1), the zigzag layout that balances causal
# work and the masks that skip hidden blocks (4.2), then the per-rank ring forward built on
# both, its transfers hidden behind compute (4.3), and the ring backward (4.4); and answer
# two napkins: when the transfer hides, and memory at 128k tokens.

# %%
import numpy as np
import matplotlib.pyplot as plt
from ml_dtypes import bfloat16

from emulator import P2POp, Topology, World, nn, viz
from emulator.accounting import activation_bytes_per_layer
from emulator.cost import collective_time
from emulator.records.memory import MemoryLedger
from emulator.mesh import Mesh
from emulator.parallel import context_parallel as cp
from emulator.parallel.tensor_parallel.block import TensorParallelBlock, cached_terms
from emulator.grading import lesson04 as grade
from emulator.notebook import setup

setup()

# %% [markdown]
# ## 1. When the sequence is what overflows
#
# One layer keeps $sbh\,(34 + 5as/h)$ bytes for backward when its attention writes the
# scores to HBM (lesson 02; Megatron-LM's attention until fused kernels, the emulator's
# `megatron-2021` stack): the first term is linear in the sequence length $s$, the second,
# the scores, quadratic. A fused attention kernel (FlashAttention, the `megatron-core`
# default) keeps only the softmax's statistics, $4as$ bytes per sequence. Here the block's
# ledger under both as $s$ doubles, beside the formulas (a small layer: $h = 64$, 8 heads,
# bf16). *Predict first*: from $s = 64$ to $s = 512$, eight times the tokens, how many times
# the bytes, with the scores kept and without?

# %%
h, a, b = 64, 8, 1
layer = nn.TransformerBlock(h, a, 4 * h).init(np.random.default_rng(0))


def kept(comm, s):
    block = TensorParallelBlock(comm, h, a, 4 * h, dropout=0.1, act_dtype=bfloat16)
    x = np.zeros((b, s, h), np.float32)
    return sum(cached_terms(block.forward(block.shard(layer), x)[1]).values())


rows = {}
print(f"{'':5s} {'scores in HBM (megatron-2021)':>30s} {'fused attention (megatron-core)':>32s}")
print(f"{'s':>5s} {'ledger':>14s} {'formula':>15s} {'ledger':>16s} {'formula':>15s}")
for s in (64, 128, 256, 512):
    rows[s] = World(1, stack="megatron-2021").run(kept, s)[0], World(1, stack="megatron-core").run(kept, s)[0]
    print(f"{s:>5d} {rows[s][0]:>14,d} {activation_bytes_per_layer(s, b, h, a):>15,.0f} {rows[s][1]:>16,d} "
          f"{activation_bytes_per_layer(s, b, h, a, attention='flash'):>15,.0f}")
print(f"s = 64 to 512: x{rows[512][0] / rows[64][0]:.0f} with the scores kept, x{rows[512][1] / rows[64][1]:.0f} "
      "with the fused kernel")

# %% [markdown]
# With the scores kept, each doubling of $s$ multiplies the bytes by nearly four once the
# scores dominate; with the fused kernel the bytes grow as the tokens do. Linear is not
# small. For a real layer ($h = 8192$, 64 heads) at 128k tokens, one sequence:

# %%
fig, ax = plt.subplots(figsize=(7.5, 2.8))
lengths = 2 ** np.arange(10, 18)
ax.loglog(lengths, [activation_bytes_per_layer(int(s), 1, 8192, 64) / 1e9 for s in lengths], "o-",
          label="sbh(34 + 5as/h): scores kept")
ax.loglog(lengths, [activation_bytes_per_layer(int(s), 1, 8192, 64, attention="flash") / 1e9 for s in lengths],
          "s-", label="34 sbh + 4as: scores never stored (fused)")
ax.axhline(80, color="black", ls="--", lw=1)
ax.text(lengths[0], 85, "80 GB GPU", fontsize=8)
ax.set_xlabel("sequence length s")
ax.set_ylabel("GB per layer")
ax.legend(frameon=False, fontsize=8)
plt.show()
print(f"at s = 131072: {activation_bytes_per_layer(131072, 1, 8192, 64) / 1e9:,.0f} GB per layer with the scores, "
      f"{activation_bytes_per_layer(131072, 1, 8192, 64, attention='flash') / 1e9:.1f} GB without them, "
      "times 80 layers")

# %% [markdown]
# Splitting the heads does shrink the quadratic term on each GPU: tensor parallelism gives
# a GPU $a/t$ heads, so it keeps $5as^2b/t$ (lesson 02's $sbh\,(10 + 24/t + 5as/(ht))$),
# but the term still grows as $s^2$, and $t$ stops at the node. Two moves remove the
# problem. Never store the $s \times s$ scores (FlashAttention computes them block by block
# and recomputes them in backward): that removes the quadratic term. And split the sequence
# over $c$ GPUs: that divides the linear one.
#
# ## 2. The online softmax
#
# Softmax needs the maximum and the sum over a whole row of scores. Read the row in
# blocks and keep three running quantities per query: the maximum $m$ so far, the sum
# $\ell$ of $e^{x - m}$ so far, and the output accumulated so far, $\sum e^{x-m} v$. When a
# block raises the maximum from $m$ to $m'$, everything kept so far is rescaled by
# $e^{m - m'}$:
#
# $$m' = \max(m, \max_j x_j),\quad \ell' = \ell\,e^{m-m'} + \sum_j e^{x_j - m'},\quad
#   o' = o\,e^{m-m'} + \sum_j e^{x_j-m'} v_j,$$
#
# and at the end the output is $o / \ell$. Masked scores are $-\infty$ and add nothing.
# Subtracting the running max is not cosmetic: $e^x$ overflows float64 once $x$ passes
# about 709 (float32 and bf16 at 88), and large scores do occur (a sharply focused head).
#
# **Exercise 4.1** — the online softmax. `online_update(m, l, acc, scores, v)` folds one
# block in: `m`, `l` are (..., rows), `acc` (..., rows, d), `scores` (..., rows, keys)
# already scaled and masked (`-inf` where hidden), `v` (..., keys, d); return the new
# `(m, l, acc)`. A row that has seen only masked scores so far has $m = -\infty$ and must
# keep $\ell = 0$, $o = 0$ (mind $e^{-\infty + \infty}$). Then `online_attention(q, k, v,
# block, causal)`: attention on one device, `block` keys at a time, built on your update:
# `q`, `k`, `v` are (b, heads, s, d); scale the scores by $1/\sqrt{d}$; with `causal`,
# query $i$ sees keys $j \le i$. Never build the $s \times s$ matrix: the check measures
# your peak memory, and uses scores large enough to overflow an unstabilised sum. Your
# update is what your ring will fold its blocks with (Exercise 4.3).

# %%
def online_update(m, l, acc, scores, v):
    ### BEGIN SOLUTION: Exercise 4.1: the online softmax, one block folded in
    m_new = np.maximum(m, scores.max(-1))
    safe = np.where(np.isfinite(m_new), m_new, 0.0)  # rows that have seen no key yet
    p = np.exp(scores - safe[..., None])
    scale = np.exp(m - safe)
    return m_new, l * scale + p.sum(-1), acc * scale[..., None] + p @ v
    ### END SOLUTION


def online_attention(q, k, v, block, causal=False):
    ### BEGIN SOLUTION: Exercise 4.1: attention on one device, block by block
    s, d = q.shape[-2], q.shape[-1]
    m, l, acc = np.full(q.shape[:-1], -np.inf), np.zeros(q.shape[:-1]), np.zeros(q.shape)
    for j0 in range(0, k.shape[-2], block):
        x = q @ k[..., j0:j0 + block, :].swapaxes(-1, -2) / np.sqrt(d)
        if causal:
            x = np.where(np.arange(j0, j0 + x.shape[-1])[None, :] <= np.arange(s)[:, None], x, -np.inf)
        m, l, acc = online_update(m, l, acc, x, v[..., j0:j0 + block, :])
    return acc / l[..., None]
    ### END SOLUTION


# %% tags=["check"]
grade.check_online_attention(online_update, online_attention)

# %% [markdown]
# The ledger agrees: the library's `cp.OnlineSoftmax` folding in blocks of 64 keys for
# 1024 positions holds one block of scores at a time.

# %%
rng = np.random.default_rng(1)
q, k, v = (rng.standard_normal((1, 1, 1024, 16)) for _ in range(3))
ledger = MemoryLedger(0)
state = cp.OnlineSoftmax(q.shape[:-1], 16)
ledger.hold("running max, sum, output", (state.m, state.l, state.acc), "activations")
for j0 in range(0, 1024, 64):
    scores = ledger.hold("scores of one block", q @ k[..., j0:j0 + 64, :].swapaxes(-1, -2) / 4, "buffers")
    state.update(scores, v[..., j0:j0 + 64, :])
    ledger.release("scores of one block")
print(f"peak held: {ledger.peak / 1e3:.0f} kB; the full score matrix would be {1024 * 1024 * 8 / 1e3:,.0f} kB")

# %% [markdown]
# ## 3. Ring attention
#
# Split the sequence over $c$ ranks; rank $i$ holds its positions' queries, keys and
# values. Rank $i$'s queries need every rank's keys. Arrange the ranks in a ring: at step
# $t$ rank $i$ holds the K/V block of rank $(i - t) \bmod c$, folds it into its online
# softmax, and passes it on to rank $i+1$ while receiving the next one from rank $i-1$.
# After $c-1$ transfers every rank has seen every block, and no rank ever held more than
# two blocks of K/V.
#
# The transfer of the next block and the compute on the current one run at once: post
# the send and the receive, compute, then wait. The library's `cp.ring_attention` on 4
# ranks, with compute at 10 TFLOP/s and the K/V block of a 512-position shard crossing
# NVLink: the transfers (lanes under each rank) run under the compute. Its ledger holds
# two K/V blocks per rank, the one in use and the one arriving.

# %%
c, heads, d = 4, 4, 64
seq = rng.standard_normal((3, 1, heads, 4 * 512, d)).astype(np.float32)
shards = [cp.split_sequence(x, c) for x in seq]
world = World(c, topology=Topology(flops=1e13))
world.run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards)))
viz.gantt(world.timeline(), title="ring attention forward, 4 ranks: transfers under compute")
plt.show()
print(f"K/V buffers held by rank 0 at its peak: {world.memory[0].peak_by_kind['buffers']:,d} bytes "
      f"= 2 x one rank's K and V ({2 * seq[1].nbytes // c:,d} bytes)")

# %% [markdown]
# **Napkin 4.2** — when does the transfer hide? With $n$ positions per rank, $h$ the model
# width and batch $b$, a step computes $4bn^2h$ FLOPs (scores and scores times V, every
# query head) and sends the K and V of its $n$ positions. With grouped-query attention
# several query heads share one K/V head, so K and V are `kv_heads * head_dim` wide, not
# $h$: Llama 3 405B has $h = 16384$ (128 query heads) but 8 K/V heads of 128, K and V 16
# times narrower (Llama 3 paper, table 3). Each value takes `dtype_bytes`. Ignoring latency,
# from how many positions per rank does the compute (at `flops` FLOP/s) take at least as
# long as the transfer (at `beta` bytes/s)?

# %%
def napkin_ring_overlap(flops=989e12, beta=370e9, dtype_bytes=2, h=16384, kv_heads=8, head_dim=128):
    ### BEGIN SOLUTION: Napkin 4.2: when the transfer hides
    # 4 b n^2 h / flops >= 2 b n kv dtype_bytes / beta  <=>  n >= flops dtype_bytes kv / (2 beta h)
    return flops * dtype_bytes * kv_heads * head_dim / (2 * beta * h)
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_overlap(napkin_ring_overlap)

# %% [markdown]
# About 170 positions per GPU inside a node and 1.3k across nodes, for Llama 3
# 405B's narrow K/V; a model without grouped queries (K and V as wide as $h$) needs 16
# times more, 2.7k and 21k: ring attention wants long shards, which is exactly when it is
# needed.
#
# ## 4. Causal masks and load balance
#
# With a causal mask, query $i$ sees keys $j \le i$ only. A block whose keys all come
# after all its queries is skipped. With contiguous shards, rank 0 (the first positions)
# skips every block but its own, while rank $c-1$ needs them all. *Predict first*: with
# $c = 4$ contiguous shards, how much compute does each rank do, relative to rank 0, and
# when is the step done? The library's ring:

# %%
c = 4
seq = rng.standard_normal((3, 1, 4, 64 * c, 16))
shards = [cp.split_sequence(x, c) for x in seq]
world = World(c, topology=Topology(flops=1e10))
world.run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards), causal=True))
tl = world.timeline()
work = [tl.total("compute", r) * 1e6 for r in range(c)]
print(f"contiguous: compute per rank {', '.join(f'{w:.0f}' for w in work)} us; step done at {tl.makespan * 1e6:.0f} us")

# %% [markdown]
# Rank $r$ computes $r + 1$ blocks, so the last rank does $c$ times the work of the first,
# and the step ends when it does; the others wait.
#
# **Zigzag**: cut the sequence into $2c$ chunks and give rank $i$ chunks $i$ and
# $2c-1-i$, one early and one late (the layout of Megatron-LM's context parallelism and
# of Llama 3's). A block of scores, this rank's queries against one rank's keys, is then
# four quarter-blocks: half of the queries against half of the keys. Under the causal mask
# each rank needs the same $2c+1$ of its $4c$ quarter-blocks, if it skips the hidden ones
# quarter by quarter (a whole block is never hidden: the late half of the queries sees
# every early key). Step through it: which block each rank holds, which quarter-blocks it
# computes or skips, its work so far.

# %% tags=["nbval-ignore-output"]
from emulator.widgets import RingAttentionStepper

RingAttentionStepper(c=4, causal=True, layout="zigzag", step=1)

# %% [markdown]
# **Exercise 4.2** — the zigzag layout and its masks. `zigzag_split(x, c)` cuts `x` along
# its second-to-last dim into $2c$ chunks and returns $c$ shards, shard $i$ = chunk $i$
# followed by chunk $2c-1-i$; `zigzag_gather(shards)` undoes it. `visible(q_pos, k_pos)`
# takes the global positions of a block's queries and keys and returns `None` when no
# query sees any key (the block is skipped), else the boolean mask (query $i$ sees key
# $j$ when $k_j \le q_i$).

# %%
def zigzag_split(x, c):
    ### BEGIN SOLUTION: Exercise 4.2: zigzag layout
    chunks = np.split(x, 2 * c, axis=-2)
    return [np.concatenate([chunks[i], chunks[2 * c - 1 - i]], axis=-2) for i in range(c)]
    ### END SOLUTION


def zigzag_gather(shards):
    ### BEGIN SOLUTION: Exercise 4.2: zigzag layout, gathered
    c = len(shards)
    halves = [np.split(s, 2, axis=-2) for s in shards]
    return np.concatenate([halves[i][0] for i in range(c)] + [halves[c - 1 - i][1] for i in range(c)], axis=-2)
    ### END SOLUTION


def visible(q_pos, k_pos):
    ### BEGIN SOLUTION: Exercise 4.2: causal mask of a block, or None to skip it
    if k_pos.min() > q_pos.max():
        return None
    return k_pos[None, :] <= q_pos[:, None]
    ### END SOLUTION


# %% tags=["check"]
grade.check_zigzag(zigzag_split, zigzag_gather, visible)

# %% [markdown]
# ## 5. Your ring
#
# **Exercise 4.3** — the per-rank ring forward, built on your Exercises 4.1 and 4.2. `q`,
# `k`, `v` are this rank's (b, heads, n, d) shards of a sequence split in `layout`;
# `cp.chunks_of(rank, c, n, layout)` lists the pieces of the sequence a rank holds, as
# (first position, length): one piece when contiguous, two halves in zigzag. At step $t$
# you hold the K/V of rank $(r - t) \bmod c$: for each of your pieces against each of its
# pieces, ask `visible` (when `causal`) whether to skip, else fold the masked, scaled
# scores into those rows with your `online_update`, and charge what you computed with
# `comm.compute(flops=4 * b * heads * n_q * n_k * d)`. Post the next block's transfer
# before computing: `comm.batch_isend_irecv([P2POp(comm.isend, x, right), P2POp(comm.irecv,
# buffer, left)])`, and wait after (the list holds one handle for the batch, as on NCCL;
# the block is then in `buffer`). Hold no more than the block in use and the one
# arriving. The check compares with full attention on 1 to 8 ranks, causal or not, in
# both layouts, reads the trace, the timeline (overlap, and each rank's compute against
# what its mask leaves) and measures what your ranks hold.

# %%
def ring_forward(comm, q, k, v, causal=False, layout="contiguous"):
    ### BEGIN SOLUTION: Exercise 4.3: the ring, forward
    c, n, d = comm.size, q.shape[-2], q.shape[-1]
    right, left = (comm.rank + 1) % c, (comm.rank - 1) % c
    m, l, acc = np.full(q.shape[:-1], -np.inf), np.zeros(q.shape[:-1]), np.zeros(q.shape)
    kv = np.stack([k, v])
    for t in range(c):
        if t < c - 1:  # the next block travels while this one is used
            arriving = np.empty_like(kv)
            batch = comm.batch_isend_irecv([P2POp(comm.isend, kv, right), P2POp(comm.irecv, arriving, left)])
        q0 = 0
        for qs, qn in cp.chunks_of(comm.rank, c, n, layout):  # my pieces
            rows, k0 = slice(q0, q0 + qn), 0
            for ks, kn in cp.chunks_of((comm.rank - t) % c, c, n, layout):  # the block's pieces
                cols = slice(k0, k0 + kn)
                mask = visible(np.arange(qs, qs + qn), np.arange(ks, ks + kn)) if causal else True
                if mask is not None:  # else every key of this quarter comes after every query: skip it
                    x = np.where(mask, q[..., rows, :] @ kv[0][..., cols, :].swapaxes(-1, -2) / np.sqrt(d), -np.inf)
                    m[..., rows], l[..., rows], acc[..., rows, :] = online_update(
                        m[..., rows], l[..., rows], acc[..., rows, :], x, kv[1][..., cols, :])
                    comm.compute(flops=4 * np.prod(q.shape[:-2]) * qn * kn * d, name=f"block {t}")
                k0 += kn
            q0 += qn
        if t < c - 1:
            for work in batch:  # one handle for the batch
                work.wait()
            kv = arriving
    return acc / l[..., None]
    ### END SOLUTION


# %% tags=["check"]
grade.check_ring_forward(ring_forward)

# %% [markdown]
# *Predict*: your ring, causal, on 4 ranks, contiguous and zigzag: how much does each rank
# compute, and when is the step done? Measured on your `ring_forward` (the library's stands
# in until Exercise 4.3 runs):

# %%
timelines, whose = grade.run_layouts(ring_forward)
print(f"ring: {whose}")
fig, axes = plt.subplots(1, 2, figsize=(11, 2.6))
for (layout, tl), ax in zip(timelines.items(), axes):
    work = [tl.total("compute", r) * 1e6 for r in range(4)]
    print(f"{layout:10s}: compute per rank {', '.join(f'{w:.0f}' for w in work)} us; step done at "
          f"{tl.makespan * 1e6:.0f} us")
    viz.gantt(tl, ax=ax, title=f"causal ring attention, {layout}", streams=(), label_events=False)
for ax in axes:  # one time axis for both
    ax.set_xlim(0, max(a.get_xlim()[1] for a in axes))
plt.show()

# %% [markdown]
# Zigzag: equal compute on every rank, and the step done in $(2c+1)/4c$ of the contiguous
# layout's time (here 2.25 blocks instead of 4). Skipping whole blocks only would not do
# it: in zigzag no block is entirely hidden, so every rank would compute $c$ whole blocks,
# as slow as the contiguous layout's last rank.

# %% [markdown]
# ## 6. Backward
#
# With the output $O$, the log-sum-exp of each query row ($\mathrm{lse} = m + \log\ell$,
# kept from forward) and the output's gradient $dO$, any block's probabilities come back
# as $P = e^{S - \mathrm{lse}}$, so the backward can run block by block too. With
# $D = \mathrm{rowsum}(dO \circ O)$:
#
# $$dV \mathrel{+}= P^\top dO,\quad dS = P \circ (dO\,V^\top - D),\quad
#   dQ \mathrel{+}= dS\,K/\sqrt{d},\quad dK \mathrel{+}= dS^\top Q/\sqrt{d}.$$
#
# Around the ring, $dQ$ stays home, while $dK$ and $dV$ are partial sums that belong to
# the block's owner: they travel with their block, each rank adding its part, and one
# last transfer brings them home.
#
# **Exercise 4.4** — the ring backward: `q`, `k`, `v`, `out`, `lse` (the forward's, shape
# (b, heads, n)) and `dout` are this rank's, in `layout`, with or without the causal
# mask; return `(dq, dk, dv)` for this rank's positions. Skip the hidden quarter-blocks
# as your forward does; send only K/V and dK/dV around the ring (q and dout stay home) and
# hold no other rank's block once you are done with it.

# %%
def ring_backward(comm, q, k, v, out, lse, dout, causal=False, layout="contiguous"):
    ### BEGIN SOLUTION: Exercise 4.4: the ring, backward
    c, n, d = comm.size, q.shape[-2], q.shape[-1]
    right, left = (comm.rank + 1) % c, (comm.rank - 1) % c
    delta = (dout * out).sum(-1, keepdims=True)
    dq = np.zeros_like(q)
    kv, dkv = np.stack([k, v]), np.zeros((2,) + k.shape)
    for t in range(c):
        q0 = 0
        for qs, qn in cp.chunks_of(comm.rank, c, n, layout):
            rows, k0 = slice(q0, q0 + qn), 0
            for ks, kn in cp.chunks_of((comm.rank - t) % c, c, n, layout):
                cols = slice(k0, k0 + kn)
                mask = visible(np.arange(qs, qs + qn), np.arange(ks, ks + kn)) if causal else True
                if mask is not None:
                    kb, vb, do = kv[0][..., cols, :], kv[1][..., cols, :], dout[..., rows, :]
                    s_ = q[..., rows, :] @ kb.swapaxes(-1, -2) / np.sqrt(d)
                    p = np.where(mask, np.exp(s_ - lse[..., rows, None]), 0.0)
                    ds = p * (do @ vb.swapaxes(-1, -2) - delta[..., rows, :])
                    dq[..., rows, :] += ds @ kb / np.sqrt(d)
                    dkv[0][..., cols, :] += ds.swapaxes(-1, -2) @ q[..., rows, :] / np.sqrt(d)
                    dkv[1][..., cols, :] += p.swapaxes(-1, -2) @ do
                k0 += kn
            q0 += qn
        if c > 1:  # the block and its gradients move on together; after the last step, home
            new_dkv, new_kv = np.empty_like(dkv), np.empty_like(kv)
            moved = [P2POp(comm.isend, dkv, right), P2POp(comm.irecv, new_dkv, left)]
            if t < c - 1:
                moved += [P2POp(comm.isend, kv, right), P2POp(comm.irecv, new_kv, left)]
            for work in comm.batch_isend_irecv(moved):
                work.wait()
            dkv, kv = new_dkv, new_kv
    return dq, dkv[0], dkv[1]
    ### END SOLUTION


# %% tags=["check"]
grade.check_ring_backward(ring_backward)

# %% [markdown]
# ## 7. Other ways to split the sequence
#
# **All-gather K/V**: every rank gathers the whole sequence's keys and values, then
# computes its queries against them. Simple, the same bytes as the ring, but sent before
# any compute (nothing hides them) and every rank holds all of K/V. Llama 3 chose it for
# its long-context stage (section 9).
#
# **Ulysses** (DeepSpeed): an all-to-all turns (my positions, every head) into (every
# position, my heads); each rank runs plain attention on $h/c$ heads; an all-to-all turns
# the result back. It cannot use more ranks than there are heads. *Predict first*: which
# of the three sends the fewest bytes per rank, and which holds the most extra memory?
# Side by side on 8 ranks, 8 heads, 1024 positions:

# %%
c, heads, s, d = 8, 8, 1024, 16
seq = rng.standard_normal((3, 1, heads, s, d)).astype(np.float32)
shards = [cp.split_sequence(x, c) for x in seq]
ways = {"ring": lambda comm, q, k, v: cp.ring_attention(comm, q, k, v)[0],
        "all-gather K/V": cp.all_gather_attention, "Ulysses": cp.ulysses_attention}
print(f"{'':15s} {'bytes sent per rank':>20s} {'extra buffers held':>19s} {'calls':>30s}")
for name, fn in ways.items():
    world = World(c)
    world.run(lambda comm: fn(comm, *(x[comm.rank] for x in shards)))
    calls = sorted({f"{x.op} x{sum(y.op == x.op for y in world.calls[0])}" for x in world.calls[0]})
    print(f"{name:15s} {world.stats().bytes_sent[0]:>20,d} {world.memory[0].peak_by_kind['buffers']:>19,d} "
          f"{', '.join(calls):>30s}")
print(f"one rank's K/V shard: {2 * seq[1].nbytes // c:,d} bytes")

# %% [markdown]
# The ring and the all-gather move the same $(c-1)$ K/V shards per rank; the ring hides
# them behind compute and holds two (the one in use, the one arriving), the all-gather
# all $c$. Ulysses moves less per rank (each
# all-to-all keeps $1/c$ of its data home and its pieces shrink as $c$ grows) but needs
# $c \le$ heads, and with grouped-query attention, fewer K/V heads still.
#
# ## 8. Numerics
#
# The online softmax rescales its running sums at every block. In fp32 that costs
# nothing measurable; kept in bf16, each rescale rounds again. *Predict first*: as the
# ring grows from 1 to 16 ranks, does the bf16 error stay put, grow slowly or blow up?
# Error against fp64 full attention (512 positions):

# %%
seq = rng.standard_normal((3, 1, 4, 512, 32)).astype(np.float32)
full, _ = nn.AttentionCore(False).forward({}, tuple(x.astype(np.float64) for x in seq))
sizes = [1, 2, 4, 8, 16]
fig, ax = plt.subplots(figsize=(7.5, 2.8))
for acc, label in ((np.float32, "fp32 running sums"), (bfloat16, "bf16 running sums")):
    errs = []
    for c in sizes:
        shards = [cp.split_sequence(x, c) for x in seq]
        out = World(c).run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards), accumulate=acc)[0])
        errs.append(np.sqrt(((cp.gather_sequence(out) - full) ** 2).mean()))
    ax.semilogy(sizes, errs, "o-", label=label)
    if acc is np.float32:   # round-off whose digits depend on the CPU's BLAS kernels
        assert max(errs) < 1e-7
        print(f"{label}: RMS error below 1e-7 at every size")
    else:
        print(f"{label}: RMS error {', '.join(f'{e:.1e}' for e in errs)}")
ax.set_xlabel("ranks in the ring (blocks folded in per query)")
ax.set_ylabel("RMS error vs fp64")
ax.set_xticks(sizes)
ax.legend(frameon=False)
plt.show()

# %% [markdown]
# Keep the running max, sum and output in fp32 (FlashAttention does) even when everything
# else is bf16.
#
# ## 9. Where context parallelism sits
#
# A `cp` axis of the mesh: ranks that share the same model shard and the same sequence,
# each with a slice of it. A ring sends $(c-1)$ K/V shards per layer forward and about
# twice that backward, point to point, hidden behind attention's compute when shards are
# long. It pays off when sequences are long, which is why it appears in the long-context
# stage of training: Llama 3 405B trained with CP 1 at 8k tokens and raised it to 16 (with
# DP down to 8) to extend the context to 128k. Its two meshes (TP 8, PP 16 in both):

# %%
for stage, shape, seq_len in (("pretraining, 8k tokens", {"dp": 128, "pp": 16, "cp": 1, "tp": 8}, 8192),
                              ("long context, 128k tokens", {"dp": 8, "pp": 16, "cp": 16, "tp": 8}, 131072)):
    mesh = Mesh(shape)
    group = mesh.group_ranks(("cp",), 0)
    print(f"{stage:26s}: {mesh.size:,d} GPUs, {seq_len // shape['cp']:,d} positions of each sequence per GPU, "
          f"rank 0's cp group spans {len({mesh.node_of(r) for r in group})} node(s)")

# %% [markdown]
# The same GPUs and the same slice of a sequence per GPU: the sixteen times longer
# sequence is paid for with sixteen times fewer data-parallel replicas, and the cp group
# leaves the node (the tp axis fills it), so its K/V cross the NICs. Llama 3 did not pass
# them around a ring: it all-gathers K and V over the cp group, then each rank computes
# its two zigzag chunks of queries (Llama 3 paper, section 3.3.2). It gives two reasons:
# an all-gather makes any attention mask easy, such as the document masks of packed
# sequences, and grouped-query attention makes K and V small beside Q (8 K/V heads of 128
# against $h = 16384$). The gather is exposed, not hidden; what it costs beside one
# layer's attention, on the emulator's H100 nodes (each GPU, with TP 8, holds 16 query
# heads and one K/V head):

# %%
group = Mesh({"dp": 8, "pp": 16, "cp": 16, "tp": 8}).group_ranks(("cp",), 0)
n_local, s_full, head_dim = 8192, 131072, 128
kv_bytes = 2 * n_local * 1 * head_dim * 2  # K and V of my positions, one K/V head, bf16
gather = collective_time("all_gather", 16 * kv_bytes, group, Topology())
attention_flops = 4 * n_local * s_full * 16 * head_dim / 2  # 16 query heads, half the pairs under the causal mask
print(f"all-gather of K/V over the cp group: {16 * kv_bytes / 2**20:.0f} MiB gathered, {gather * 1e3:.2f} ms; "
      f"attention forward on my queries: {attention_flops / 1e12:.1f} TFLOP, {attention_flops / 989e12 * 1e3:.2f} ms "
      f"at the H100's peak")
mha = collective_time("all_gather", 16 * 16 * kv_bytes, group, Topology())
print(f"the same without grouped queries (16 K/V heads per GPU): {mha * 1e3:.1f} ms")

# %% [markdown]
# About a third of the attention's time at peak (less at the rates attention kernels
# reach), for an implementation that handles any mask. Without grouped queries the gather
# would take several times the compute it waits for, and a ring that hides it would win.
#
# **Napkin 4.1** — a model of width `h` with `layers` layers trains on one sequence
# (`b`) of `s` tokens with context parallelism over `c` GPUs. Attention never stores its
# scores (FlashAttention), so a layer keeps $34\,sbh$ bytes for the whole sequence
# (bf16, no tensor parallelism). How many bytes per GPU per layer, and for all layers?

# %%
def napkin_memory_per_gpu(s=131072, b=1, h=8192, layers=80, c=16):
    ### BEGIN SOLUTION: Napkin 4.1: activation memory with context parallelism
    per_layer = 34 * (s / c) * b * h
    return per_layer, layers * per_layer
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_memory(napkin_memory_per_gpu)

# %% [markdown]
# ## 10. On real GPUs
#
# `gpu_labs/04_context_parallel.py` runs ring attention forward and backward over
# `torch.distributed` point to point (`batch_isend_irecv`), contiguous and zigzag, causal
# and not, against `scaled_dot_product_attention` on the whole sequence (outputs and
# gradients), records its calls for comparison with the emulator's, and on GPUs times
# each step's compute and transfer beside the emulator's prediction:
#
# ```
# torchrun --standalone --nproc-per-node 4 -m gpu_labs.04_context_parallel
# ```
#
# **Next:** lesson 05 splits a layer's experts: mixture of experts and expert parallelism.
