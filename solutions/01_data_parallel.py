# %% [markdown]
# # Lesson 01 — Data parallelism, from DDP to ZeRO-3
#
# The simplest way to use many GPUs: give each one a slice of the batch. Compute scales
# at once. Memory does not, and training state is far larger than the model. This
# lesson climbs the ZeRO ladder, sharding one more thing at each rung, trains a small GPT
# with each variant on emulated GPUs, and checks three things every time: the parameters
# equal single-device training, the memory each rank holds equals the formula, and the
# bytes each rank sends equal the formula.
#
# You will write the three core moves yourself: the DDP gradient all-reduce (Exercise
# 1.1), the ZeRO-1 update (1.2), and a ZeRO-3 layer forward that gathers, computes and
# frees (1.3), and answer Problem 8.1.

# %%
import numpy as np
import matplotlib.pyplot as plt
from ml_dtypes import bfloat16

from emulator import World, Topology, nn, viz
from emulator.parallel import assemble, data_parallel
from emulator.accounting import zero_bytes_per_gpu, zero_traffic_per_gpu
from emulator.batch_size import critical_batch_sweep
from emulator.sharding import FlatLayout
from emulator.training import synthetic_batches, train, train_single
from emulator.memory import nbytes_of
from emulator.grading import lesson01 as grade
from emulator.notebook import setup

setup()

# %% [markdown]
# ## 1. Naive data parallelism
#
# $N$ GPUs each hold the whole model. A global batch of $B$ examples is split $B/N$ per
# GPU; each computes the gradient of its slice; one **all-reduce** averages the gradients;
# every GPU applies the same update and stays identical. Per step each GPU sends
# $2(N-1)/N$ times the gradient bytes (lesson 00). Compute scales perfectly as long as
# every GPU has examples; memory does not scale at all: every GPU holds everything.
#
# And "everything" is a lot. With mixed-precision Adam each parameter costs 16 bytes:
# bf16 weights (2) and gradients (2), and an fp32 master copy plus two fp32 Adam moments
# (4 + 4 + 4 = 12, the optimizer's $K$). Here they are as real arrays, for a small GPT:

# %%
model = nn.GPT(vocab=32, d_model=64, n_heads=4, d_ff=256, n_layers=2, max_seq=32)
params = {k: v.astype(bfloat16) for k, v in model.init(np.random.default_rng(0)).items()}
grads = {k: np.zeros_like(v) for k, v in params.items()}
opt = nn.AdamW(lr=1e-3, mixed_precision=True)
state = opt.init(params)
psi = sum(v.size for v in params.values())
parts = {"params (bf16)": nbytes_of(params), "grads (bf16)": nbytes_of(grads),
         "master weights (fp32)": nbytes_of(state["master"]), "Adam m (fp32)": nbytes_of(state["m"]),
         "Adam v (fp32)": nbytes_of(state["v"])}
for name, b in parts.items():
    print(f"{name:22s} {b:>9,d} bytes = {b / psi:.0f} bytes/param")
print(f"{'total':22s} {sum(parts.values()):>9,d} bytes = {sum(parts.values()) / psi:.0f} bytes/param, psi = {psi:,d}")

# %% [markdown]
# The optimizer state is three quarters of it. At 7.5B parameters that is 120 GB per GPU
# before a single activation; no GPU holds it.
#
# ## 2. The ZeRO ladder
#
# ZeRO ("Zero Redundancy Optimizer") removes the copies one kind at a time, using the
# identity from lesson 00: an all-reduce *is* a reduce-scatter followed by an all-gather.
#
# | scheme | what is sharded | collectives per step | bytes sent per GPU | memory per GPU |
# |---|---|---|---|---|
# | DDP | nothing | all-reduce of gradients | $2\Psi$ params' worth | $(2+2+K)\Psi$ |
# | ZeRO-1 | optimizer state | reduce-scatter grads, all-gather params | $2\Psi$ | $2\Psi + 2\Psi + K\Psi/N$ |
# | ZeRO-2 | + gradients | reduce-scatter each layer's grads during backward, all-gather params | $2\Psi$ | $2\Psi + (2+K)\Psi/N$ |
# | ZeRO-3 (FSDP) | + parameters | all-gather each layer in forward, again in backward, reduce-scatter grads | $3\Psi$ | $(2+2+K)\Psi/N$ |
#
# (Bytes are in units of the parameter bytes, times $(N-1)/N$.)
#
# * **ZeRO-1**: every rank still computes the full gradient, but after a reduce-scatter it
#   only holds the *summed* gradient of its own slice, updates that slice with the
#   optimizer state only it keeps, and an all-gather hands everyone the new parameters.
#   Same bytes as DDP: the memory saving is free.
# * **ZeRO-2**: the full gradient is never kept: as backward produces a layer's gradient it
#   is reduce-scattered and dropped. Same bytes again.
# * **ZeRO-3 / FSDP**: no rank holds the model. Before a layer runs forward, its shards are
#   all-gathered; after, the full copy is freed; backward gathers it again. One more
#   all-gather: 3 instead of 2, so 1.5 times DDP's traffic.
#
# `emulator.accounting` holds the formulas; they reproduce the table for 7.5B parameters on
# 64 GPUs:

# %%
for stage, name in enumerate(["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]):
    b = zero_bytes_per_gpu(7.5e9, 64, stage)
    print(f"{name:7s} {b / 1e9:6.1f} GB per GPU  (params {b.params / 1e9:5.2f}, grads {b.grads / 1e9:5.2f}, "
          f"optimizer {b.optimizer / 1e9:5.2f})")

# %% [markdown]
# Explore the formula: model size, number of GPUs, stage, optimizer bytes $K$. The dashed
# line is one 80 GB GPU (and activations still need room on top).

# %%
# NBVAL_IGNORE_OUTPUT
from emulator.widgets import ZeroExplorer

ZeroExplorer(n_params=7.5e9, dp_size=64, zero_stage=0)

# %% [markdown]
# ## 3. Every variant, trained and measured
#
# `emulator.parallel` implements the four variants as small strategies side by side (one
# file each: `ddp.py`, `zero1.py`, `zero2.py`, `zero3.py`), which plug into one training
# loop (`emulator.training.train`) through per-layer hooks. Each trains a
# small GPT for a few steps on 4 emulated GPUs. First in float64, to check the claim that
# matters most: **the parallel run ends with the same parameters as one device training on
# the whole global batch.**

# %%
small = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16, dtype=np.float64)
p0 = small.init(np.random.default_rng(0))
batches = synthetic_batches(steps=4, batch=8, seq=16, vocab=16, seed=1)
adamw = nn.AdamW(lr=1e-2)
reference, ref_losses = train_single(small, p0, batches, adamw)
n, steps = 4, len(batches)
psi = sum(v.size for v in p0.values())
print(f"psi = {psi:,d} parameters, {n} ranks, {steps} steps; single-device losses {np.round(ref_losses, 4)}")
print(f"{'stage':>7} {'max |param - single|':>21} {'sent/rank/step':>15} {'formula':>10}")
sent = {}
for stage in range(4):
    world = World(n)
    out = world.run(lambda comm: train(comm, small, data_parallel(stage, comm, small, p0, adamw), batches))
    final = out[0].params if stage < 3 else assemble(small, p0, [o.shards for o in out])
    err = max(np.abs(final[k] - reference[k]).max() for k in reference)
    sent[stage] = np.mean(world.stats().bytes_sent) / steps
    print(f"{stage:>7} {err:>21.1e} {sent[stage]:>13,.0f} B {zero_traffic_per_gpu(psi, n, stage, 8):>10,.0f}")
    assert err < 1e-10
print(f"ZeRO-3 sends {sent[3] / sent[0]:.2f}x what DDP sends; ZeRO-1 and ZeRO-2 send {sent[1] / sent[0]:.2f}x")

# %% [markdown]
# The parameters agree to about $10^{-14}$ (the tolerance we hold them to is $10^{-10}$):
# the only difference is the order in which floating-point sums are added. The bytes sent
# per rank are exactly $2\cdot\frac{N-1}{N}\Psi$ (8-byte floats) for DDP, ZeRO-1 and ZeRO-2,
# and $3\cdot\frac{N-1}{N}\Psi$ for ZeRO-3.
#
# Now the memory, with real mixed precision: bf16 parameters and gradients, fp32 master
# weights and moments (computation runs in fp32: the bf16 weights are upcast when used).
# Each rank's ledger records the real `nbytes` of what it holds; here is rank 0's peak by
# kind, beside the formula. `buffers` are the temporaries: ZeRO-2's full-size gradient of
# the current layer, ZeRO-3's gathered layer.

# %%
mixed = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16)
pm = {k: v.astype(bfloat16) for k, v in mixed.init(np.random.default_rng(0)).items()}
adamw_mp = nn.AdamW(lr=1e-2, mixed_precision=True)
psi = sum(v.size for v in pm.values())
rows = []
for stage in range(4):
    world = World(n)
    out = world.run(lambda comm: train(comm, mixed, data_parallel(stage, comm, mixed, pm, adamw_mp), batches[:2]))
    rep = world.memory_report()[0]
    f = zero_bytes_per_gpu(psi, n, stage)
    rows.append([rep["peak_params"], rep["peak_grads"], rep["peak_optimizer"], rep["peak_buffers"],
                 rep["peak_activations"], f.params, f.grads, f.optimizer])
    print(f"stage {stage}: measured params {rows[-1][0]:>6,d} grads {rows[-1][1]:>6,d} optimizer {rows[-1][2]:>7,d} "
          f"buffers {rows[-1][3]:>6,d} | formula params {f.params:>6,.0f} grads {f.grads:>6,.0f} "
          f"optimizer {f.optimizer:>7,.0f}")
    assert rows[-1][:3] == [f.params, f.grads, f.optimizer]

fig, ax = plt.subplots(figsize=(7, 3))
kinds = ["params", "grads", "optimizer", "buffers"]
bottom = np.zeros(4)
for i, kind in enumerate(kinds):
    vals = np.array([r[i] for r in rows]) / 1e3
    ax.bar(range(4), vals, bottom=bottom, label=kind)
    bottom += vals
ax.scatter(range(4), [(r[5] + r[6] + r[7]) / 1e3 for r in rows], color="black", marker="_", s=600,
           label="formula (params+grads+optimizer)", zorder=3)
ax.set_xticks(range(4))
ax.set_xticklabels(["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"])
ax.set_ylabel("kB per rank (peak)")
ax.set_title(f"measured peak memory of rank 0, {psi:,d} parameters on {n} ranks")
ax.legend(fontsize=8)
plt.show()

# %% [markdown]
# ## 4. ZeRO-3 in time: prefetching the next layer
#
# ZeRO-3 must gather a layer before computing it. Done naively, every layer waits for its
# all-gather. Since the order of layers is known, the gather of layer $i+1$ can start
# (asynchronously, on the communication stream) while layer $i$ computes. The timeline
# below charges compute on a device about 3000 times slower than an H100 (0.3 TFLOP/s),
# so that this tiny model's layers take about as long as their gathers, as a large
# model's do on real GPUs.

# %%
slow = Topology(gpus_per_node=8, flops=3e11)
fig, axes = plt.subplots(2, 1, figsize=(9, 4.6))
for ax, prefetch in zip(axes, (False, True)):
    world = World(2, topology=slow)
    world.run(lambda comm: train(comm, mixed, data_parallel(3, comm, mixed, pm, adamw_mp, prefetch=prefetch),
                                 batches[:1]))
    title = f"ZeRO-3 {'with' if prefetch else 'without'} prefetch: step takes {max(world.stats().time) * 1e6:.1f} us"
    viz.gantt(world, ax=ax, title=title, label_events=False, unit="us")
plt.show()

# %% [markdown]
# With prefetch, the orange all-gathers sit under the blue compute instead of between
# them, and the step is shorter. (DDP does the same with its gradient all-reduce: each
# layer's bucket is reduced while backward carries on with earlier layers.)
#
# ## 5. Batch size is a resource
#
# Data parallelism divides the batch. So it can never use more GPUs than there are
# examples in a batch (a batch of 8 keeps at most 8 GPUs busy), and it spends batch size
# to buy parallelism. Can we just make the batch bigger? Only up to a point. Below the
# **critical batch size**, doubling the batch halves the steps to reach a given loss: the
# gradient was noisy, and more examples average the noise out. Above it, the gradient is
# already accurate, the steps stop falling, and the extra examples are wasted: an
# infinitely large batch is not as good as infinitely many steps.
#
# The first limit is plain arithmetic, and the emulator enforces it:

# %%
try:
    World(16).run(lambda comm: train(comm, small, data_parallel(0, comm, small, p0, adamw), batches[:1]))
except Exception as exc:  # the global batch has 8 examples
    print(f"{type(exc).__name__}: {str(exc).splitlines()[0]}")

# %% [markdown]
# The second limit is statistical. A small experiment: SGD on a noisy least-squares
# problem, best learning rate per batch size, counting steps (and examples) to reach the
# same loss.

# %%
sweep = critical_batch_sweep()
fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
a.loglog(sweep["batch"], sweep["steps"], "o-", label="measured")
a.loglog(sweep["batch"], sweep["s_min"] * (1 + sweep["b_crit"] / sweep["batch"]), "--",
         label="fit: S_min (1 + B_crit/B)")
a.set_xlabel("batch size B")
a.set_ylabel("steps to target")
a.legend(fontsize=8)
b.semilogx(sweep["batch"], sweep["examples"], "o-")
b.axvline(sweep["b_crit"], color="grey", ls=":")
b.text(sweep["b_crit"], b.get_ylim()[1] * 0.9, f" B_crit = {sweep['b_crit']:.0f}", fontsize=8)
b.set_xlabel("batch size B")
b.set_ylabel("examples to target (B x steps)")
fig.tight_layout()
plt.show()
print(f"critical batch size of this problem: about {sweep['b_crit']:.0f}; "
      f"at least {sweep['s_min']:.0f} steps whatever the batch")

# %% [markdown]
# Past about $B_\text{crit}$ the steps barely fall while the examples consumed climb: the
# extra GPUs compute gradients nobody needs. That is why data parallelism alone stops
# scaling, and why the later lessons split the model itself.
#
# Note also what ZeRO does *not* touch: activations. Every rank still stores the
# activations of its slice of the batch (the `activations` kind above); lessons 02 and 03
# attack those.
#
# ## 6. Build it yourself
#
# **Exercise 1.1** — DDP's gradient averaging. `grads` is this rank's dict of gradient
# arrays. Return the mean over all ranks, using **one** all-reduce: flatten every tensor
# into one bucket (`np.concatenate` of the raveled arrays), all-reduce it, divide by
# `comm.size`, and cut it back into the original shapes (sorted by name).

# %%
def ddp_average_gradients(comm, grads):
    ### BEGIN SOLUTION: Exercise 1.1: DDP gradient all-reduce
    names = sorted(grads)
    bucket = np.concatenate([grads[k].reshape(-1) for k in names])
    bucket = comm.all_reduce(bucket) / comm.size
    out, i = {}, 0
    for k in names:
        out[k] = bucket[i:i + grads[k].size].reshape(grads[k].shape)
        i += grads[k].size
    return out
    ### END SOLUTION


# %% tags=["check"]
grade.check_ddp_average_gradients(ddp_average_gradients)


# %% [markdown]
# **Exercise 1.2** — the ZeRO-1 step on one flat parameter vector. Every rank passes the
# same `flat_params`, its own `flat_grads` (length divisible by `comm.size`) and the
# optimizer `state` of **its slice only** (slice $r$ is elements $r\,s$ to $(r+1)\,s$ with
# $s$ = length / size). Reduce-scatter the gradients and divide by the size (the mean
# gradient of your slice), update your slice with `opt.step({"flat": slice}, {"flat":
# grad}, state)`, and all-gather the updated slices. Return `(full params, state)`.

# %%
def zero1_step(comm, flat_params, flat_grads, opt, state):
    ### BEGIN SOLUTION: Exercise 1.2: the ZeRO-1 step
    n, r = comm.size, comm.rank
    s = flat_params.shape[0] // n
    grad = comm.reduce_scatter(flat_grads) / n
    new, state = opt.step({"flat": flat_params[r * s:(r + 1) * s]}, {"flat": grad}, state)
    return comm.all_gather(new["flat"]), state
    ### END SOLUTION


# %% tags=["check"]
grade.check_zero1_step(zero1_step)


# %% [markdown]
# **Exercise 1.3** — a ZeRO-3 layer forward. This rank holds `shard`, its slice of the
# layer's flat parameters (`layout` is a `FlatLayout`: `layout.unflatten(full)` gives the
# dict of tensors). All-gather the shards, record the full copy in the ledger while you
# hold it (`comm.memory.hold("gathered", full, "buffers")`), run `layer.forward(params, x)`,
# release the full copy (`comm.memory.release("gathered")`), and return `(y, cache)`.

# %%
def zero3_layer_forward(comm, layer, layout, shard, x):
    ### BEGIN SOLUTION: Exercise 1.3: ZeRO-3 layer forward (gather, compute, free)
    full = comm.all_gather(shard)
    comm.memory.hold("gathered", full, "buffers")
    y, cache = layer.forward(layout.unflatten(full), x)
    comm.memory.release("gathered")
    return y, cache
    ### END SOLUTION


# %% tags=["check"]
grade.check_zero3_layer_forward(zero3_layer_forward)


# %% [markdown]
# ## 7. Problem 8.1
#
# A 30B-parameter model trains with 16 bytes per parameter (bf16 parameters and gradients,
# fp32 master weights and both Adam moments) on 16 GPUs. What does each GPU hold for
# parameters, gradients and optimizer state under DDP and ZeRO-1, 2, 3 (in GB, 1 GB =
# $10^9$ bytes)? Which fit in 80 GB, ignoring activations? Return a dict
# `{stage: GB}` and the list of stages that fit.

# %%
def problem_8_1():
    ### BEGIN SOLUTION: Problem 8.1: ZeRO memory for 30B parameters on 16 GPUs
    psi, n, k = 30e9, 16, 12
    gb = {0: (2 + 2 + k) * psi / 1e9,
          1: (2 * psi + 2 * psi + k * psi / n) / 1e9,
          2: (2 * psi + (2 + k) * psi / n) / 1e9,
          3: (2 + 2 + k) * psi / n / 1e9}
    return gb, [s for s in gb if gb[s] <= 80]
    ### END SOLUTION


# %% tags=["check"]
grade.problem_8_1(*problem_8_1())

# %% [markdown]
# ZeRO-2 misses by 6 GB; only full sharding fits, with 50 GB left for activations.
#
# ## 8. On real GPUs
#
# `gpu_labs/01_data_parallel.py` writes DDP and ZeRO-1, 2 and 3 by hand in torch on a
# small model, checks each against a single-process reference (same losses and
# parameters after a few steps) and against torch's own `DistributedDataParallel` and FSDP2
# `fully_shard`, and prints each rank's peak memory and bytes communicated per step beside
# the emulator's prediction:
#
# ```
# torchrun --standalone --nproc-per-node 4 gpu_labs/01_data_parallel.py
# ```
#
# **Next:** lesson 02 splits the layers themselves: tensor and sequence parallelism.
