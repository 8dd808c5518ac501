# %% [markdown]
# # Lesson 00 — Collectives: the language of parallel training
#
# Every technique in this course (data parallelism, ZeRO, tensor and pipeline parallelism,
# ring attention, expert parallelism) is, at bottom, a choice of *which collective to call,
# on which group of GPUs, over which link*. This lesson builds the three collectives that
# matter most, step by step, on the emulator, and measures what they cost.
#
# You will:
# 1. see why training needs many GPUs at all, and how the hardware is wired;
# 2. meet all-reduce, reduce-scatter and all-gather, and the identity that ties them;
# 3. step through the ring algorithm, then write it yourself (Exercises 0.1–0.4);
# 4. price a collective with the alpha-beta model and read nccl-tests' "bus bandwidth";
# 5. answer three napkin problems, graded in the notebook.
#
# Cells tagged as checks print `PASSED ...` when your code is right and raise an error
# that says what differs when it is not.

# %%
import numpy as np
import matplotlib.pyplot as plt

from emulator import DeadlockError, P2POp, World, Topology, viz
from emulator.algorithms import global_view as C
from emulator.cost import collective_time, busbw, algbw, crossover_bytes, crossover_ring_tree, calibration_table, BUS_FACTOR
from emulator.algorithms.hand_traced import Network
from emulator.machine.topology import NVLINK_H100, INFINIBAND_NDR, H100_BF16_FLOPS
from emulator.grading import lesson00 as grade
from emulator.notebook import setup

setup()

# %% [markdown]
# ## 1. Why many machines?
#
# Two walls. **Compute**: the largest supercomputers deliver exaflops; one GPU delivers about
# a petaflop. **Memory**: the training state of a large model does not fit on one GPU.
#
# Take a 7.5B-parameter model. Mixed-precision Adam keeps, per parameter, bf16 weights (2
# bytes), bf16 gradients (2), an fp32 master copy (4) and two fp32 moments (4 + 4): 16 bytes.
# Training costs about 6 FLOPs per parameter per token (forward 2, backward 4).

# %%
params = 7.5e9
state_gb = 16 * params / 1e9
tokens = 2e12
flops = 6 * params * tokens
mfu = 0.5  # a good fraction of peak to sustain
one_gpu_s = flops / (H100_BF16_FLOPS * mfu)
print(f"training state: {state_gb:.0f} GB  (one H100 has 80 GB)")
print(f"training compute: {flops:.2e} FLOPs")
print(f"one H100 at {mfu:.0%} of {H100_BF16_FLOPS / 1e12:.0f} TFLOP/s: {one_gpu_s / 86400 / 365:.1f} years")
print(f"1024 of them, perfectly parallel: {one_gpu_s / 1024 / 86400:.1f} days")

# %% [markdown]
# So we split the work. What we want from splitting it over $N$ GPUs:
#
# * **linear memory scaling**: each GPU holds about $1/N$ of the state;
# * **linear compute scaling**: $N$ GPUs finish about $N$ times sooner;
# * **losslessness**: no GPU sits idle, nothing we paid for is wasted.
#
# No single technique gets all three; every later lesson trades one against another.
#
# ## 2. The hardware shapes the strategy
#
# GPUs come in nodes of 8 joined by NVLink, a fast switch inside the box; nodes reach each
# other over InfiniBand through leaf and spine switches (a *fat tree*): any GPU can reach
# any other in a few hops, which suits irregular traffic such as mixture-of-experts routing.
# TPUs are wired as a *torus*: each chip talks to its neighbours, edges wrap around, and the
# mesh grows without bigger switches; it suits regular, neighbour-to-neighbour partitions.

# %%
viz.topologies()
plt.show()

# %% [markdown]
# The gap between the two GPU links is what every placement decision in this course turns
# on. Compare them like with like, one direction each: NVLink 4 gives an H100 450 GB/s each
# way (900 GB/s counting both), of which NCCL achieves about 370 GB/s; an InfiniBand NDR
# NIC gives 50 GB/s each way (400 Gb/s), of which NCCL achieves 46-48 GB/s. (The "20-40x"
# one often reads divides NVLink's both-directions 900 GB/s by one direction of a NIC, and
# of a 25-50 GB/s one.)

# %%
for what, nv, ib in (("datasheet", NVLINK_H100.line_rate, INFINIBAND_NDR.line_rate),
                     ("achieved by NCCL", NVLINK_H100.beta, INFINIBAND_NDR.beta)):
    print(f"{what:17s}: NVLink {nv / 1e9:.0f} GB/s vs one NIC {ib / 1e9:.0f} GB/s, per direction: {nv / ib:.1f}x")

# %% [markdown]
# The emulator charges each message on the link it crosses. Here is the same all-reduce of
# 64 MiB per GPU on 16 GPUs: first all in one node of 16 (no such H100 node exists; it
# shows NVLink alone), then on two nodes of 8 with one ring (one *channel*): every step
# waits for the hop between the nodes, through one GPU's NIC. NCCL runs several rings
# (channels) at once; each enters and leaves a node through a different GPU and so through
# its own NIC, and the 8 NICs of a node share the crossing traffic. The last column is the
# bus bandwidth (defined in section 6; compare it with a link's bandwidth).

# %%
x = np.ones(16 * 2**20, dtype=np.float32)  # 64 MiB per rank
for per_node, channels in ((16, None), (8, 1), (8, None)):
    world = World(16, topology=Topology(gpus_per_node=per_node))
    world.run(lambda comm: comm.all_reduce(x, channels=channels))
    t = max(world.stats().time)
    used = channels or world.topology.channels
    nic_senders = sum(1 for b in world.stats().bytes_sent_by_link["nic"] if b)
    print(f"{16 // per_node} node(s), {used} channel{'s' * (used > 1)}: {t * 1e3:6.3f} ms, {nic_senders:2d} NICs sending, "
          f"busbw {busbw('all_reduce', x.nbytes, 16, t) / 1e9:5.0f} GB/s")

# %% [markdown]
# ## 3. Three collectives
#
# A *collective* is an operation every rank of a group calls together.
#
# * **all-reduce**: every rank ends with the elementwise sum (or max, mean...) of everyone's
#   buffer. Data parallelism uses it to sum gradients.
# * **reduce-scatter**: the sum is computed, but rank $r$ keeps only the $r$-th chunk of it.
# * **all-gather**: rank $r$ contributes chunk $r$; everyone ends with all chunks.

# %%
viz.primitives()
plt.show()


# %% [markdown]
# On the emulator they look like `torch.distributed`. `World(4).run(fn)` calls `fn(comm)`
# once per rank and returns the results by rank:

# %%
def three_collectives(comm):
    x = np.arange(4.0) + 10 * comm.rank  # rank r holds [10r, 10r+1, 10r+2, 10r+3]
    return comm.all_reduce(x), comm.reduce_scatter(x), comm.all_gather(x[:1])


for rank, (ar, rs, ag) in enumerate(World(4).run(three_collectives)):
    print(f"rank {rank}: all_reduce {ar}  reduce_scatter {rs}  all_gather {ag}")


# %% [markdown]
# **The identity to keep in your pocket:** all-reduce = reduce-scatter, then all-gather.
# Reduce-scatter leaves each rank one summed chunk; all-gather hands every chunk to
# everyone. The emulator records every message, so we can measure both ways:

# %%
def all_reduce_directly(comm, x):
    return comm.all_reduce(x)


def all_reduce_in_two(comm, x):
    return comm.all_gather(comm.reduce_scatter(x))


n, S = 8, 8 * 2**20  # 8 ranks, 8 MiB each
x = np.random.default_rng(0).standard_normal(S // 4).astype(np.float32)
world = World(n)
for prog in (all_reduce_directly, all_reduce_in_two):
    out = world.run(prog, x)
    stats = world.stats()
    print(f"{prog.__name__:20s} sent per rank {stats.bytes_sent[0] / 2**20:6.3f} MiB "
          f"(2(n-1)/n * S = {2 * (n - 1) / n * S / 2**20:.3f}), steps {len({(r.op, r.step) for r in world.trace})}, "
          f"time {max(stats.time) * 1e3:.4f} ms")
assert np.allclose(out[0], n * x)

# %% [markdown]
# Same bytes, same steps, same time: the two are one algorithm. Lesson 01 spends this
# identity to shard optimizer state for free (ZeRO).
#
# ## 4. The ring, step by step
#
# Put the $n$ ranks on a ring; cut every buffer into $n$ chunks. In each step, *every*
# rank sends one chunk to its right neighbour at the same time.
#
# * **Reduce-scatter** ($n-1$ steps): in step $s$, rank $r$ sends chunk $(r-s-1) \bmod n$,
#   and its neighbour adds it to its own copy. A chunk travels round the ring collecting
#   one contribution per hop; after $n-1$ hops rank $r$ holds chunk $r$, complete.
# * **All-gather** ($n-1$ steps): in step $s$, rank $r$ forwards chunk $(r-s) \bmod n$, the
#   newest complete chunk it has.
#
# Each rank sends $n-1$ chunks of $S/n$ bytes per phase, so $(n-1)/n \cdot S$, *whatever
# $n$ is*: the ring uses every link all the time, and the per-rank traffic does not grow
# with the number of GPUs. Move the sliders (the number in a cell counts how many ranks'
# inputs it holds; arrows are this step's sends):

# %% tags=["nbval-ignore-output"]
from emulator.widgets import RingStepper

RingStepper(n=4)

# %% [markdown]
# The same steps as a static picture, for 4 ranks: after reduce-scatter step 1, 2, 3, and
# at the end of the all-gather.

# %%
steps = list(C.ring_all_reduce_steps([np.ones(4) * r for r in range(4)]))
fig, axes = plt.subplots(1, 4, figsize=(11, 2.6))
for ax, k in zip(axes, (0, 1, 2, 5)):
    viz.ring_step(steps[k], ax=ax)
plt.show()


# %% [markdown]
# ## 5. Build it yourself
#
# The global view holds every rank's buffer in one list. A communication step is one call
# `net.exchange([(src, dst, array), ...])`: all messages of the step at once; it returns
# the arrays as delivered and counts steps and bytes (`net.steps`, `net.bytes_sent`).
# Buffers are 1-D and their length divides by $n$; `np.split(b, n)` cuts one into chunks.
#
# **Exercise 0.1** — ring reduce-scatter: return a list whose entry $r$ is chunk $r$ of
# the sum, in $n-1$ calls to `net.exchange`.

# %%
def ring_reduce_scatter(bufs, net):
    n = len(bufs)
    ### BEGIN SOLUTION: Exercise 0.1: ring reduce-scatter
    chunks = [np.split(b, n) for b in bufs]  # chunks[r][c]: rank r's copy of chunk c
    for s in range(n - 1):
        sends = [(r, (r + 1) % n, (r - s - 1) % n) for r in range(n)]
        arrived = net.exchange([(src, dst, chunks[src][c]) for src, dst, c in sends])
        for (src, dst, c), data in zip(sends, arrived):
            chunks[dst][c] = chunks[dst][c] + data
    return [chunks[r][r] for r in range(n)]
    ### END SOLUTION


# %% tags=["check"]
grade.check_ring_reduce_scatter(ring_reduce_scatter)


# %% [markdown]
# **Exercise 0.2** — ring all-gather: `shards[r]` is rank $r$'s piece; return, for every
# rank, the concatenation of all pieces in rank order, in $n-1$ steps.

# %%
def ring_all_gather(shards, net):
    n = len(shards)
    ### BEGIN SOLUTION: Exercise 0.2: ring all-gather
    have = [[None] * n for _ in range(n)]  # have[r][c]: rank r's copy of piece c
    for r in range(n):
        have[r][r] = shards[r]
    for s in range(n - 1):
        sends = [(r, (r + 1) % n, (r - s) % n) for r in range(n)]
        arrived = net.exchange([(src, dst, have[src][c]) for src, dst, c in sends])
        for (src, dst, c), data in zip(sends, arrived):
            have[dst][c] = data
    return [np.concatenate(row) for row in have]
    ### END SOLUTION


# %% tags=["check"]
grade.check_ring_all_gather(ring_all_gather)


# %% [markdown]
# **Exercise 0.3** — all-reduce from the two. (One line. The check also counts $2(n-1)$
# steps and $2(n-1)/n \cdot S$ bytes per rank.)

# %%
def ring_all_reduce(bufs, net):
    ### BEGIN SOLUTION: Exercise 0.3: all-reduce from reduce-scatter and all-gather
    return ring_all_gather(ring_reduce_scatter(bufs, net), net)
    ### END SOLUTION


# %% tags=["check"]
grade.check_ring_all_reduce(ring_all_reduce)


# %% [markdown]
# ### The same ring as a real program
#
# On a cluster each rank runs its own copy of the program and talks to others with
# point-to-point calls: `comm.send(x, dst)` and `comm.recv(src)`. As on NCCL, a send
# completes only when the receiver has posted the matching receive. So what happens to
# the obvious ring, in which every rank first sends to its right and then receives from
# its left? Predict, then run it:

# %%
def send_then_recv_ring(comm, x):
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    comm.send(x, right)
    return comm.recv(left)


try:
    World(4).run(send_then_recv_ring, np.ones(4))
except DeadlockError as exc:
    print(exc)

# %% [markdown]
# Every rank waits in its send for a receive that nobody will ever post. NCCL hangs the same
# way (with a timeout minutes later, not a report). Two fixes: post the send and the
# receive together, `comm.batch_isend_irecv([P2POp(comm.isend, chunk, right),
# P2POp(comm.irecv, buffer, left)])`: one NCCL group, returned as a list holding one handle
# for the whole batch (as torch does on NCCL; loop over the list and `wait()`), after which
# the received chunk is in `buffer`; or break the cycle by ordering them (even ranks send
# first, odd ranks receive first).
#
# **Exercise 0.4** — the ring all-reduce as a per-rank program, from point-to-point calls
# only (`batch_isend_irecv` with `P2POp`, or `send`/`recv` in a safe order). Rank $r$ talks
# to $r+1$ and $r-1$ (mod $n$).

# %%
def spmd_ring_all_reduce(comm, x):
    n, r = comm.size, comm.rank
    ### BEGIN SOLUTION: Exercise 0.4: SPMD ring all-reduce from point-to-point calls
    chunks = np.split(x, n)
    right, left = (r + 1) % n, (r - 1) % n

    def exchange(chunk):
        buf = np.empty_like(chunk)
        for h in comm.batch_isend_irecv([P2POp(comm.isend, chunk, right), P2POp(comm.irecv, buf, left)]):
            h.wait()
        return buf

    for s in range(n - 1):  # reduce-scatter
        c = (r - s - 2) % n
        chunks[c] = chunks[c] + exchange(chunks[(r - s - 1) % n])
    for s in range(n - 1):  # all-gather
        chunks[(r - s - 1) % n] = exchange(chunks[(r - s) % n])
    return np.concatenate(chunks)
    ### END SOLUTION


# %% tags=["check"]
grade.check_spmd_ring_all_reduce(spmd_ring_all_reduce)

# %% [markdown]
# ## 6. What a collective costs: the alpha-beta model
#
# A message of $m$ bytes over a link costs $\alpha + m/\beta$: a fixed latency $\alpha$
# (launch, synchronisation, first byte) plus the bytes over the bandwidth $\beta$. A ring
# all-reduce of $S$ bytes per rank on $n$ ranks makes $2(n-1)$ steps of $S/n$ bytes:
#
# $$T_\text{ring} = 2(n-1)\,\alpha + \frac{2(n-1)}{n}\,\frac{S}{\beta}$$
#
# A binomial tree reduces to one rank and broadcasts back in $2\lceil\log_2 n\rceil$ steps,
# each moving the whole buffer:
#
# $$T_\text{tree} = 2\lceil\log_2 n\rceil\,\left(\alpha + \frac{S}{\beta}\right)$$
#
# Small messages are **latency-bound** (the $\alpha$ terms rule, and the tree's fewer steps
# win); large ones are **bandwidth-bound** (the ring's $2(n-1)/n < 2$ beats the tree's
# $2\log_2 n$). Two sizes mark the change, and they are not the same: where the ring's
# two terms are equal ($S = n\alpha\beta$, Napkin 0.3), and, smaller, where the ring and
# the tree take equal time ($S = (n-1-L)\,\alpha\beta / (L - (n-1)/n)$ with
# $L = \lceil\log_2 n\rceil$). The tree here is the textbook *binomial* tree, each level
# waiting for the whole buffer. NCCL's tree is a *double binary* tree, pipelined in small
# pieces, whose bandwidth term comes close to the ring's; it is what NCCL picks for small
# messages and across many nodes. The emulator's clock follows these formulas exactly:

# %%
node = Topology(gpus_per_node=8)
sizes = np.logspace(3, 9, 25)  # bytes per rank
ring = [collective_time("all_reduce", s, 8, node) for s in sizes]
tree = [collective_time("all_reduce", s, 8, node, algorithm="tree") for s in sizes]
for alg in ("ring", "tree"):  # check the formulas against the emulator's simulated clock
    w = World(8, algorithm=alg)
    w.run(lambda comm: comm.all_reduce(np.ones(2**16, np.float32)))
    assert np.isclose(max(w.stats().time), collective_time("all_reduce", 2**18, 8, node, alg))
fig, ax = plt.subplots(figsize=(6.5, 3.2))
ax.loglog(sizes, np.array(ring) * 1e6, label="ring")
ax.loglog(sizes, np.array(tree) * 1e6, label="binomial tree")
ax.axvline(crossover_ring_tree(8, NVLINK_H100), color="black", ls="--", lw=1, label="ring = tree")
ax.axvline(crossover_bytes(8, NVLINK_H100), color="grey", ls=":", label="ring: latency = bandwidth term")
ax.set_xlabel("bytes per rank")
ax.set_ylabel("all-reduce time (us)")
ax.set_title("8 GPUs on NVLink, alpha = 2 us, beta = 370 GB/s")
ax.legend()
plt.show()

# %% [markdown]
# ### Bus bandwidth, as nccl-tests reports it
#
# NVIDIA's nccl-tests print two numbers per size. **algbw** $= S/t$ is the naive rate.
# **busbw** multiplies it by how much each rank must really move per byte of result:
# $2(n-1)/n$ for all-reduce, $(n-1)/n$ for reduce-scatter and all-gather. $S$ is always
# the whole buffer: the per-rank buffer of an all-reduce, the *input* of a reduce-scatter
# and the *output* of an all-gather (each rank's piece is $S/n$). Bus bandwidth is
# what you compare with the link: on an 8-GPU H100 node a ring saturates near 370 GB/s for
# large messages (out of the 450 GB/s NVLink line rate each way; with NVLink SHARP, which
# reduces inside the switch, nccl-tests reports about 480). Across nodes with one NDR NIC
# per GPU, NCCL's channels put all 8 NICs of a node to work: about 370 GB/s again, where a
# single ring through one NIC would give 46-48 (published figures and sources in
# `emulator/machine/topology.py`).

# %%
print(f"{'size':>10} {'time':>10} {'algbw':>11} {'busbw':>11}   (all_reduce, 8 GPUs in one node, model)")
for s in (1e3, 1e5, 1e7, 1e9):
    t = collective_time("all_reduce", s, 8, node)
    print(f"{s:10.0e} {t * 1e6:8.1f}us {algbw(s, t) / 1e9:7.1f}GB/s {busbw('all_reduce', s, 8, t) / 1e9:7.1f}GB/s")
print("bus-bandwidth factors:", {op: f(8) for op, f in BUS_FACTOR.items() if op != "broadcast"})

# %% [markdown]
# How good is the model? Here it is beside published nccl-tests runs of a 1 GiB all-reduce
# on H100 nodes with one 400G NIC per GPU (the sources are GitHub issues of NVIDIA's nccl
# and nccl-tests repositories, where NVIDIA's engineers state the expected figures). The
# model has rings only, so it has nothing to say about NVLink SHARP's one-node figure.

# %%
print(calibration_table())

# %% [markdown]
# ### Overlap: communication on its own stream
#
# Each emulated rank has a compute stream and a communication stream per group, as
# PyTorch's NCCL process groups have. A collective called with `async_op=True` runs on its
# group's stream while the rank keeps computing; `handle.wait()` joins them. Here each rank computes the gradients of four layers
# (backward runs last layer first) and all-reduces each layer's gradients: first waiting
# for each one, then letting them run behind the next layer's compute.

# %%
grads = np.ones(8 * 2**20, np.float32)  # 32 MiB of gradients per layer


def backward_blocking(comm):
    for layer in reversed(range(4)):
        comm.compute(seconds=0.2e-3, name=f"grad L{layer}")
        comm.all_reduce(grads)


def backward_overlapped(comm):
    pending = []
    for layer in reversed(range(4)):
        comm.compute(seconds=0.2e-3, name=f"grad L{layer}")
        pending.append(comm.all_reduce(grads, async_op=True))
    for h in pending:
        h.wait()


fig, axes = plt.subplots(2, 1, figsize=(8, 4.2))
for ax, prog in zip(axes, (backward_blocking, backward_overlapped)):
    world = World(2)
    world.run(prog)
    viz.gantt(world, ax=ax, title=f"{prog.__name__}: {max(world.stats().time) * 1e3:.2f} ms")
plt.show()

# %% [markdown]
# ## 7. Napkin problems
#
# Use the model and the numbers above (NVLink: $\alpha$ = 2 µs, $\beta$ = 370 GB/s;
# InfiniBand NDR: $\alpha$ = 5 µs, $\beta$ = 48 GB/s per NIC, as NCCL achieves them). Each
# answer is a function of the problem's numbers; the check calls it with the numbers of
# the problem and with others, and compares with the model (2% tolerance).
#
# **Napkin 0.1** — a model of `n_params` parameters keeps bf16 gradients. Data parallelism
# over `n_gpus` GPUs, `gpus_per_node` per node (one NIC per GPU), all-reduces them once per
# step. How long does that take (a) with one flat ring, one channel, and (b) with a
# channel per NIC, as NCCL does? Which link sets the pace (`"NVLink"` or `"InfiniBand"`)?
# Hint for (b): each channel's ring leaves a node through a different GPU, so in every step
# each NIC carries one channel's piece, $S/(n \cdot g)$ for $g$ channels, while NVLink
# carries the other $g-1$ pieces; the step lasts as long as the slower of the two.

# %%
def napkin_gradient_all_reduce(n_params=7.5e9, n_gpus=64, gpus_per_node=8):
    ### BEGIN SOLUTION: Napkin 0.1: gradient all-reduce time, one NIC or all of them
    S, n, g = 2 * n_params, n_gpus, gpus_per_node
    ib, nv = INFINIBAND_NDR, NVLINK_H100
    flat = 2 * (n - 1) * (ib.alpha + S / n / ib.beta)
    piece = S / (n * g)
    step = max(ib.alpha + piece / ib.beta, nv.alpha + (g - 1) * piece / nv.beta)
    return flat, 2 * (n - 1) * step, "InfiniBand"
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_gradient_all_reduce(napkin_gradient_all_reduce)


# %% [markdown]
# **Napkin 0.2** — nccl-tests ran `all_reduce_perf` on `n` GPUs; for `nbytes` per rank it
# measured `seconds`. What bus bandwidth does it print, in GB/s?

# %%
def napkin_bus_bandwidth(n=8, nbytes=1e9, seconds=4.73e-3):
    ### BEGIN SOLUTION: Napkin 0.2: bus bandwidth from a measured time
    return nbytes / seconds * 2 * (n - 1) / n / 1e9
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_bus_bandwidth(napkin_bus_bandwidth)


# %% [markdown]
# **Napkin 0.3** — below what message size (bytes per rank) does a ring all-reduce on `n`
# GPUs of one node, over a link of latency `alpha` and bandwidth `beta`, spend more time
# on latency than on bandwidth?

# %%
def napkin_crossover(n=8, alpha=2e-6, beta=370e9):
    ### BEGIN SOLUTION: Napkin 0.3: latency-bandwidth crossover
    # 2(n-1) alpha = 2(n-1)/n * S / beta
    return n * alpha * beta
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_crossover(napkin_crossover)

# %% [markdown]
# ## 8. On real GPUs
#
# `gpu_labs/00_collectives.py` runs the same experiments with `torch.distributed`: a
# sweep of `all_reduce`, `reduce_scatter` and `all_gather` reporting time, algbw and busbw
# as nccl-tests does, with the model's prediction beside each line, and the ring
# all-reduce of Exercise 0.4 written with `dist.batch_isend_irecv` (the same calls as
# `emulator.algorithms.p2p_ring`, and a test compares the two traces) and checked against
# `dist.all_reduce`. On one node with 8 GPUs:
#
# ```
# torchrun --standalone --nproc-per-node 8 -m gpu_labs.00_collectives
# ```
#
# Without GPUs it runs on the CPU with gloo (`--nproc-per-node 4`). `gpu_labs/README.md`
# shows multi-node and SLURM launches.
#
# **Next:** lesson 01 spends the all-reduce = reduce-scatter + all-gather identity on data
# parallelism and ZeRO.
