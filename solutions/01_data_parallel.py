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
# Then you write three of them yourself, as per-rank programs: DDP with its all-reduce
# overlapped with backward (Exercise 1.1), ZeRO-2 (1.2), ZeRO-3 with prefetching (1.3),
# and answer Problem 8.1.

# %%
import numpy as np
import matplotlib.pyplot as plt
from ml_dtypes import bfloat16

from emulator import World, Topology, nn, viz
from emulator.parallel import assemble, data_parallel
from emulator.parallel.data_parallel.strategy import DataParallelStrategy
from emulator.accounting import zero_bytes_per_gpu, zero_traffic_per_gpu
from emulator.accounting.batch_size import critical_batch_sweep
from emulator.parallel.data_parallel.flat_layout import FlatLayout
from emulator.training import synthetic_batches, train, train_single
from emulator.records.memory import nbytes_of
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
alone, sharded = zero_bytes_per_gpu(7e9, 1, 0), zero_bytes_per_gpu(7e9, 8, 3)
print(f"a 7B model: {alone / 1e9:.0f} GB of training state on one GPU, more than its 80 GB; under FSDP (ZeRO-3) "
      f"over 8 GPUs, {sharded / 1e9:.0f} GB each: it fits, with {80 - sharded / 1e9:.0f} GB left for activations")

# %% [markdown]
# Explore the formula: model size, number of GPUs, stage, optimizer bytes $K$. The dashed
# line is one 80 GB GPU (and activations still need room on top).

# %% tags=["nbval-ignore-output"]
from emulator.widgets import ZeroExplorer

ZeroExplorer(n_params=7.5e9, dp_size=64, zero_stage=0)

# %% [markdown]
# ## 3. Every variant, trained and measured
#
# `emulator.parallel` implements the four variants as small strategies side by side (one
# file each: `ddp.py`, `zero1.py`, `zero2.py`, `zero3.py`). A strategy plugs into one
# training loop, `emulator.training.train`, through per-layer hooks: where a layer's
# parameters come from before its forward and its backward, and where its gradients go
# when backward has produced them. Each variant trains a small GPT for a few steps on 4
# emulated GPUs, first in float64, to check the claim that matters most: **the parallel
# run ends with the same parameters as one device training on the whole global batch.**

# %%
small = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16, dtype=np.float64)
p0 = small.init(np.random.default_rng(0))
batches = synthetic_batches(steps=4, batch=8, seq=16, vocab=16, seed=1)
adamw = nn.AdamW(lr=1e-2)
reference, ref_losses = train_single(small, p0, batches, adamw)
n, steps = 4, len(batches)
psi = sum(v.size for v in p0.values())
print(f"psi = {psi:,d} parameters, {n} ranks, {steps} steps; single-device losses {np.round(ref_losses, 4)}")
print(f"{'zero_stage':>10} {'max |param - single|':>21} {'sent/rank/step':>15} {'formula':>10}")
sent = {}
for zero_stage in range(4):
    world = World(n)
    out = world.run(lambda comm: train(comm, small, data_parallel(zero_stage, comm, small, p0, adamw), batches))
    final = out[0].params if zero_stage < 3 else assemble(small, p0, [o.shards for o in out])
    err = max(np.abs(final[k] - reference[k]).max() for k in reference)
    sent[zero_stage] = np.mean(world.stats().bytes_sent) / steps
    print(f"{zero_stage:>10} {err:>21.1e} {sent[zero_stage]:>13,.0f} B "
          f"{zero_traffic_per_gpu(psi, n, zero_stage, 8):>10,.0f}")
    assert err < 1e-10
print(f"ZeRO-3 sends {sent[3] / sent[0]:.2f}x what DDP sends; ZeRO-1 and ZeRO-2 send {sent[1] / sent[0]:.2f}x")

# %% [markdown]
# The parameters agree to about $10^{-14}$ (the tolerance we hold them to is $10^{-10}$):
# the only difference is the order in which floating-point sums are added. The bytes sent
# per rank are exactly $2\cdot\frac{N-1}{N}\Psi$ (8-byte floats) for DDP, ZeRO-1 and ZeRO-2,
# and $3\cdot\frac{N-1}{N}\Psi$ for ZeRO-3.
#
# ## 4. The whole memory picture
#
# Now with real mixed precision: bf16 parameters and gradients, fp32 master weights and
# moments (computation runs in fp32: the bf16 weights are upcast when used). Each rank's
# ledger records the real `nbytes` of what it holds, when it holds it, on the simulated
# clock. *Before you look*: which of the five kinds (parameters, gradients, optimizer
# state, activations, temporary buffers) will shrink from DDP to ZeRO-3, and which will
# not move at all?
#
# Below, rank 0's memory over one training step, stacked by kind, for each variant. The
# compute is charged on a slow device (30 GFLOP/s) so that this tiny model's forward and
# backward take visible time. The triangle marks the true peak; the legend gives what was
# held *at that moment*.

# %%
mixed = nn.GPT(vocab=16, d_model=32, n_heads=2, d_ff=64, n_layers=2, max_seq=16)
pm = {k: v.astype(bfloat16) for k, v in mixed.init(np.random.default_rng(0)).items()}
adamw_mp = nn.AdamW(lr=1e-2, mixed_precision=True)
psi = sum(v.size for v in pm.values())
slow = Topology(gpus_per_node=8, flops=3e10)
fig, axes = plt.subplots(4, 1, figsize=(8.5, 9))
peaks = {}
for zero_stage, ax in enumerate(axes):
    world = World(n, topology=slow)
    world.run(lambda comm: train(comm, mixed, data_parallel(zero_stage, comm, mixed, pm, adamw_mp), batches[:1]))
    led = world.memory[0]
    peaks[zero_stage] = led
    f = zero_bytes_per_gpu(psi, n, zero_stage)
    assert (led.peak_by_kind["params"], led.peak_by_kind["grads"], led.peak_by_kind["optimizer"]) == \
        (f.params, f.grads, f.optimizer)
    viz.memory_over_time(led, ax=ax, title=f"{['DDP', 'ZeRO-1', 'ZeRO-2', 'ZeRO-3'][zero_stage]} on {n} ranks, "
                                            f"rank 0 (psi = {psi:,d})")
plt.show()
print(f"{'':8s} {'peak':>9s} {'params':>8s} {'grads':>8s} {'optimizer':>9s} {'activations':>11s} {'buffers':>8s}  "
      f"(bytes held at the peak)  | formula: params grads optimizer (each kind's own peak)")
for zero_stage, led in peaks.items():
    at = led.peak_breakdown
    f = zero_bytes_per_gpu(psi, n, zero_stage)
    print(f"ZeRO-{zero_stage} {led.peak:>9,d} {at['params']:>8,d} {at['grads']:>8,d} {at['optimizer']:>9,d} "
          f"{at['activations']:>11,d} {at['buffers']:>8,d}  | {f.params:>8,.0f} {f.grads:>8,.0f} {f.optimizer:>8,.0f}")

# %% [markdown]
# Three things to read off the pictures.
#
# * Each kind's own peak equals the formula exactly (the cell asserts it): parameters,
#   gradients and optimizer state shrink rung by rung, as the table of section 2 says.
# * **Activations do not move.** The purple hump is the same in all four: every rank keeps
#   what its slice of the batch produced in forward until backward uses it, whatever ZeRO
#   does with the weights. For this small model and batch it is the largest thing held,
#   and it sets the peak, which comes at the end of forward, before any gradient exists.
#   Lessons 02 and 03 go after activations.
# * The temporaries (`buffers`) are ZeRO's price: ZeRO-2's full gradient of the current
#   layer between backward and its reduce-scatter, ZeRO-3's gathered layer.
#
# ## 5. Communication in time: overlap
#
# DDP does not wait for backward to finish before reducing: backward produces gradients
# last layer first, and DDP all-reduces them in *buckets*, each launched as soon as its
# last gradient exists, on the communication stream, while backward carries on. How big
# should a bucket be? Predict, then look: a tiny bucket per tensor, one per layer, or one
# bucket for the whole model.
#
# The model here is a deeper one (8 blocks), the compute charged at 1 TFLOP/s so that
# compute and communication are of a size, and the two ranks sit on two nodes, so the
# reductions cross a NIC.

# %%
deep = nn.GPT(vocab=16, d_model=64, n_heads=4, d_ff=256, n_layers=8, max_seq=16)
pd = deep.init(np.random.default_rng(0))
two_nodes = Topology(gpus_per_node=1, flops=1e12)
sizes = {1: "a bucket per tensor", 20_000: "20 kB buckets", 100_000: "100 kB buckets",
         None: "a bucket per layer", 1_000_000: "1 MB buckets", 10**9: "one bucket"}
step_time, calls = {}, {}
fig, axes = plt.subplots(3, 1, figsize=(9, 5.4))
shown = iter(axes)
for bucket, label in sizes.items():
    world = World(2, topology=two_nodes)
    world.run(lambda comm: train(comm, deep, data_parallel(0, comm, deep, pd, adamw, bucket_bytes=bucket),
                                 batches[:1]))
    step_time[bucket] = max(world.stats().time)
    calls[bucket] = len(world.calls[0])
    if bucket in (1, None, 10**9):
        viz.gantt(world, ax=next(shown), title=f"DDP, {label}: {calls[bucket]} all-reduces, "
                                               f"step {step_time[bucket] * 1e3:.2f} ms", label_events=False)
plt.show()
for bucket, label in sizes.items():
    print(f"{label:>20s}: {calls[bucket]:3d} all-reduces, step {step_time[bucket] * 1e3:.3f} ms")

# %% [markdown]
# A bucket per tensor makes many small all-reduces, each paying the network's latency
# ($2(n-1)\alpha$ per call, whatever its size), one after the other on the stream. One
# bucket for the whole model pays the latency once, but it cannot start before the last
# gradient exists: nothing overlaps backward. In between, buckets of a layer or a few
# hundred kB hide most of the reduction under backward. (PyTorch's DDP uses 25 MB buckets
# by default, sized for real models.)
#
# ZeRO-3 has the same question for its gathers. Before a layer computes, its parameters
# must be all-gathered; done naively, every layer waits for its gather. The order of the
# layers is known, so the gather of the next layer can start while this one computes
# (*prefetch*).

# %%
fig, axes = plt.subplots(2, 1, figsize=(9, 4.6))
for ax, prefetch in zip(axes, (False, True)):
    world = World(2, topology=Topology(gpus_per_node=8, flops=3e11))
    world.run(lambda comm: train(comm, mixed, data_parallel(3, comm, mixed, pm, adamw_mp, prefetch=prefetch),
                                 batches[:1]))
    title = f"ZeRO-3 {'with' if prefetch else 'without'} prefetch: step takes {max(world.stats().time) * 1e6:.1f} us"
    viz.gantt(world, ax=ax, title=title, label_events=False, unit="us")
plt.show()

# %% [markdown]
# With prefetch, the gathers of forward sit under the compute instead of between it, and
# the step is shorter. What idles the GPU that remains is in backward: each layer's
# gradient is reduce-scattered *synchronously* before the next layer's backward (and the
# optimizer needs every slice at the end), so those reduce-scatters sit between the
# blue blocks. An implementation can issue them asynchronously too, as PyTorch's FSDP does
# with its own stream, at the price of holding the full gradient a little longer.
#
# ## 6. Bridges to the next lessons: accumulation and recomputation
#
# **Gradient accumulation.** A global batch too large for the GPUs' memory is cut into
# micro-batches, run one after another, their gradients added up before one update. DDP
# can wait: it accumulates locally and reduces only with the last micro-batch
# (`no_sync`). ZeRO-2 and ZeRO-3 cannot: they never hold a full gradient, so every
# micro-batch's gradient must be reduce-scattered as it appears. Measured, for 2
# micro-batches per step:

# %%
print(f"{'':8s} {'calls':>6s} {'bytes sent per rank':>20s}   (one step, 2 micro-batches, 4 ranks)")
for zero_stage in range(4):
    for micro in (1, 2):
        world = World(n)
        world.run(lambda comm: train(comm, small, data_parallel(zero_stage, comm, small, p0, adamw), batches[:1],
                                     micro_batches=micro))
        if micro == 2:
            print(f"ZeRO-{zero_stage}  {len(world.calls[0]):6d} {world.stats().bytes_sent[0]:>18,d} B   "
                  f"({world.stats().bytes_sent[0] / base:.2f}x one micro-batch)")
        base = world.stats().bytes_sent[0]

# %% [markdown]
# **Activation recomputation.** Activations were the largest thing held in section 4, and
# ZeRO does not touch them. Keep only each layer's *input* in forward, and run the layer's
# forward again in backward just before its backward: memory for compute.

# %%
for recompute in (False, True):
    world = World(2, topology=slow)
    world.run(lambda comm: train(comm, mixed, data_parallel(0, comm, mixed, pm, adamw_mp), batches[:1],
                                 recompute=recompute))
    led = world.memory[0]
    busy = world.timeline().total("compute", rank=0)
    print(f"recompute={recompute!s:5s}: peak activations {led.peak_by_kind['activations']:>7,d} B, "
          f"compute {busy * 1e6:6.1f} us")

# %% [markdown]
# Recomputing costs one more forward: 4/3 of the compute (forward 1, backward 2, the
# forward again 1), and the activations shrink to one input per layer (and the loss's
# gradient of the logits, which the loss keeps from its forward until backward begins).
# Lesson 02 splits the activations themselves across GPUs, and counts them term by term.
#
# ## 7. Batch size is a resource
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
# ## 8. Build it yourself
#
# A strategy is a class with per-layer hooks, called by `emulator.training.train` on every
# rank (look at `emulator/parallel/ddp.py` only after you are done). What you have in one:
#
# * `self.comm`: the data-parallel group (`rank`, `size`, collectives); `self.memory`: this
#   rank's ledger (`hold(name, obj, kind)`, `release(name)`);
# * `self.names`: the layers in forward order; `self.full[name]`: a layer's full parameters
#   (a dict of arrays) when this rank holds them; `self.params()`: all of them as
#   `{"layer.key": array}`; `self.hold_full_params()` records `self.full` in the ledger;
# * `self.layouts[name]`: the layer's flat layout (`flatten(dict)` to a padded flat vector,
#   `unflatten(flat)`, `padded` elements, a multiple of the group size);
#   `self.my_slice(name, flat)`: this rank's slice of a layer's flat vector;
# * `self.opt`: AdamW; `opt.step(params, grads, state)` returns `(new params, state)` and
#   works on any dict, so a slice `{"flat": my_slice}` with its own state is fine.
#
# The hooks, in the order `train` calls them: `params_for_forward(name, upcoming)` (return
# the layer's parameters; `upcoming` is the layer that runs next), `after_forward(name)`,
# `params_for_backward(name, upcoming)`, `grads_ready(name, grads, last)` (backward has
# produced this layer's gradients, a dict like its parameters), and `step()` once the
# whole batch is done. The base class serves `self.full` to the first three.
#
# **Exercise 1.1** — DDP. Every rank keeps everything. As soon as backward produces a
# layer's gradients, flatten them into one array (the layer is the bucket), hold it in the
# ledger as `"grads"`, and start its all-reduce **asynchronously** (`async_op=True`), so it
# travels while backward goes on. In `step`, wait for every reduction, divide by the group
# size, update every parameter, and free the gradients.

# %%
class MyDDP(DataParallelStrategy):
    zero_stage = 0

    def __init__(self, comm, model, params, opt):
        super().__init__(comm, model, params, opt)
        self.hold_full_params()
        self.state = opt.init(params)
        self.memory.hold("optimizer", self.state, "optimizer")
        self.pending = {}  # layer -> handle of its gradients' all-reduce

    def grads_ready(self, name, grads, last):
        ### BEGIN SOLUTION: Exercise 1.1: DDP, each layer reduced while backward goes on
        flat = np.concatenate([grads[k].reshape(-1) for k in self.layouts[name].names])
        self.memory.hold(f"grads:{name}", flat, "grads")
        self.pending[name] = self.comm.all_reduce(flat, async_op=True)
        ### END SOLUTION

    def step(self):
        ### BEGIN SOLUTION: Exercise 1.1: DDP, wait, average, update
        mean = {}
        for name, handle in self.pending.items():
            grads = self.layouts[name].unflatten(handle.wait() / self.comm.size)
            mean.update({f"{name}.{k}": g for k, g in grads.items()})
            self.memory.release(f"grads:{name}")
        self.pending = {}
        new, self.state = self.opt.step(self.params(), mean, self.state)
        self.full = {name: {k: new[f"{name}.{k}"] for k in self.full[name]} for name in self.names}
        self.hold_full_params()
        ### END SOLUTION


# %% tags=["check"]
grade.check_ddp(MyDDP)


# %% [markdown]
# **Exercise 1.2** — ZeRO-2. Every rank keeps the full parameters, but of the gradients
# and the optimizer state only its own slice of every layer. As backward produces a
# layer's gradients, reduce-scatter the layer's flat (padded) gradient, keep the *mean*
# gradient of your slice (held as `"grads"`), and free the full one: hold it as
# `"buffers"` while it exists. In `step`, update each layer's slice with its optimizer
# state and all-gather the updated slices into the full parameters.

# %%
class MyZeRO2(DataParallelStrategy):
    zero_stage = 2

    def __init__(self, comm, model, params, opt):
        super().__init__(comm, model, params, opt)
        self.hold_full_params()
        self.state = self.sharded_optimizer(self.slices_of_full())  # optimizer state of my slice of each layer
        self.grad_slices = {}  # layer -> the mean gradient of my slice

    def grads_ready(self, name, grads, last):
        ### BEGIN SOLUTION: Exercise 1.2: ZeRO-2, reduce-scatter as backward goes
        flat = self.memory.hold(f"fullgrad:{name}", self.layouts[name].flatten(grads), "buffers")
        self.grad_slices[name] = self.comm.reduce_scatter(flat) / self.comm.size
        self.memory.release(f"fullgrad:{name}")
        self.memory.hold(f"grads:{name}", self.grad_slices[name], "grads")
        ### END SOLUTION

    def step(self):
        ### BEGIN SOLUTION: Exercise 1.2: ZeRO-2, update my slices, gather the parameters
        for name in self.names:
            mine = self.my_slice(name, self.layouts[name].flatten(self.full[name]))
            new, self.state[name] = self.opt.step({"flat": mine}, {"flat": self.grad_slices.pop(name)},
                                                  self.state[name])
            self.memory.release(f"grads:{name}")
            self.full[name] = self.layouts[name].unflatten(self.comm.all_gather(new["flat"]))
        self.hold_full_params()
        ### END SOLUTION


# %% tags=["check"]
grade.check_zero2(MyZeRO2)


# %% [markdown]
# **Exercise 1.3** — ZeRO-3, with prefetching. No rank holds the model: `self.my[name]` is
# this rank's slice of each layer. Before a layer's forward, all-gather its slices into
# the full (padded) flat vector, hold it as `"buffers"` while the layer uses it, and free
# it after; gather again for backward. Prefetch: start the gather of `upcoming`
# asynchronously before returning this layer's parameters, and wait for it when its turn
# comes. In `grads_ready`, free the gathered layer, reduce-scatter the gradient and keep
# your slice's mean; `step` updates your slices. The check uses layers whose sizes do not
# divide by the group size: the layout's padding takes care of it, if you use it.

# %%
class MyZeRO3(DataParallelStrategy):
    zero_stage = 3

    def __init__(self, comm, model, params, opt):
        super().__init__(comm, model, params, opt)
        self.my = self.slices_of_full()  # my slice of every layer
        self.full = None  # no rank keeps the full parameters
        self.memory.hold("params", self.my, "params")
        self.state = self.sharded_optimizer(self.my)
        self.grad_slices = {}
        self.pending = {}  # layer -> handle of a gather started early

    def params_for_forward(self, name, upcoming):
        ### BEGIN SOLUTION: Exercise 1.3: ZeRO-3 gather with prefetch
        return self._gather(name, upcoming)
        ### END SOLUTION

    def after_forward(self, name):
        ### BEGIN SOLUTION: Exercise 1.3: ZeRO-3 free after forward
        self.memory.release(f"gathered:{name}")
        ### END SOLUTION

    def params_for_backward(self, name, upcoming):
        ### BEGIN SOLUTION: Exercise 1.3: ZeRO-3 gather again for backward
        return self._gather(name, upcoming)
        ### END SOLUTION

    def grads_ready(self, name, grads, last):
        ### BEGIN SOLUTION: Exercise 1.3: ZeRO-3 free, reduce-scatter, keep my slice
        self.memory.release(f"gathered:{name}")
        flat = self.memory.hold(f"fullgrad:{name}", self.layouts[name].flatten(grads), "buffers")
        self.grad_slices[name] = self.comm.reduce_scatter(flat) / self.comm.size
        self.memory.release(f"fullgrad:{name}")
        self.memory.hold(f"grads:{name}", self.grad_slices[name], "grads")
        ### END SOLUTION

    def step(self):
        ### BEGIN SOLUTION: Exercise 1.3: ZeRO-3 update my slices
        for name in self.names:
            new, self.state[name] = self.opt.step({"flat": self.my[name]}, {"flat": self.grad_slices.pop(name)},
                                                  self.state[name])
            self.memory.release(f"grads:{name}")
            self.my[name] = new["flat"]
        self.memory.release("params")
        self.memory.hold("params", self.my, "params")
        ### END SOLUTION

    def _gather(self, name, upcoming):
        ### BEGIN SOLUTION: Exercise 1.3: ZeRO-3 all-gather, hold, prefetch the next
        handle = self.pending.pop(name, None) or self.comm.all_gather(self.my[name], async_op=True)
        if upcoming is not None and upcoming not in self.pending:
            self.pending[upcoming] = self.comm.all_gather(self.my[upcoming], async_op=True)
        full = self.memory.hold(f"gathered:{name}", handle.wait(), "buffers")
        return self.layouts[name].unflatten(full)
        ### END SOLUTION

    def shards(self):
        return dict(self.my)


# %% tags=["check"]
grade.check_zero3(MyZeRO3)


# %% [markdown]
# ## 9. Problem 8.1
#
# A model of `n_params` parameters trains with 16 bytes per parameter (bf16 parameters and
# gradients, fp32 master weights and both Adam moments) on `dp_size` GPUs. What does each
# GPU hold for parameters, gradients and optimizer state under DDP and ZeRO-1, 2, 3 (in GB,
# 1 GB = $10^9$ bytes)? Which fit in `gpu_gb`, ignoring activations? Return
# `({zero_stage: (params GB, grads GB, optimizer GB)}, [stages that fit])`. The check tries
# the problem's numbers (30B parameters, 16 GPUs, 80 GB) and others.

# %%
def problem_8_1(n_params=30e9, dp_size=16, gpu_gb=80):
    ### BEGIN SOLUTION: Problem 8.1: ZeRO memory per GPU
    p, g, k = 2 * n_params / 1e9, 2 * n_params / 1e9, 12 * n_params / 1e9
    d = dp_size
    parts = {0: (p, g, k), 1: (p, g, k / d), 2: (p, g / d, k / d), 3: (p / d, g / d, k / d)}
    return parts, [z for z, (a, b, c) in parts.items() if a + b + c <= gpu_gb]
    ### END SOLUTION


# %% tags=["check"]
grade.problem_8_1(problem_8_1)

# %% [markdown]
# The problem's numbers, from the library's formula (so they print whatever your answer):

# %%
fitting = []
for stage, name in enumerate(["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]):
    b = zero_bytes_per_gpu(30e9, 16, stage)
    fitting += [name] if b <= 80e9 else []
    print(f"{name:7s} {b / 1e9:6.1f} GB per GPU (params {b.params / 1e9:5.2f}, grads {b.grads / 1e9:5.2f}, optimizer "
          f"{b.optimizer / 1e9:5.2f}): {'fits' if b <= 80e9 else 'does not fit'} in 80 GB")
print("only " + fitting[0] + " fits" if len(fitting) == 1 else f"these fit: {fitting}")

# %% [markdown]
# ## 10. On real GPUs
#
# `gpu_labs/01_data_parallel.py` runs DDP and ZeRO-1, 2 and 3 written by hand in torch
# (`gpu_labs/torch_parallel/`), call for call the algorithms of `emulator.parallel` (a test
# compares the two traces), checks each against a single-process reference (same losses
# and parameters after a few steps) and against torch's own `DistributedDataParallel` and
# FSDP2 `fully_shard`, and prints each rank's memory and bytes communicated per step
# beside the emulator's prediction:
#
# ```
# torchrun --standalone --nproc-per-node 4 -m gpu_labs.01_data_parallel
# ```
#
# **Next:** lesson 02 splits the layers themselves: tensor and sequence parallelism.
