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
# You will write that online softmax on one device (Exercise 4.1), the per-rank ring
# forward with its transfers hidden behind compute (4.2), the zigzag layout that balances
# causal work (4.3), and the ring backward (4.4); and answer two napkins: memory at 128k
# tokens, and when the transfer hides.

# %%
import numpy as np
import matplotlib.pyplot as plt
from ml_dtypes import bfloat16

from emulator import P2POp, Topology, World, nn, viz
from emulator.accounting import activation_bytes_per_layer
from emulator.records.memory import MemoryLedger
from emulator.mesh import Mesh
from emulator.parallel import context_parallel as cp
from emulator.parallel.tp_block import TensorParallelBlock, cached_terms
from emulator.grading import lesson04 as grade
from emulator.notebook import setup

setup()

# %% [markdown]
# ## 1. When the sequence is what overflows
#
# One layer keeps $sbh\,(34 + 5as/h)$ bytes for backward (lesson 02): the first term is
# linear in the sequence length $s$, the second, the attention scores, quadratic. Lesson
# 02's block keeps exactly these tensors; here its ledger as $s$ doubles, beside the
# formula (a small layer: $h = 64$, 8 heads, bf16). *Predict first*: from $s = 64$ to
# $s = 512$, eight times the tokens, how many times the bytes?

# %%
h, a, b = 64, 8, 1
layer = nn.TransformerBlock(h, a, 4 * h).init(np.random.default_rng(0))


def kept(comm, s):
    block = TensorParallelBlock(comm, h, a, 4 * h, dropout=0.1, act_dtype=bfloat16)
    x = np.zeros((b, s, h), np.float32)
    return sum(cached_terms(block.forward(block.shard(layer), x)[1]).values())


print(f"{'s':>5s} {'ledger':>10s} {'formula':>10s} {'of which scores':>16s}")
for s in (64, 128, 256, 512):
    measured = World(1).run(kept, s)[0]
    print(f"{s:>5d} {measured:>10,d} {activation_bytes_per_layer(s, b, h, a):>10,.0f} {5 * a * s * s * b:>16,d}")

# %% [markdown]
# Each doubling of $s$ multiplies the bytes by nearly four once the scores dominate
# (38x for eight times the tokens here). For a
# real layer ($h = 8192$, 64 heads) at 128k tokens, one sequence:

# %%
fig, ax = plt.subplots(figsize=(7.5, 2.8))
lengths = 2 ** np.arange(10, 18)
ax.loglog(lengths, [activation_bytes_per_layer(int(s), 1, 8192, 64) / 1e9 for s in lengths], "o-",
          label="sbh(34 + 5as/h): scores kept")
ax.loglog(lengths, [34 * s * 8192 / 1e9 for s in lengths], "s-", label="34 sbh: scores never stored (flash)")
ax.axhline(80, color="black", ls="--", lw=1)
ax.text(lengths[0], 85, "80 GB GPU", fontsize=8)
ax.set_xlabel("sequence length s")
ax.set_ylabel("GB per layer")
ax.legend(frameon=False, fontsize=8)
plt.show()
print(f"at s = 131072: {activation_bytes_per_layer(131072, 1, 8192, 64) / 1e9:,.0f} GB per layer with the scores, "
      f"{34 * 131072 * 8192 / 1e9:.1f} GB without them, times 80 layers")

# %% [markdown]
# Two moves. Never store the $s \times s$ scores (FlashAttention computes them block by
# block and recomputes them in backward): that removes the quadratic term. And split the
# sequence over $c$ GPUs: that divides the linear one.
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
#
# **Exercise 4.1** — attention on one device, `block` keys at a time: `q`, `k`, `v` are
# (b, heads, s, d); scale the scores by $1/\sqrt{d}$; with `causal`, query $i$ sees keys
# $j \le i$. Never build the $s \times s$ matrix: the check measures your peak memory.

# %%
def online_attention(q, k, v, block, causal=False):
    ### BEGIN SOLUTION: Exercise 4.1: online softmax, block by block
    s, d = q.shape[-2], q.shape[-1]
    m = np.full(q.shape[:-1], -np.inf)
    l = np.zeros(q.shape[:-1])
    o = np.zeros(q.shape)
    for j0 in range(0, k.shape[-2], block):
        x = q @ k[..., j0:j0 + block, :].swapaxes(-1, -2) / np.sqrt(d)
        if causal:
            x = np.where(np.arange(j0, j0 + x.shape[-1])[None, :] <= np.arange(s)[:, None], x, -np.inf)
        m_new = np.maximum(m, x.max(-1))
        safe = np.where(np.isfinite(m_new), m_new, 0.0)  # rows that have seen no key yet
        p = np.exp(x - safe[..., None])
        scale = np.exp(m - safe)
        l = l * scale + p.sum(-1)
        o = o * scale[..., None] + p @ v[..., j0:j0 + block, :]
        m = m_new
    return o / l[..., None]
    ### END SOLUTION


# %% tags=["check"]
grade.check_online_attention(online_attention)

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
# the send and the receive, compute, then wait.
#
# **Exercise 4.2** — the per-rank ring forward. `q`, `k`, `v` are this rank's (b, heads,
# n, d) shards of a sequence split in `layout` (`cp.positions(rank, c, n, layout)` gives
# the global positions of a rank's rows). Use `cp.OnlineSoftmax(rows, d)`
# (`.update(scores, v_block)` with masked scores at `-inf`; `.finish(dtype)` returns
# `(out, lse)`), post transfers with `comm.batch_isend_irecv([P2POp(comm.isend, x, right),
# P2POp(comm.irecv, buffer, left)])`, and charge the compute of each block you compute with
# `comm.compute(flops=4 * b * heads * n_q * n_k * d)`. With `causal`, skip a block whose
# keys all come after its queries. The check compares with full attention on 1 to 8 ranks,
# causal or not, in both layouts, and reads the trace and the timeline.

# %%
def ring_forward(comm, q, k, v, causal=False, layout="contiguous"):
    ### BEGIN SOLUTION: Exercise 4.2: the ring, forward
    c, n, d = comm.size, q.shape[-2], q.shape[-1]
    right, left = (comm.rank + 1) % c, (comm.rank - 1) % c
    mine = cp.positions(comm.rank, c, n, layout)
    state = cp.OnlineSoftmax(q.shape[:-1], d)
    kv = np.stack([k, v])
    for t in range(c):
        if t < c - 1:  # the next block travels while this one is used
            handles = comm.batch_isend_irecv([P2POp(comm.isend, kv, right), P2POp(comm.irecv, np.empty_like(kv), left)])
        theirs = cp.positions((comm.rank - t) % c, c, n, layout)
        seen = theirs[None, :] <= mine[:, None] if causal else np.ones((n, n), bool)
        if seen.any():  # else every key of the block comes after every query: skip it
            scores = q @ kv[0].swapaxes(-1, -2) / np.sqrt(d)
            state.update(np.where(seen, scores, -np.inf), kv[1])
            comm.compute(flops=4 * np.prod(q.shape[:-2]) * n * n * d, name=f"block {t}")
        if t < c - 1:
            kv = handles[1].wait()
            handles[0].wait()
    return state.finish(q.dtype)[0]
    ### END SOLUTION


# %% tags=["check"]
grade.check_ring_forward(ring_forward)

# %% [markdown]
# The library's `cp.ring_attention` on 4 ranks, with compute at 10 TFLOP/s and the K/V
# block of a 512-position shard crossing NVLink: the transfers (lanes under each rank)
# run under the compute.

# %%
c, heads, d = 4, 4, 64
seq = rng.standard_normal((3, 1, heads, 4 * 512, d)).astype(np.float32)
shards = [cp.split_sequence(x, c) for x in seq]
world = World(c, topology=Topology(flops=1e13))
world.run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards)))
viz.gantt(world.timeline(), title="ring attention forward, 4 ranks: transfers under compute")
plt.show()

# %% [markdown]
# **Napkin 4.2** — when does the transfer hide? With $n$ positions per rank, $h$ the model
# width and batch $b$, a step computes $4bn^2h$ FLOPs (scores and scores times V, every
# head) and sends $2bnh$ values (K and V) of `dtype_bytes` each. Ignoring latency, from
# how many positions per rank does the compute (at `flops` FLOP/s) take at least as long
# as the transfer (at `beta` bytes/s)?

# %%
def napkin_ring_overlap(flops=989e12, beta=370e9, dtype_bytes=2):
    ### BEGIN SOLUTION: Napkin 4.2: when the transfer hides
    # 4 b n^2 h / flops >= 2 b n h dtype_bytes / beta  <=>  n >= flops dtype_bytes / (2 beta)
    return flops * dtype_bytes / (2 * beta)
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_overlap(napkin_ring_overlap)

# %% [markdown]
# About 2.7k positions per GPU inside a node, 21k across nodes: ring attention wants long
# shards, which is exactly when it is needed.
#
# ## 4. Causal masks and load balance
#
# With a causal mask, query $i$ sees keys $j \le i$ only. A block whose keys all come
# after all its queries is skipped. With contiguous shards, rank 0 (the first positions)
# skips every block but its own, while rank $c-1$ needs them all. *Predict first*: with
# $c = 4$ contiguous shards, how much compute does each rank do, relative to rank 0, and
# when is the step done? Then run it (both layouts):

# %%
c = 4
seq = rng.standard_normal((3, 1, 4, 64 * c, 16))
fig, axes = plt.subplots(1, 2, figsize=(11, 2.6))
for layout, ax in zip(cp.LAYOUTS, axes):
    shards = [cp.split_sequence(x, c, layout) for x in seq]
    world = World(c, topology=Topology(flops=1e10))
    world.run(lambda comm: cp.ring_attention(comm, *(x[comm.rank] for x in shards), causal=True, layout=layout))
    tl = world.timeline()
    work = [tl.total("compute", r) * 1e6 for r in range(c)]
    print(f"{layout:10s}: compute per rank {', '.join(f'{w:.0f}' for w in work)} us; step done at "
          f"{tl.makespan * 1e6:.0f} us")
    viz.gantt(tl, ax=ax, title=f"causal ring attention, {layout}", streams=(), label_events=False)
for ax in axes:  # one time axis for both
    ax.set_xlim(0, max(a.get_xlim()[1] for a in axes))
plt.show()

# %% [markdown]
# Contiguous: rank $r$ computes $r + 1$ blocks, so the last rank does $c$ times the work
# of the first, and the step ends when it does; the others wait.
#
# **Zigzag**: cut the sequence into $2c$ chunks and give rank $i$ chunks $i$ and
# $2c-1-i$, one early and one late. Every rank now computes the same $2c+1$ half-blocks
# (measured above: equal compute, an earlier finish). Step through it: which block each
# rank holds, which score blocks it computes or skips, its work so far.

# %% tags=["nbval-ignore-output"]
from emulator.widgets import RingAttentionStepper

RingAttentionStepper(c=4, causal=True, layout="zigzag", step=1)

# %% [markdown]
# **Exercise 4.3** — the zigzag layout and its masks. `zigzag_split(x, c)` cuts `x` along
# its second-to-last dim into $2c$ chunks and returns $c$ shards, shard $i$ = chunk $i$
# followed by chunk $2c-1-i$; `zigzag_gather(shards)` undoes it. `visible(q_pos, k_pos)`
# takes the global positions of a block's queries and keys and returns `None` when no
# query sees any key (the block is skipped), else the boolean mask (query $i$ sees key
# $j$ when $k_j \le q_i$).

# %%
def zigzag_split(x, c):
    ### BEGIN SOLUTION: Exercise 4.3: zigzag layout
    chunks = np.split(x, 2 * c, axis=-2)
    return [np.concatenate([chunks[i], chunks[2 * c - 1 - i]], axis=-2) for i in range(c)]
    ### END SOLUTION


def zigzag_gather(shards):
    ### BEGIN SOLUTION: Exercise 4.3: zigzag layout, gathered
    c = len(shards)
    halves = [np.split(s, 2, axis=-2) for s in shards]
    return np.concatenate([halves[i][0] for i in range(c)] + [halves[c - 1 - i][1] for i in range(c)], axis=-2)
    ### END SOLUTION


def visible(q_pos, k_pos):
    ### BEGIN SOLUTION: Exercise 4.3: causal mask of a block, or None to skip it
    if k_pos.min() > q_pos.max():
        return None
    return k_pos[None, :] <= q_pos[:, None]
    ### END SOLUTION


# %% tags=["check"]
grade.check_zigzag(zigzag_split, zigzag_gather, visible)

# %% [markdown]
# ## 5. Backward
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
# mask; return `(dq, dk, dv)` for this rank's positions.

# %%
def ring_backward(comm, q, k, v, out, lse, dout, causal=False, layout="contiguous"):
    ### BEGIN SOLUTION: Exercise 4.4: the ring, backward
    c, n, d = comm.size, q.shape[-2], q.shape[-1]
    right, left = (comm.rank + 1) % c, (comm.rank - 1) % c
    mine = cp.positions(comm.rank, c, n, layout)
    delta = (dout * out).sum(-1, keepdims=True)
    dq = np.zeros_like(q)
    kv, dkv = np.stack([k, v]), np.zeros((2,) + k.shape)
    for t in range(c):
        theirs = cp.positions((comm.rank - t) % c, c, n, layout)
        seen = theirs[None, :] <= mine[:, None] if causal else np.ones((n, n), bool)
        if seen.any():
            p = np.where(seen, np.exp(q @ kv[0].swapaxes(-1, -2) / np.sqrt(d) - lse[..., None]), 0.0)
            ds = p * (dout @ kv[1].swapaxes(-1, -2) - delta)
            dq += ds @ kv[0] / np.sqrt(d)
            dkv[0] += ds.swapaxes(-1, -2) @ q / np.sqrt(d)
            dkv[1] += p.swapaxes(-1, -2) @ dout
        if c > 1:  # the block and its gradients move on together; after the last step, home
            moved = [P2POp(comm.isend, dkv, right), P2POp(comm.irecv, np.empty_like(dkv), left)]
            if t < c - 1:
                moved += [P2POp(comm.isend, kv, right), P2POp(comm.irecv, np.empty_like(kv), left)]
            handles = comm.batch_isend_irecv(moved)
            dkv = handles[1].wait()
            if t < c - 1:
                kv = handles[3].wait()
            for h_ in handles[::2]:
                h_.wait()
    return dq, dkv[0], dkv[1]
    ### END SOLUTION


# %% tags=["check"]
grade.check_ring_backward(ring_backward)

# %% [markdown]
# ## 6. Other ways to split the sequence
#
# **All-gather K/V**: every rank gathers the whole sequence's keys and values, then
# computes its queries against them. Simple, the same bytes as the ring, but sent before
# any compute (nothing hides them) and every rank holds all of K/V. Llama 3 used it for
# its long-context stage (context parallel 16), with the zigzag layout.
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
# them behind compute and never holds more than two. Ulysses moves less per rank (each
# all-to-all keeps $1/c$ of its data home and its pieces shrink as $c$ grows) but needs
# $c \le$ heads, and with grouped-query attention, fewer K/V heads still.
#
# ## 7. Numerics
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
# ## 8. Where context parallelism sits
#
# A `cp` axis of the mesh: ranks that share the same model shard and the same sequence,
# each with a slice of it. Per layer it sends $(c-1)$ K/V shards forward and about twice
# that backward, point to point around its ring, hidden behind attention's compute when
# shards are long. It pays off when sequences are long, which is why it appears in the
# long-context stage of training: Llama 3 405B trained with CP 1 at 8k tokens and raised
# it to 16 (with DP down to 8) to extend the context to 128k. Its two meshes (TP 8, PP
# 16 in both):

# %%
for stage, shape, seq_len in (("pretraining, 8k tokens", {"dp": 128, "pp": 16, "cp": 1, "tp": 8}, 8192),
                              ("long context, 128k tokens", {"dp": 8, "pp": 16, "cp": 16, "tp": 8}, 131072)):
    mesh = Mesh(shape)
    ring = mesh.group_ranks(("cp",), 0)
    print(f"{stage:26s}: {mesh.size:,d} GPUs, {seq_len // shape['cp']:,d} positions of each sequence per GPU, "
          f"rank 0's cp ring spans {len({mesh.node_of(r) for r in ring})} node(s)")

# %% [markdown]
# The same GPUs and the same slice of a sequence per GPU: the sixteen times longer
# sequence is paid for with sixteen times fewer data-parallel replicas, and the ring
# leaves the node (the tp axis fills it), so its K/V blocks cross the NICs.
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
# ## 9. On real GPUs
#
# `gpu_labs/04_context_parallel.py` runs ring attention forward and backward over
# `torch.distributed` point to point (`batch_isend_irecv`), contiguous and zigzag, causal
# and not, against `scaled_dot_product_attention` on the whole sequence (outputs and
# gradients), records its calls for comparison with the emulator's, and on GPUs times
# each step's compute and transfer beside the emulator's prediction:
#
# ```
# torchrun --standalone --nproc-per-node 4 gpu_labs/04_context_parallel.py
# ```
#
# **Next:** lesson 05 splits a layer's experts: mixture of experts and expert parallelism.
