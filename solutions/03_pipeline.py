# %% [markdown]
# # Lesson 03 — Pipeline parallelism
#
# Tensor parallelism cut every layer across the GPUs of a node. Pipeline parallelism cuts
# the model along its depth instead: the first layers on one GPU, the next on another, and
# only the activations at the cut travel, point to point. That little traffic is why
# pipelines are what crosses the slow links between nodes. The price is waiting: a stage
# can only work on what the stage before it has finished.
#
# Here a schedule is data: for every rank, the ordered list of what it computes. One
# executor runs any schedule on the emulated machine, so the bubble and the memory of
# GPipe, 1F1B, interleaved 1F1B and zero-bubble pipelines are measured from the timeline
# and the ledger, and set beside their formulas. You will write the 1F1B schedule
# (Exercise 3.1), the loop that runs one rank's part of a schedule (3.2), the zero-bubble
# schedule ZB-H1 built from your 1F1B (3.3) and the gradient average that combines a
# pipeline with data parallelism (3.4), and answer Problem 8.2 and a napkin on memory
# against bubble.

# %%
import inspect

import numpy as np
import matplotlib.pyplot as plt

from emulator import ConfigError, DeadlockError, P2POp, Topology, World, nn, viz
from emulator.accounting import pipeline_bubble, pp_bytes_per_boundary, tp_bytes_per_layer
from emulator.parallel import pipeline as pp
from emulator.parallel.pipeline import Action
from emulator.viz.schedules import ACTION_COLORS, activations_over_time, schedule_grid
from emulator.training import synthetic_batches, train_single
from emulator.grading import lesson03 as grade
from emulator.notebook import setup

setup()

# %% [markdown]
# ## 1. Cutting the model into stages
#
# Our model is the course's small GPT with 8 transformer blocks. With 4 stages each rank
# holds two blocks (the first also the embedding, the last also the LM head and the
# loss). Forward, stage $r$ receives the activations from stage $r-1$ and sends its own on;
# backward, it receives the gradient of its output from stage $r+1$ and sends the gradient
# of its input back.
#
# How long do the passes take? A block's matrix multiplications decide it. Forward is one
# multiply per weight; backward is two: one for the gradient of the input (call it **B**:
# the previous stage waits for it) and one for the gradient of the weights (**W**: nothing
# waits for it). The FLOPs of `nn`'s block:

# %%
model = nn.GPT(vocab=64, d_model=32, n_heads=4, d_ff=128, n_layers=8, max_seq=16)
params = model.init(np.random.default_rng(0))
(x, y), = synthetic_batches(1, 64, 16, 64, seed=1)  # a batch of 64 sequences of 16 tokens

f = model.blocks[0].flops((4, 16, 32))
print(f"one block, 4 sequences: forward {f['forward'] / 1e6:.2f} MFLOP, input gradient (B) "
      f"{f['backward_input'] / 1e6:.2f}, weight gradient (W) {f['backward_weight'] / 1e6:.2f}")

# %% [markdown]
# About 1 : 1 : 1 (B carries attention's $s^2$ work too, which has no weights). So we give
# every stage the same costs: forward 1 ms, backward 2 ms (B 1 ms and W 1 ms), and a
# network that takes no time. Those are the assumptions the bubble formulas make; section
# 8 puts the real network back.

# %%
FREE = Topology.free_network()
COSTS = (1e-3, 1e-3, 1e-3)  # (forward, input gradient, weight gradient) of a whole stage, seconds


def run(name, p, m, v=1, costs=COSTS, topology=FREE, net=(model, params), **kw):
    """One step of schedule ``name`` on ``p`` emulated GPUs (``net``: a model and its parameters)."""
    return pp.run(World(p, topology=topology), *net, pp.schedule(name, p, m, v), x, y, costs=costs, **kw)


# %% [markdown]
# **Naive model parallelism**: the whole batch goes through as one piece, stage after
# stage, and back. Before running it: what share of the step is each GPU busy?

# %%
naive = run("gpipe", 4, 1)
tl = naive.world.timeline()
viz.gantt(tl, colors=ACTION_COLORS, title="one batch, 4 stages: each GPU waits for the others")
plt.show()
for r in range(4):
    print(f"rank {r}: busy {tl.total('compute', r) / tl.makespan:.0%} of the step")

# %% [markdown]
# A quarter each: with $p$ stages, every GPU works $1/p$ of the time. Four GPUs do the
# work of one, and hold a quarter of the model each. That is the whole gain so far:
# memory.
#
# ## 2. Micro-batches and the bubble
#
# Cut the batch into $m$ micro-batches and stream them: while stage 1 runs micro-batch 0,
# stage 0 already runs micro-batch 1. GPipe runs every forward, then every backward. Each
# stage still works $m(t_f + t_b)$ in a step, but the step lasts $(m + p - 1)(t_f + t_b)$:
# the first micro-batch reaches the last stage only after $p-1$ forwards, and the last
# gradient leaves the first stage $p-1$ backwards after the last stage is done. The idle
# part, the **bubble**, has two common names:
#
# * over the **whole step** (the share of GPU time wasted): $\frac{p-1}{m+p-1}$;
# * over the **ideal step** (the overhead on top of the work): $\frac{p-1}{m}$.
#
# They agree when $m \gg p$. This course uses the first for the rule of thumb and the
# second in Problem 8.2; `pipeline_bubble(p, m, of="total")` and `of="ideal"` give each.
# With $p = 4$: what will $m = 4$, 32 and 64 give? Then measure.

# %%
gp4 = run("gpipe", 4, 4)
viz.gantt(gp4.world.timeline(), colors=ACTION_COLORS, title="GPipe, p=4, m=4")
plt.show()
print(f"{'m':>4s} {'measured':>9s} {'(p-1)/(m+p-1)':>14s} {'(p-1)/m':>8s}")
for m in (4, 32, 64):
    measured = run("gpipe", 4, m).bubble
    print(f"{m:>4d} {measured:>9.1%} {pipeline_bubble(4, m):>14.1%} {pipeline_bubble(4, m, of='ideal'):>8.1%}")

# %% [markdown]
# 43%, 8.6%, 4.5% of the step idle: 3/7, 3/35 and 3/67, measured from the timeline. How
# many micro-batches are enough? For 15–20% idle, $m \approx 4p$; under 10% needs
# $m \approx 8$–$10p$:

# %%
fig, ax = plt.subplots(figsize=(7.5, 2.8))
ms = np.arange(1, 257)
for p in (4, 8, 16):
    ax.plot(ms / p, [pipeline_bubble(p, int(m)) for m in ms], label=f"p = {p}")
for ratio, style in ((4, "--"), (8, ":")):
    ax.axvline(ratio, color="grey", ls=style, lw=1)
    ax.text(ratio, 0.6, f" m = {ratio}p", fontsize=8, color="grey")
ax.set_xlim(0, 16)
ax.set_xlabel("micro-batches per stage, m / p")
ax.set_ylabel("idle share of the step")
ax.legend(frameon=False)
plt.show()
for p in (4, 8, 16):
    print(f"p={p:2d}: m=4p -> {pipeline_bubble(p, 4 * p):.1%}, m=8p -> {pipeline_bubble(p, 8 * p):.1%}, "
          f"m=10p -> {pipeline_bubble(p, 10 * p):.1%}")

# %% [markdown]
# Micro-batches are paid for with batch size: each must hold at least one sequence (in
# practice a few), so a deep pipeline needs a large global batch, and data parallelism
# multiplies it again. Batch size is a resource both spend.
#
# **Problem 8.2** — a model is pipelined over `p` stages (the problem: 12). How many
# micro-batches keep the bubble at or under `target` (5%) when the bubble is measured
# over the ideal time, $(p-1)/m$? If a micro-batch holds `seqs_per_micro` sequences (4),
# how many sequences per pipeline does a step need? And how many micro-batches if the
# 5% is the idle share of the whole step instead? Return the three numbers.

# %%
def problem_8_2(p=12, target=0.05, seqs_per_micro=4):
    ### BEGIN SOLUTION: Problem 8.2: micro-batches for a small bubble
    m_ideal = int(np.ceil((p - 1) / target - 1e-9))  # (p-1)/m <= target
    m_total = int(np.ceil((p - 1) * (1 - target) / target - 1e-9))  # (p-1)/(m+p-1) <= target
    return m_ideal, m_ideal * seqs_per_micro, m_total
    ### END SOLUTION


# %% tags=["check"]
grade.problem_8_2(problem_8_2)

# %% [markdown]
# ## 3. GPipe against 1F1B: the same bubble, not the same memory
#
# GPipe keeps every micro-batch's activations until its backward, and the first backward
# starts only after the last forward: at the peak a stage holds all $m$. **1F1B**
# (PipeDream-Flush, Megatron's default) reorders the same work: rank $r$ runs $p-1-r$
# warm-up forwards, then alternates one forward and one backward, then drains the
# remaining backwards. A backward frees its micro-batch's activations, so rank $r$ never
# holds more than $p - r$. The two schedules as data, $p = 4$, $m = 8$:

# %%
for name in ("gpipe", "1f1b"):
    print(name)
    print(pp.format_schedule(pp.schedule(name, 4, 8)))
print("1f1b, p=4, m=4, on a time grid (a backward takes two slots):")
print(pp.format_grid(pp.schedule("1f1b", 4, 4), costs=(1, 2, 0)))
fig, axes = plt.subplots(2, 1, figsize=(9, 4.2))
for ax, name in zip(axes, ("gpipe", "1f1b")):
    schedule_grid(pp.schedule(name, 4, 8), costs=(1, 2, 0), ax=ax, title=f"{name}, p=4, m=8 (forward = 1 unit, "
                  f"backward = 2)")
plt.show()

# %% [markdown]
# Predict the bubble of each, and how many micro-batches each stage holds at its peak.
# Now run both and read the ledger:

# %%
fig, axes = plt.subplots(1, 2, figsize=(10, 2.6), sharey=True)
for ax, name in zip(axes, ("gpipe", "1f1b")):
    r8 = run(name, 4, 8)
    per = r8.stages[0].micro_batch_bytes[0]  # bytes of one micro-batch on rank 0
    activations_over_time(r8.world, ax=ax, per=per, title=f"{name}: bubble {r8.bubble:.1%}")
    print(f"{name:6s} peak micro-batches held by rank 0..3: {[round(n) for n in r8.peak_micro_batches()]}; "
          f"predicted: {pp.in_flight(pp.schedule(name, 4, 8))}")
plt.show()

# %% [markdown]
# The same 27% bubble; GPipe holds 8 micro-batches on every stage, 1F1B holds 4, 3, 2, 1.
# With 1F1B the memory no longer grows with $m$, and that is what lets $m$ grow until the
# bubble is small.
#
# **Exercise 3.1** — the 1F1B schedule as data. Return a list with one list of actions
# per rank: `Action("F", i)` and `Action("B", i)` for micro-batches `i = 0 .. m-1`.
# Rank `r` of `p` does its warm-up forwards, then one forward and one backward at a
# time, then its last backwards; make it work when `m < p` too (section 5 runs $p = 4$,
# $m = 2$: rank 0 then has fewer micro-batches than warm-up slots). The check validates
# it for several shapes, runs it, and compares the measured bubble and memory with
# 1F1B's.

# %%
def one_f_one_b(p, m):
    ### BEGIN SOLUTION: Exercise 3.1: 1F1B as data
    out = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        acts = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):
            acts += [Action("F", warmup + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warmup, m)]
        out.append(acts)
    return out
    ### END SOLUTION


# %% tags=["check"]
grade.check_one_f_one_b(one_f_one_b)

# %% [markdown]
# **Napkin 3.1** — memory against bubble. A stage can spend `budget` bytes on
# activations, and one micro-batch (of one sequence) costs `per_micro_batch` bytes on the
# first stage, the one that holds most. The global batch allows at most `max_m`
# micro-batches. How many micro-batches can GPipe run, and with what bubble (idle share of
# the step)? And 1F1B? Return `(m_gpipe, bubble_gpipe, m_1f1b, bubble_1f1b)`.

# %%
def napkin_memory_vs_bubble(p=8, per_micro_batch=2e9, budget=40e9, max_m=256):
    ### BEGIN SOLUTION: Napkin 3.1: memory against bubble
    m_gpipe = min(int(budget // per_micro_batch), max_m)  # GPipe holds all m at once
    m_1f1b = max_m if p * per_micro_batch <= budget else m_gpipe  # 1F1B holds p, whatever m

    def bubble(m):
        return (p - 1) / (m + p - 1)

    return m_gpipe, bubble(m_gpipe), m_1f1b, bubble(m_1f1b)
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_memory_vs_bubble(napkin_memory_vs_bubble)

# %% [markdown]
# ## 4. One executor for every schedule
#
# A rank runs its list of actions in order. For each: receive its input if another rank
# produces it (the activations for `F`, the output gradient for `B`), compute, send the
# result on, and once a micro-batch's backward is finished, free its activations. A
# `PipelineStage` (`pp.PipelineStage`) does the computing and keeps the ledger; it also
# says where messages come from and go:
#
# * `stage.source(a)` and `stage.destination(a)`: the (rank, chunk) that sends `a`'s input,
#   or receives its output; `None` when there is none (the first stage's forwards read
#   the data, the last stage's backwards start from the loss, `W` sends nothing);
# * `stage.forward(a, x, y)` returns the output to send (on the last stage, the loss);
#   `stage.is_first(a.chunk)` says whether `x` is the micro-batch's tokens
#   `micro_x[a.microbatch]`; `y` is `micro_y[a.microbatch]` (only the last stage uses it);
# * `stage.backward(a, dy, scale=1 / m)` returns the input gradient to send back;
#   `stage.backward_weight(a)` runs a `W`;
# * `stage.finishes_backward(a)` is true for the action after which `stage.free(a)` may
#   release the micro-batch's activations;
# * `stage.boundary(micro_x[0])` is the shape and dtype of what crosses a cut, for the
#   receive buffers; `stage.losses` the losses the last stage computed.
#
# How to send matters. On NCCL a send completes only when the receiver posts the matching
# receive. `comm.batch_isend_irecv([...])` of `P2POp(comm.isend, tensor, peer)` and
# `P2POp(comm.irecv, buffer, peer)` posts several at once as **one NCCL group**: it returns
# a list holding one handle for the whole batch (torch's NCCL path returns exactly that),
# whose `wait()` returns once every send and receive in it is done; what arrived is then in
# the buffers you passed. And the batches a rank posts on a group run one after the other,
# each only once the one before it has completed. So *when* each batch goes matters as much
# as what is in it: two neighbours must post the two ends of every message in batches that
# meet. `pp.program(schedule)` says when, for every rank: a list of steps, each computing
# `step.actions`, then posting one batch that sends the outputs of `step.sends` and
# receives the inputs of `step.receives` (actions that run later). A batch holds what the
# rank sends at one moment of the schedule and what its neighbours send it at that same
# moment, as Megatron's interleaved schedule and torch's pipeline runtime pair them. Rank
# 1 of 1F1B on 4 ranks with 4 micro-batches:

# %%
print(pp.format_program(pp.program(pp.schedule("1f1b", 4, 4))).splitlines()[1])

# %% [markdown]
# Steady state: after each forward, one batch sends its activations on and receives the
# gradient that comes back at that moment; after each backward, one sends the gradient back
# and receives the next micro-batch. A batch with a receive can be waited for later, just
# before the action that reads it, so the compute does not stall on a send.
#
# **Exercise 3.2** — write the loop for one rank: `loop(comm, stage, steps, micro_x,
# micro_y)` runs the rank's program `steps` and returns `stage.losses`. `comm` is the
# pipeline group; every neighbour is another rank (p ≥ 2). For each step compute its
# actions, each on its input (the batch that brings it waited for first), then post the
# step's batch; at the end wait for every batch. The check runs GPipe, 1F1B, zero bubble
# (with `W` actions) and interleaved schedules with it, compares the gradients with one
# device, checks that every action reads exactly what its neighbour sent, counts the
# messages and reads the ledger.

# %%
def stage_loop(comm, stage, steps, micro_x, micro_y):
    ### BEGIN SOLUTION: Exercise 3.2: the per-rank loop
    shape, dtype = stage.boundary(micro_x[0])
    arriving, works = {}, []  # action -> (its buffer, the handles of the batch that brings it)
    for step in steps:
        out = {}
        for a in step.actions:
            inbound = None
            if a in arriving:
                buffer, batch = arriving.pop(a)
                for work in batch:  # one handle: the whole batch
                    work.wait()
                inbound = buffer  # filled now
            if a.kind == "F":
                x_in = micro_x[a.microbatch] if stage.is_first(a.chunk) else inbound
                out[a] = stage.forward(a, x_in, micro_y[a.microbatch])
            elif a.kind == "B":
                out[a] = stage.backward(a, inbound, scale=1 / len(micro_x))
            else:
                stage.backward_weight(a)
            if stage.finishes_backward(a):
                stage.free(a)
        buffers = {a: np.empty(shape, dtype) for a in step.receives}
        ops = [P2POp(comm.isend, out[a], stage.destination(a)[0]) for a in step.sends]
        ops += [P2POp(comm.irecv, buffers[a], stage.source(a)[0]) for a in step.receives]
        if ops:
            batch = comm.batch_isend_irecv(ops)
            works += batch
            arriving.update({a: (buffers[a], batch) for a in step.receives})
    for work in works:
        work.wait()
    return stage.losses
    ### END SOLUTION


# %% tags=["check"]
grade.check_stage_loop(stage_loop)

# %% [markdown]
# ## 5. Order matters
#
# A pipeline is a chain of ranks waiting on each other, so the order of sends and
# receives decides whether it runs at all. `pp.blocking_loop` is the loop above with
# every transfer blocking (`comm.recv` before computing, `comm.send` right after). Under
# 1F1B, which rank will stop first, and on what? Predict, then provoke it:

# %%
print(inspect.getsource(pp.blocking_loop))

try:
    run("1f1b", 4, 8, loop=pp.blocking_loop)
except DeadlockError as err:
    print(err)

# %% [markdown]
# The last stage finishes `B0` and sends its gradient back; its neighbour has just
# finished `F2` and sends its activations forward. Each waits for the other to receive:
# nobody ever will. Posting sends and receives together (`batch_isend_irecv`), as your
# loop does, breaks the cycle.
#
# Would non-blocking calls issued one by one do, an `isend` and then an `irecv`? Not on
# NCCL. torch gives a lone send or receive between two ranks their own two-rank
# communicator, with one CUDA stream for both directions (`ProcessGroupNCCL::pointToPoint`
# in `torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp` keys it by the pair), and an
# operation on a stream starts only when the one before it has finished. NCCL's
# documentation says a lone `ncclSend` "is blocking for the GPU", and that sends and
# receives which must progress at the same time have to be fused between
# `ncclGroupStart()` and `ncclGroupEnd()`, which is what `batch_isend_irecv` does. So two
# neighbours that each `isend` to the other and then `irecv` from it hang, each send
# queued in front of the receive the other one waits for. The emulator runs separately
# issued operations between two ranks in issue order too:

# %%
def swap_separately(comm):
    """Send to the neighbour, then receive from it: two operations, not one batch."""
    peer = 1 - comm.rank
    sent = comm.isend(np.full(4, comm.rank, np.float32), peer)
    got = comm.irecv(np.empty(4, np.float32), peer).wait()
    sent.wait()
    return got


try:
    World(2).run(swap_separately)
except DeadlockError as err:
    print(err)

# %% [markdown]
# Megatron-LM's path without batching (`_p2p_ops` in
# `megatron/core/pipeline_parallel/p2p_communication.py`) orders the calls instead: even
# pipeline ranks send first, odd ranks receive first, so the two ends of every pair match.
#
# And why does the program pair messages by moment, not simply each receive with the
# sends of the action before it, which a rank could decide alone? That pairing,
# `pp.local_program`, is Megatron's without interleaving (`send_forward_recv_backward`
# after a forward, `send_backward_recv_forward` after a backward), and it runs GPipe, 1F1B
# and ZB-H1, whose neighbours exchange in step. Under interleaved 1F1B a micro-batch goes
# around the ranks $v$ times, and from $m = 2p$ on two neighbours each wait in a batch for
# a message the other posts only in a later one:

# %%
inter = pp.schedule("interleaved_1f1b", 2, 4, 2)
local = pp.local_program(inter)
try:
    pp.run(World(2), model, params, inter, x[:8], y[:8],
           loop=lambda comm, stage, steps, mx, my: pp.run_actions(comm, stage, local[comm.rank], mx, my))
except DeadlockError as err:
    print(str(err).split("hint:")[0])

# %% [markdown]
# Megatron's interleaved schedule pairs by step instead: every rank runs the same
# sequence of steps, and in the steady state one batch per step,
# `send_forward_backward_recv_forward_backward`, sends both outputs and receives what the
# neighbours sent in that same step (the first rank, $p - 1$ steps ahead of the last,
# receives what it sent $p - 1$ steps before). torch's `PipelineScheduleMulti` posts one
# batch per time step of its schedule table. `pp.program` finds those moments for any
# schedule by playing it with equal stages, so the same pairing serves every $m$, the
# $m < p$ that Megatron refuses included.
#
# A schedule can be wrong before any message is sent. `pp.validate` checks that each
# action appears once, in an order that can run, with messages between two ranks matched
# in the order they are sent (NCCL has no tags: the k-th send meets the k-th receive):

# %%
for text in ("F0 B0 F1 B1\nF0 F1 B0 B1", "F0 F1 B1 B0\nF0 F1 B0 B1"):
    try:
        pp.validate(pp.parse(text))
    except pp.ScheduleError as err:
        print(err, "\n")

# %% [markdown]
# And fewer micro-batches than stages is legal: every schedule handles $m < p$, with the
# large bubble the formula says.

# %%
few = run("1f1b", 4, 2)
print(f"1F1B, p=4, m=2: measured bubble {few.bubble:.1%}, formula {pipeline_bubble(4, 2):.1%}")

# %% [markdown]
# ## 6. Interleaved 1F1B
#
# Give each rank $v$ smaller chunks of the model, not contiguous: with $p = 4$ and
# $v = 2$ the model is cut into 8 virtual stages and rank $r$ holds stages $r$ and
# $r + 4$. A micro-batch now goes around the ranks $v$ times. Each chunk's forward and
# backward take $1/v$ of a stage's, while the ramp still crosses $p - 1$ ranks, so in
# units of a whole stage the bubble shrinks to $(p-1)/v$: $\frac{p-1}{vm + p - 1}$ of the
# step.

# %%
schedule_grid(pp.schedule("interleaved_1f1b", 4, 8, 2), costs=(1, 2, 0), figsize=(9, 2.4),
              title="interleaved 1F1B, p=4, m=8, v=2 (lighter: the second chunk)")
plt.show()
deep = nn.GPT(vocab=64, d_model=32, n_heads=4, d_ff=128, n_layers=16, max_seq=16)  # 16 blocks: 4 chunks of 1 per rank
deep_params = deep.init(np.random.default_rng(0))
print(f"{'v':>2s} {'measured':>9s} {'formula':>8s} {'messages per step':>18s}")
for v in (1, 2, 4):
    r = run("1f1b" if v == 1 else "interleaved_1f1b", 4, 8, v, net=(deep, deep_params))
    sends = sum(c.op == "send" for calls in r.world.calls for c in calls)
    print(f"{v:>2d} {r.bubble:>9.1%} {pipeline_bubble(4, 8, v):>8.1%} {sends:>18d}")

# %% [markdown]
# The price is read off the trace: each micro-batch now crosses $pv - 1$ cuts instead of
# $p - 1$, so $v$ times (nearly) the point-to-point messages, and each rank keeps the
# activations of more chunks in flight during the longer warm-up.
#
# The micro-batches run in **rounds**: a round of $g$ micro-batches goes through chunk 0,
# then through chunk 1, and so on. Megatron's rounds hold $p$ micro-batches, so by
# default it needs $m$ a multiple of $p$ (its `microbatch_group_size_per_vp_stage`
# changes the round size, and it refuses a last round shorter than $p$, which would add
# "dependency bubbles"). torch's `ScheduleInterleaved1F1B` makes $\max(1, \lfloor m/p
# \rfloor)$ rounds of equal size instead, so $m = 6$ on 4 ranks is one round of 6, and
# $m < p$ one round of $m$; it refuses an $m$ that the rounds do not divide. The
# library builds exactly torch's order (a test compares the two, shape by shape) and
# accepts the same $m$. With $m < p$ a round is too short to keep rank 0 busy: a
# micro-batch that comes back for its next chunk finds rank 0 idle since its $m$-th
# forward, and each of the $v - 1$ returns costs $p - m$ more chunk-times. The idle
# time is then $(p - 1) + (v - 1)(p - m)$ chunk-times against $vm$ of work, which
# `pipeline_bubble` returns. Predict the bubbles, then measure:

# %%
small = nn.GPT(vocab=16, d_model=8, n_heads=2, d_ff=16, n_layers=8, max_seq=4)  # the costs are fixed: any model
(x24, y24), = synthetic_batches(1, 24, 4, 16, seed=1)  # 24 sequences: m = 2, 4, 6, 8 or 12 divides them
print(f"{'m':>3s} {'rounds':>7s} {'measured':>9s} {'formula':>8s}   (p = 4, v = 2)")
for m in (2, 4, 6, 8, 12):
    r = pp.run(World(4, topology=FREE), small, small.init(np.random.default_rng(0)),
               pp.schedule("interleaved_1f1b", 4, m, 2), x24, y24, costs=COSTS)
    print(f"{m:>3d} {max(1, m // 4):>7d} {r.bubble:>9.1%} {pipeline_bubble(4, m, 2):>8.1%}")
try:
    pp.schedule("interleaved_1f1b", 4, 9, 2)
except ConfigError as err:
    print(err)

# %% [markdown]
# ## 7. Zero bubble: split the backward
#
# B is urgent: the previous stage waits for it. W is not: it only has to be done before
# the optimizer step. Zero-bubble schedules (Qi et al., 2023) compute B as early as
# possible and slide the W's into the gaps. Our modules already split the backward
# (`backward_input` and `backward_weight`), so a schedule can name them apart.
#
# **ZB-H1** keeps 1F1B's order of forwards and B's; rank $r$ holds back $r$ of its W's
# and runs them where 1F1B's rank would wait for gradients. The backward chain now carries
# only B, so each rank idles $(p-1)(t_f + t_b - t_w)$ instead of $(p-1)(t_f + t_b + t_w)$:
# a third, when the three are equal. That holds while a W takes no longer than a forward
# or a B (`pipeline_bubble(p, m, schedule="zb_h1", costs=(t_f, t_b, t_w))` refuses other
# costs: a longer W delays the forward queued behind it).
#
# **Exercise 3.3** — ZB-H1 from your 1F1B. Return the schedule for `p` ranks and `m`
# micro-batches: your 1F1B's forwards and backwards in their order (each `B` now only the
# input gradient) and an `Action("W", i)` for every micro-batch, deferred as ZB-H1 does.
# The check validates it on several shapes ($m < p$ included), plays it with four F:B:W
# costs against the formula, counts the micro-batches each rank holds until their W (at
# most $\min(p, m)$), and runs it once on the emulator.

# %%
def zb_h1(p, m):
    ### BEGIN SOLUTION: Exercise 3.3: zero bubble (ZB-H1) from 1F1B
    out = []
    for r, acts in enumerate(one_f_one_b(p, m)):
        new, waiting = [], []
        for a in acts:
            new.append(a)
            if a.kind == "B":
                waiting.append(a.microbatch)
                if len(waiting) > r:  # rank r keeps r of them for the gaps at the end
                    new.append(Action("W", waiting.pop(0)))
        out.append(new + [Action("W", i) for i in waiting])
    return out
    ### END SOLUTION


# %% tags=["check"]
grade.check_zb_h1(zb_h1)

# %% [markdown]
# The library's ZB-H1 against 1F1B, $p = 4$, $m = 8$:

# %%
print(pp.format_schedule(pp.schedule("zb_h1", 4, 8)))
fig, axes = plt.subplots(2, 1, figsize=(9, 4.4))
results = {}
for ax, name in zip(axes, ("1f1b", "zb_h1")):
    results[name] = run(name, 4, 8)
    viz.gantt(results[name].world.timeline(), ax=ax, colors=ACTION_COLORS, label_events=False,
              title=f"{name}, p=4, m=8: measured bubble {results[name].bubble:.1%}, "
                    f"formula {pipeline_bubble(4, 8, schedule=name):.1%}")
plt.show()
for name, r in results.items():
    print(f"{name:6s} micro-batches held at the peak per rank: {pp.in_flight(pp.schedule(name, 4, 8))}, "
          f"peak activation bytes: {[led.peak_by_kind['activations'] for led in r.world.memory]}")

# %% [markdown]
# 11% instead of 27%, for the same peak count of micro-batches as 1F1B's first stage: ZB-H1
# holds $p$ on every rank (1F1B's rank 0 already does), and more bytes for each, because
# what B computes for W waits with it: the gradients at the outputs of the weight matrix
# multiplies (13% more than 1F1B on rank 0 here). Further along the same road:
#
# * **ZB-H2** lets ranks warm up with more forwards, trading memory for a bubble close
#   to zero.
# * **ZB-V** gives each rank two chunks placed in a V (rank 0 holds the first and the
#   last), so that the last stage's gradient turns around on the same GPU; with equal F,
#   B and W it reaches zero bubble at 1F1B's memory.
# * **DualPipe** (DeepSeek-V3 technical report, section 3.2.1) interleaves too, but it is a
#   different schedule from section 6's interleaved 1F1B. Micro-batches enter from both ends of the pipeline at once: rank
#   $r$ holds stage $r$ of one direction and stage $p - 1 - r$ of the other, so twice
#   a 1F1B stage's parameters. Each rank runs the forward chunk of one micro-batch
#   overlapped with the backward chunk of another, so that expert parallelism's
#   all-to-all (lesson 05) and the pipeline's sends hide under compute, and it splits
#   B and W as ZB does. The comparison table of the `deepseek-ai/DualPipe` README
#   gives its bubble as $(p/2 - 1)(F\&B + B - 3W)$ against ZB-H1's
#   $(p-1)(F + B - 2W)$ (there $B$ is the whole backward and $F\&B$ an overlapped pair),
#   with $p + 1$ micro-batches of activations per rank.
#
# ## 8. Traffic, and where pipelines go
#
# A cut carries $b \cdot s \cdot h$ activations per micro-batch, point to point, once
# forward and once backward. Tensor parallelism moves $8\,bsh\,\frac{t-1}{t}$ per layer,
# forward and backward, in blocking all-reduces (lesson 02). For Problem 8.3's shapes
# ($b=4$, $s=8192$, $h=8192$, bf16, $t=8$), like with like (both ways):

# %%
cut, tp_layer = 2 * pp_bytes_per_boundary(4, 8192, 8192), tp_bytes_per_layer(4, 8192, 8192, 8)
print(f"PP: {cut / 1e9:.2f} GB per micro-batch per cut, forward and backward; TP: {tp_layer / 1e9:.2f} GB per "
      f"layer, every layer: {tp_layer / cut:.1f}x per layer, {tp_layer / cut:.1f}k x for a stage of k layers")
r = run("1f1b", 4, 8)
sizes = sorted({c.nbytes for calls in r.world.calls for c in calls if c.op == "send"})
print(f"measured here: message sizes {sizes} bytes; b s h x 4 bytes = "
      f"{pp_bytes_per_boundary(8, 16, 32, dtype_bytes=4):.0f} (8 sequences of 16 tokens, width 32, float32)")

# %% [markdown]
# Few bytes, rarely, and not blocking every layer: pipelines tolerate slow links. Put the
# same 8-stage pipeline on one node of 8 GPUs and on two nodes of 4 (the cut between
# stage 3 and 4 then crosses InfiniBand). Now the compute is charged from FLOPs and the
# messages from the network. Our model is tiny, so the GPU is slowed down here until a
# stage computes about 50 times as long as its message takes to cross a NIC, the ratio of
# a real model (a 10-layer stage of width 8192 at $s = 4096$ computes for ~67 ms; its
# 64 MB of activations cross a 48 GB/s NIC in ~1.4 ms).

# %%
stage_flops = 2 * deep.blocks[0].flops((8, 16, 32))["forward"]  # 16 blocks on 8 stages, micro-batches of 8
message_time = Topology().nic.time(pp_bytes_per_boundary(8, 16, 32, dtype_bytes=4))
rate = stage_flops / (50 * message_time)
steps = {}
for label, gpn in (("one node of 8", 8), ("two nodes of 4", 4)):
    world = World(8, topology=Topology(gpus_per_node=gpn, flops=rate))
    pp.run(world, deep, deep_params, pp.schedule("1f1b", 8, 8), x, y)
    steps[label] = world.timeline()
    print(f"{label:15s}: step {steps[label].makespan * 1e3:.2f} ms")
print(f"crossing nodes costs {steps['two nodes of 4'].makespan / steps['one node of 8'].makespan - 1:.1%} more")
viz.gantt(steps["two nodes of 4"].of_ranks(range(2, 6)), colors=ACTION_COLORS, label_events=False,
          streams=("comm world",), title="1F1B over two nodes (ranks 2-5; the cut 3 -> 4 crosses nodes)")
plt.show()

# %% [markdown]
# (Each orange bar is one batch, one NCCL kernel on the pipeline group's stream: it holds
# the stream from its launch, waiting for the neighbour's batch, until its transfers are
# done, as a profiler shows NCCL's kernels.) A fraction of a percent: one cut of seven
# crosses the NIC, once per micro-batch each way, and its messages are small beside the
# stages' compute. Compare lesson 02's 1.4x for
# tensor parallelism across nodes with a NIC per GPU. Hence the usual layout: tensor parallelism inside a node, pipeline stages
# across nodes, data parallelism over what is left.
#
# ## 9. Pipeline and data parallelism together
#
# With a mesh of `dp` x `pp` ranks, each data-parallel replica is a whole pipeline that
# runs its slice of the batch. Stage $r$ of every replica holds the same layers, so once
# its last backward of the step is done it averages its gradients over its `dp` group
# (the ranks with the same pipeline coordinate), then steps its optimizer.
#
# **Exercise 3.4** — `sync(dp, grads)`: `grads` is this stage's `{"layer.key": array}`;
# return the average over the data-parallel group `dp` (a group comm: `dp.size`,
# `dp.all_reduce`). The check trains with it for two steps on three meshes and compares
# every parameter with one device.

# %%
def sync_dp_grads(dp, grads):
    ### BEGIN SOLUTION: Exercise 3.4: the data-parallel average of a stage's gradients
    keys = sorted(grads)
    flat = dp.all_reduce(np.concatenate([grads[k].ravel() for k in keys])) / dp.size  # one bucket
    out, i = {}, 0
    for k in keys:
        out[k] = flat[i:i + grads[k].size].reshape(grads[k].shape)
        i += grads[k].size
    return out
    ### END SOLUTION


# %% tags=["check"]
grade.check_dp_sync(sync_dp_grads)

# %% [markdown]
# Three steps of training on a 2 x 4 mesh (two replicas of a 4-stage 1F1B pipeline, the
# library's average, `pp.sync_dp_grads`), against the same model trained on one device:

# %%
model64 = nn.GPT(vocab=64, d_model=32, n_heads=4, d_ff=128, n_layers=8, max_seq=16, dtype=np.float64)
params64 = model64.init(np.random.default_rng(0))
batches = synthetic_batches(3, 16, 16, 64, seed=2)
ref, ref_losses = train_single(model64, dict(params64), batches, nn.AdamW(lr=1e-2))
world = World(mesh={"dp": 2, "pp": 4})
s = pp.schedule("1f1b", 4, 4)
out = world.run(lambda comm: pp.train_pipeline(comm, model64, params64, batches, s, nn.AdamW(lr=1e-2),
                                               sync=pp.sync_dp_grads, costs=COSTS))
trained = {k: a for stage_params, _ in out for k, a in stage_params.items()}
print(f"largest difference from one device after 3 steps: {max(np.abs(trained[k] - ref[k]).max() for k in ref):.1e}")
tl = world.timeline()
viz.gantt(tl, label_events=False, colors=ACTION_COLORS, streams=(),
          title="dp 2 x pp 4 (1F1B, m=4), three steps: ranks 0-3 and 4-7 are the two replicas")
plt.show()
for r in range(4):
    ar = min((e for e in tl.events if e.rank == r and e.group == "dp"), key=lambda e: e.start)  # step 1's
    last_b = max(e.end for e in tl.of(r, "compute", "compute") if e.name.startswith("B") and e.end <= ar.start)
    print(f"rank {r}: last backward of step 1 ends at {last_b * 1e3:.2f} ms; its dp all-reduce runs "
          f"{ar.start * 1e3:.2f}-{ar.end * 1e3:.3f} ms, with rank {r + 4}")


# %% [markdown]
# ## 10. Explore
#
# Pick a schedule, stages, micro-batches, chunks and the cost of F, B and W: the widget
# runs one step on the emulator and shows the Gantt chart, the measured bubble beside the
# formula, and how many micro-batches each stage held at its peak. Try ZB-H1 with
# F:B:W = 1:2:0 (nothing to defer), and interleaving with m = p.

# %% tags=["nbval-ignore-output"]
from emulator.widgets import ScheduleExplorer

ScheduleExplorer("zb_h1", p=4, m=8)

# %% [markdown]
# ## 11. On real GPUs
#
# `gpu_labs/03_pipeline.py` cuts the same kind of model into p stages over
# `torch.distributed`: a 1F1B executor of its own with `batch_isend_irecv`, checked
# against a single-process run (loss and gradients), then the same model under
# `torch.distributed.pipelining` (`PipelineStage` with `ScheduleGPipe`, `Schedule1F1B` and
# `ScheduleInterleaved1F1B`), all agreeing. It measures the bubble from per-stage
# timestamps beside the emulator's prediction and records the calls, which a test compares
# with the emulator's:
#
# ```
# torchrun --standalone --nproc-per-node 4 -m gpu_labs.03_pipeline
# ```
#
# **Next:** lesson 04 splits the sequence itself: context parallelism and ring attention.
