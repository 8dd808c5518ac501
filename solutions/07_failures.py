# %% [markdown]
# # Lesson 07 — When GPUs fail
#
# Every lesson so far assumed the machine works. At the scale of the largest runs it does
# not, for long: one GPU in sixteen thousand misbehaving is enough to stop a synchronous
# job, and it happens every few hours. A training run then needs three things: to notice
# (the others are stuck in a collective that will never finish), to restart from a saved
# state without losing much work, and, when a node is gone for good, to go on with fewer
# GPUs on another mesh. This lesson builds all three on the emulator.
#
# You will find a straggler in a timeline (Exercise 7.1), read the block a rank needs from
# a checkpoint that another mesh saved (7.2), and choose how often to save (7.3); the
# napkins ask what a watchdog's wait costs (7.1) and what fraction of the time a job
# makes progress (7.2).

# %%
import json
import shutil
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Rectangle

from emulator import RankFailedError, RankFailure, Topology, World, nn, viz
from emulator.accounting import failures as F
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.parallel.checkpoint import Checkpoint, Checkpointing, Storage
from emulator.parallel.reshard import Chunk, overlap
from emulator.training import synthetic_batches
from emulator.grading import lesson07 as grade
from emulator.notebook import setup

setup()
work = Path(tempfile.mkdtemp(prefix="lesson07-"))  # this lesson's checkpoints (removed at the end)

# %% [markdown]
# ## 1. Failure is routine at scale
#
# Meta reported what interrupted the pretraining of Llama 3 405B on up to 16,384 H100 GPUs
# over a 54-day snapshot (Llama Team, "The Llama 3 Herd of Models", 2024, section 3.3.4):
# 466 interruptions, 47 of them planned (firmware upgrades, maintenance), 419 unexpected,
# whose root causes its Table 5 counts row by row (`failures.LLAMA3_TABLE5`):

# %%
by_cause, by_category = F.llama3_interruptions_by("component"), F.llama3_interruptions_by("category")
print(f"Table 5: {len(F.LLAMA3_TABLE5)} root causes, {sum(by_cause.values())} unexpected interruptions; the largest:")
for cause, n in list(by_cause.items())[:4]:
    print(f"  {cause:22s} {n:4d} ({n / sum(by_cause.values()):.1%} of them)")
print("by category: " + ", ".join(f"{c} {n}" for c, n in by_category.items()))
hardware = sum(by_category[c] for c in F.HARDWARE)
print(f"GPU, host and network faults: {hardware} of {sum(by_cause.values())} ({hardware / 419:.0%})")

# %% [markdown]
# Faulty GPUs caused 148 of the 419, their HBM3 memory 72 more, and GPU, host and network
# faults together 77% (the paper: "about 78%" confirmed or suspected hardware). The table
# itself prints 30.1% beside the 148, where 148 of 419 is 35.3%; every other row's
# percentage is its count over 419. Still, more than 90% of the time went to training.
# If GPUs fail independently, a job of $N$ GPUs fails $N$ times as often as one GPU does:

# %%
L = F.LLAMA3_INTERRUPTIONS
job = F.llama3_job_mtbf()
per_gpu = job * L["gpus"]
print(f"{L['unexpected']} unexpected interruptions in {L['days']} days: one every {job / 3600:.2f} hours")
print(f"the same rate from each of {L['gpus']:,} GPUs: one GPU fails every {per_gpu / 3600:,.0f} hours "
      f"({per_gpu / F.DAY / 365:.1f} years)")
print(f"chance that the whole job runs a day without an interruption: {np.exp(-F.DAY / job):.2%}")
for gpus in (8, 1024, 16384, 131072):
    print(f"  {gpus:>7,} GPUs: the job fails every {F.job_mtbf(per_gpu, gpus) / 3600:10,.2f} hours")

# %% [markdown]
# A GPU that fails once in six years is a good GPU. Sixteen thousand of them fail eight
# times a day. A job of 131,072 GPUs would stop every 23 minutes at that rate.
#
# ## 2. A failure as the survivors see it
#
# The emulator can kill a rank at a moment of its simulated clock:
# `World(..., faults=[RankFailure(rank=3, at=2e-3)])`. Below, eight ranks (DP 4 x TP 2) run
# four steps of a training loop, forward and backward with an all-reduce of activations
# over `tp` and of gradients over `dp`; rank 3 dies at 2 ms. *Predict first*: when do the
# other seven ranks learn about it, and what do they learn?

# %%
def train_steps(comm, steps=4):
    """Each step: forward, an all-reduce over tp, backward, the gradients' all-reduce over dp."""
    dp, tp = comm.group("dp"), comm.group("tp")
    for step in range(steps):
        comm.compute(seconds=0.4e-3, name="F")
        tp.all_reduce(np.ones(256, np.float32))
        comm.compute(seconds=0.8e-3, name="B")
        dp.all_reduce(np.ones(1 << 16, np.float32))
    return steps


world = World(mesh={"dp": 4, "tp": 2}, faults=[RankFailure(rank=3, at=2e-3)], watchdog_timeout=600.0)
try:
    world.run(train_steps)
except RankFailedError as err:
    failure = err
    print(err)

# %% [markdown]
# Nobody is told. Rank 3's dp group (ranks 1, 3, 5, 7) waits in its all-reduce for a member
# that never comes; rank 2 waits for rank 3 in their tp all-reduce; the others wait for
# ranks that are themselves stuck. Each waits until its **watchdog** fires: in torch,
# `ProcessGroupNCCL` runs a thread per process group that polls its unfinished work, and
# once an operation has been pending for the group's timeout (10 minutes by default,
# `kProcessGroupNCCLDefaultTimeout` in `torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp`)
# it logs an error built in `WorkNCCL::checkTimeout` (`ProcessGroupNCCL.cpp`) as
# `logPrefix(), "Watchdog caught collective operation timeout: ", *this, " ran for ",
# timeElapsed.count(), " milliseconds before timing out."` (quoted from torch's source; the
# same strings are in the released 2.14.1 library). With this run's numbers filled in, a
# default run would print (seeing it live needs NCCL on GPUs):
#
# ```
# [Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE,
#   NumelIn=65536, NumelOut=65536, Timeout(ms)=600000) ran for 600002 milliseconds before timing out.
# ```
#
# then "failure detected by watchdog at work sequence id", and takes its own process down
# (`WorkNCCL::handleException`: "To avoid data inconsistency, we are taking the entire
# process down"). On the way it dumps the **flight recorder** (a ring buffer of the last
# collectives each rank issued, with their stacks) only if the recorder is on: it keeps
# `TORCH_NCCL_TRACE_BUFFER_SIZE` entries (also read as `TORCH_FR_BUFFER_SIZE`), and at 0 it
# records nothing. The default depends on the release: 0 in torch 2.4, whose default run
# dumps nothing; 2,000 in torch 2.13, the version this course pins
# (`torch/csrc/distributed/c10d/FlightRecorder.hpp` line 111 at 2.13.0's commit `cf30153c`:
# a 2.13.0 process with neither variable set keeps its last 2,000 collectives), where the
# dump on a timeout is on unless `TORCH_NCCL_DUMP_ON_TIMEOUT=0`. Whether it was on shows in
# the log: since pytorch/pytorch pull request #139659 (November 2024, after 2.5), the rank that timed
# out prints its collective's call-time stack ("Stack trace of the failed collective:"), and
# with the recorder off (the variable at 0, as releases before the 2,000 default left it)
# this instead, quoted from `WorkNCCL::printTraceback` in `ProcessGroupNCCL.cpp` (seeing it
# live needs NCCL on GPUs):
#
# ```
# Stack trace of the failed collective not found, potentially because FlightRecorder is
#   disabled. You can enable it by setting TORCH_NCCL_TRACE_BUFFER_SIZE to a non-zero value.
# ```
#
# torch 2.4 predates that line: its default run logs the timeout and nothing of the recorder.
# `TORCH_NCCL_ASYNC_ERROR_HANDLING` decides whether the process is torn down:
# `ProcessGroupNCCL` defaults to 3 and torchrun sets 1 for its workers
# (`local_elastic_agent.py`); both tear the process down. The message names the rank that
# waited and the operation, not the rank that died: finding that one takes the desync
# report (`TORCH_NCCL_DESYNC_DEBUG`: "ranks [3] are the lagging ranks that caused this
# timeout") or the flight recorders' dumps side by side. Across nodes NCCL's network
# transport can notice a dead peer sooner (`ncclRemoteError`, "remote process exited or
# there was a network error", which the watchdog also polls); inside a node, or when a
# process hangs instead of dying, only the timeout is left. The emulator knows who died,
# and its `RankFailedError` says both.
#
# The timeout counts from when each rank *issued* its operation, so every survivor stops
# at its own time, 600 s after its oldest unfinished call:

# %%
for r, t in sorted(failure.timeouts.items()):
    print(f"rank {r}: waited in {t.op} on {t.group} from {t.issued * 1e3:.3f} ms, "
          f"stopped at {t.time:.6f} s, {t.time - failure.at:.3f} s after rank 3 died")

# %% [markdown]
# The same run with a 3 ms watchdog, to see it on one picture (grey: waiting):

# %%
short = World(mesh={"dp": 4, "tp": 2}, faults=[RankFailure(rank=3, at=2e-3)], watchdog_timeout=3e-3)
try:
    short.run(train_steps)
except RankFailedError:
    pass
fig = viz.gantt(short.timeline(), streams=(), figsize=(8, 3.2),
                title="rank 3 dies at 2 ms (x); each other rank waits until its watchdog fires, 3 ms after its call")
fig.axes[0].plot(2.0, 3, "x", color="C3", ms=10, mew=2)
plt.show()

# %% [markdown]
# For ten minutes, sixteen thousand GPUs hold their breath.
#
# **Napkin 7.1** — GPU-hours spent waiting per failure: `gpus` GPUs all wait out a
# watchdog of `timeout_minutes` minutes.

# %%
def napkin_watchdog_gpu_hours(gpus=16384, timeout_minutes=10):
    ### BEGIN SOLUTION: Napkin 7.1: what a watchdog's wait costs
    return gpus * timeout_minutes / 60
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_watchdog(napkin_watchdog_gpu_hours)

# %% [markdown]
# At Llama 3's 419 unexpected interruptions, that is over a million GPU-hours idle in 54
# days, before any restart: one reason the Llama 3 team worked on detecting failures fast
# (section 3.3.4).
#
# ## 3. Stragglers
#
# A GPU need not die to hurt: one that runs slow (throttled by heat, a failing memory that
# retries, a noisy neighbour on its host) holds every collective back. The emulator's
# `Straggler(rank, slowdown)` makes one rank compute `slowdown` times slower. Eight
# data-parallel ranks, one step of 1 ms compute then an all-reduce, with a little noise.
# *Predict first*: in the timeline, is the straggler the rank with the most grey, or the
# least?

# %%
slow_world = grade.straggler_world(8, 6, slow=5, slowdown=1.25, seed=0)
viz.gantt(slow_world.timeline(), streams=(), figsize=(8, 3.0),
          title="rank 5 computes 1.25x slower: every step waits for it")
plt.show()
for r in (0, 5):
    print(f"rank {r}: computing {slow_world.timeline().total('compute', r) * 1e3:.2f} ms, "
          f"waiting {slow_world.timeline().total('idle', r) * 1e3:.2f} ms")

# %% [markdown]
# The least: everybody else waits for it. On a real job, per-rank timings come from the
# profiler or from the flight recorder's collective timestamps; Llama 3's team built tools
# to find the slow ranks of a process group this way (section 3.3.4).
#
# **Exercise 7.1** — find the straggler. `timeline` holds, for each rank, its compute
# events in the same order (one per step here: `timeline.of(rank, "compute", "compute")`,
# each with `.start` and `.end`). For each step, which rank's compute ends last? Return the
# rank that is last in the most steps. Beware: any rank can have one bad step (a hiccup),
# which is not what makes a straggler.

# %%
def find_straggler(timeline):
    ### BEGIN SOLUTION: Exercise 7.1: find the straggler
    ends = np.array([[e.end for e in timeline.of(r, "compute", "compute")] for r in range(timeline.size)])
    last = np.argmax(ends, axis=0)  # per step
    return int(np.bincount(last, minlength=timeline.size).argmax())
    ### END SOLUTION


# %% tags=["check"]
grade.check_find_straggler(find_straggler)

# %% [markdown]
# ## 4. Checkpoints
#
# A job that fails must start again from somewhere. A **checkpoint** is what it needs:
# every rank saves what it holds, as `torch.distributed.checkpoint` (DCP) does for a torch
# job:
#
# * its **shards** by placement: its block of each parameter (a tensor-parallel rank holds
#   columns or rows; an expert-parallel rank its experts; ZeRO-3 a range of each layer),
# * the **optimizer state**, sharded the same way (AdamW's two moments, and the fp32
#   master weights under mixed precision): without it, a restart would reset Adam,
# * the **data position** (how many steps were trained: the restarted job must feed the
#   next batch, not the first) and the **RNG state** (here one generator for the job,
#   drawn once per step: a model with dropout would make its masks from these draws),
# * and a **manifest**, written last, of every tensor's global shape and each saved
#   chunk's offsets and sizes, from which any other mesh can find what it needs.
#
# `run_on_mesh(..., checkpoint_dir=path)` saves after its last step. A run refuses a folder
# that already holds saves, since making its own would delete them: the error says the
# ways on (resume from them, save elsewhere, or `Checkpointing(path, overwrite=True)`,
# which the cells below pass so that they can run again). A small GPT on DP 2 x TP 2 with
# ZeRO-1:

# %%
model = nn.GPT(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=4, max_seq=8, dtype=np.float64)
params = model.init(np.random.default_rng(0))
batches = synthetic_batches(4, 24, 8, model.vocab, seed=1)
adam = lambda: nn.AdamW(lr=1e-2)  # noqa: E731
dims = ParallelDims(dp=2, tp=2, zero_stage=1)
saved = run_on_mesh(model, params, batches[:2], dims, adam(), checkpoint_dir=Checkpointing(work / "first",
                                                                                           overwrite=True))
folder = saved.checkpoints[0]
print(folder.name, sorted(p.name for p in folder.iterdir()))
manifest = json.loads((folder / ".metadata").read_text())
print(f"step {manifest['train']['step']}, Adam's step count {manifest['train']['optim_t']}; "
      f"{len(manifest['tensors'])} tensors, {manifest['bytes']:,} bytes; per rank {manifest['bytes_per_rank']}")
for fqn in ("model.embed.tok.w", "model.blocks.0.mlp.fc1.w", "optim.m.blocks.0.mlp.fc1.w", "optim.m.blocks.0.ln1.g"):
    t = manifest["tensors"][fqn]
    print(f"{fqn:28s} global {tuple(t['shape'])}: " +
          ", ".join(f"{tuple(c['sizes'])} at {tuple(c['offsets'])} in {c['file']}" for c in t["chunks"]))

# %% [markdown]
# The vocabulary-parallel embedding is saved as two halves along the vocabulary; the MLP's
# first matrix as column blocks, and so is its Adam moment, which ZeRO-1 gives to the
# second data-parallel rank whole. ZeRO-1 cuts each layer's moments by ranges of the
# layer's parameters laid end to end, so a cut can fall inside a tensor: the first norm's
# gain is split at element 12 between the two data-parallel ranks' ranges. (In a matrix,
# a range is a partial row, whole rows and a partial row: up to three blocks.) Each of the
# two data-parallel replicas holds the same parameters: DCP writes a block held by several ranks once, by
# the holder with the fewest bytes planned so far (`dedup_save_plans` in
# `torch/distributed/checkpoint/_dedup_save_plans.py`), which spreads the writing over
# the ranks that hold copies. The manifest is written through a temporary file and a rename
# (`FileSystemWriter.finish` in `torch/distributed/checkpoint/filesystem.py`), as soon as
# the last shard is on disk: a save that did not finish has none, and is never loaded, and
# a crash at any moment leaves every earlier save whole. The manifest also holds each
# file's SHA-256 and step, which loading checks: a shard altered since, or copied from
# another save, is refused instead of loaded.
#
# **What a save costs.** Llama 3 wrote its checkpoints to Meta's Tectonic file system:
# 2 TB/s sustained (7 TB/s peak) across 7,500 servers, each GPU saving between 1 MB and
# 4 GB (section 3.3.1). Shared by 16,384 GPUs writing at once, that is 122 MB/s per GPU:
# 4 GB takes half a minute, during which a synchronous save stops training. An
# **asynchronous** save (`dcp.async_save`) copies the state to host memory (over PCIe,
# 64 GB/s one way on an H100: a twentieth of a second for 4 GB), lets training go on, and
# writes from host memory in the background.

# %%
st = Storage()
for gb in (0.001, 1, 4):
    print(f"{gb:g} GB per GPU: synchronous save {st.write_seconds(gb * 1e9):8.3f} s of training stopped; "
          f"asynchronous {st.copy_seconds(gb * 1e9):.4f} s (then {st.write_seconds(gb * 1e9):.3f} s in the "
          f"background)")

# %% [markdown]
# On the emulator: four steps saving every two, synchronously and asynchronously, against
# no saving. The model is tiny, so the emulated GPU and the storage are both slowed down
# (2 GFLOP/s, 100 MB/s) to keep their ratio that of a large job: a write takes about half
# a step. *Predict first*: how much of the write does the asynchronous save hide, and
# which write can it not hide?

# %%
small_gpu, storage = Topology(flops=2e9), Storage(write_bandwidth=100e6, read_bandwidth=100e6)
base = run_on_mesh(model, params, batches, dims, adam(), topology=small_gpu)
runs = {mode: run_on_mesh(model, params, batches, dims, adam(), topology=small_gpu, checkpoint_dir=Checkpointing(
    work / mode, every=2, async_save=mode == "async", storage=storage, overwrite=True)) for mode in ("sync", "async")}
for mode, run in runs.items():
    equal = all(np.array_equal(run.params[k], base.params[k]) for k in base.params)
    print(f"{mode:5s}: {run.step_time() * 1e3:5.2f} ms for 4 steps and 2 saves (no saving: "
          f"{base.step_time() * 1e3:.2f} ms); parameters unchanged: {equal}")
viz.gantt(runs["async"].world.timeline().of_ranks([0, 1]), streams=("storage",), figsize=(8, 2.2),
          title="asynchronous saves: a short copy stops training, the write runs on the storage stream")
plt.show()

# %% [markdown]
# The synchronous run stops twice for the whole write (and waits for the slowest
# writer each time). The asynchronous one stops only for the copies and, once, for the
# plan; the writes run beside the training, and only the last, after the last step, adds
# its full time: the job is not done before its checkpoint is on storage.
#
# ## 5. Resharding: loading on another mesh
#
# A node is gone and no spare is at hand: the job goes on with 6 data-parallel ranks instead
# of 8, or a change of plan moves it from TP 2 to TP 4. The checkpoint does not care: each
# rank of the new mesh knows, from its placements, the block of each tensor it needs, and
# reads it from the saved chunks it overlaps. Along each dim, a chunk at offset $a$ of
# size $n$ and a wanted block at $b$ of size $m$ share $[\max(a, b), \min(a+n, b+m))$ (when
# that is not empty); the blocks overlap when every dim does. The same weight saved by TP 2
# (two column blocks) and wanted by a TP 4 rank, and by a ZeRO-3 rank (a range of rows):

# %%
fig, axes = plt.subplots(1, 2, figsize=(8, 2.6))
saved_chunks = [Chunk((0, 0), (16, 16)), Chunk((0, 16), (16, 16))]  # a (16, 32) weight saved by TP 2
for ax, wanted, name in ((axes[0], Chunk((0, 8), (16, 8)), "TP 4, rank 1"),
                         (axes[1], Chunk((5, 0), (6, 32)), "rows 5 to 10")):
    for i, c in enumerate(saved_chunks):
        ax.add_patch(Rectangle(c.offsets[::-1], c.sizes[1], c.sizes[0], fill=False, lw=2, ec=f"C{i}"))
        ax.text(c.offsets[1] + 1, 15, f"saved by TP rank {i}", color=f"C{i}", fontsize=8)
        ov = overlap(c, wanted)
        if ov is not None:
            at = [o + s for o, s in zip(c.offsets, ov.saved_start)]
            ax.add_patch(Rectangle(at[::-1], ov.lengths[1], ov.lengths[0], color=f"C{i}", alpha=0.35))
    ax.add_patch(Rectangle(wanted.offsets[::-1], wanted.sizes[1], wanted.sizes[0], fill=False, lw=1.5, ls="--",
                           ec="black"))
    ax.set_xlim(-0.5, 32.5)
    ax.set_ylim(16.5, -0.5)
    ax.set_title(f"wanted (dashed): {name}", fontsize=9)
    ax.set_xlabel("column")
axes[0].set_ylabel("row")
fig.tight_layout()
plt.show()

# %% [markdown]
# **Exercise 7.2** — read a block. `saved` is a list of `(offsets, array)`, the chunks of
# one tensor (they tile it; `array.shape` is each chunk's sizes). Return the block of that
# tensor that starts at `offsets` and has shape `sizes`, assembled from every chunk that
# overlaps it. The check compares your function with slicing the whole tensor, then uses
# it to load checkpoints onto other meshes (DP 4 to DP 3, TP 2 to TP 4 with ZeRO-3, a
# pipeline of 2 stages to DP 2 x TP 2), while the library's loader refuses to run.

# %%
def read_block(saved, offsets, sizes):
    ### BEGIN SOLUTION: Exercise 7.2: read a block from saved chunks
    out = np.empty(sizes, dtype=saved[0][1].dtype)
    for off, data in saved:
        lo = [max(o, w) for o, w in zip(off, offsets)]
        hi = [min(o + n, w + s) for o, n, w, s in zip(off, data.shape, offsets, sizes)]
        if all(h > l for l, h in zip(lo, hi)):
            out[tuple(slice(l - w, h - w) for l, h, w in zip(lo, hi, offsets))] = \
                data[tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, off))]
    return out
    ### END SOLUTION


# %% tags=["check"]
grade.check_read_block(read_block)

# %% [markdown]
# Now the real thing, with the library's loader: saved after 2 of 4 steps on one mesh,
# resumed on another with `run_on_mesh(model, None, batches[2:], other, opt,
# resume_from=path)`, against the run that never stopped. DP 8 to DP 6 is what losing
# GPUs does to data parallelism (at scale, losing one 8-GPU node of DP 64 leaves DP 56:
# the same operation); the others change the tensor-parallel width, the pipeline split and
# the ZeRO stage.

# %%
pairs = [(ParallelDims(dp=8), ParallelDims(dp=6)), (ParallelDims(tp=2), ParallelDims(tp=4)),
         (ParallelDims(pp=2, micro_batches=2), ParallelDims(pp=4, micro_batches=2)),
         (ParallelDims(dp=4, zero_stage=3), ParallelDims(dp=2, zero_stage=1))]
for i, (before, after) in enumerate(pairs):
    never_stopped = run_on_mesh(model, params, batches, before, adam())
    run_on_mesh(model, params, batches[:2], before, adam(), checkpoint_dir=Checkpointing(work / f"pair{i}",
                                                                                         overwrite=True))
    resumed = run_on_mesh(model, None, batches[2:], after, adam(), resume_from=work / f"pair{i}")
    worst = max(float(np.max(np.abs(resumed.params[k] - never_stopped.params[k]))) for k in params)
    print(f"{str(before):44s} -> {str(after):44s} resumed at step {resumed.start_step}: "
          f"equal within 1e-12: {worst < 1e-12}")

# %% [markdown]
# Equal to round-off: resharding changes where each number lives and in which order
# gradients are summed, not what is computed. One caveat, for mixtures of experts: the
# capacity and the load-balancing loss are statistics of each data-parallel replica's
# micro-batch, so with MoE the product `dp x micro_batches` is part of the model's math.
# Keep it when resharding, or accept that training after the restart differs slightly.
#
# ## 6. A failure, a restart, and the work it cost
#
# The whole story on the emulator: DP 4 x TP 2 saving after every step; rank 5 dies during
# step 4. The job stops when the watchdogs fire; the last complete checkpoint is step 3; the
# node that held rank 5 is out, so the job restarts on 4 GPUs (DP 2 x TP 2) from step 3.

# %%
policy = Checkpointing(work / "story", every=1, storage=storage, overwrite=True)
mesh = ParallelDims(dp=4, tp=2)
clean = run_on_mesh(model, params, batches, mesh, adam(), topology=small_gpu,  # never fails
                    checkpoint_dir=Checkpointing(work / "clean", every=1, storage=storage, overwrite=True))
writes = [e for e in clean.world.timeline().of(5, "compute") if e.name == "checkpoint write"]
dies = writes[2].end + 0.5 * base.step_time() / 4  # half a step after its step-3 save
try:
    run_on_mesh(model, params, batches, mesh, adam(), topology=small_gpu, checkpoint_dir=policy,
                faults=[RankFailure(rank=5, at=dies)], watchdog_timeout=600.0)
except RankFailedError as err:
    crash = err
last = Checkpoint(work / "story")
stopped = min(t.time for t in crash.timeouts.values())
print(f"rank {crash.rank} died at {crash.at * 1e3:.2f} ms; complete checkpoints: "
      f"{[p.name for p in crash.checkpoints]}; the first watchdog fired at {stopped:.3f} s")
restarted = run_on_mesh(model, None, batches[last.step:], ParallelDims(dp=2, tp=2), adam(), topology=small_gpu,
                        resume_from=last)
worst = max(float(np.max(np.abs(restarted.params[k] - clean.params[k]))) for k in params)
print(f"restarted on DP 2 x TP 2 from step {restarted.start_step}: after step 4, equal to the run that never "
      f"failed within 1e-12: {worst < 1e-12}")
saved_at = json.loads((last.path / ".metadata").read_text())["saved_at"]
print(f"lost: {(crash.at - saved_at) * 1e3:.2f} ms of training since the checkpoint was complete, "
      f"{stopped - crash.at:.1f} s waiting for the watchdog, then the restart (reading the checkpoint alone: "
      f"{restarted.world.timeline().of(0, 'compute')[0].duration * 1e3:.2f} ms)")

# %% [markdown]
# On a cluster the restart itself is a launcher's job: `torchrun --max-restarts N` runs an
# elastic agent that, when any of its workers fails, stops all of them and starts them
# again, up to N times (the failure modes in `torch/distributed/run.py`'s documentation);
# each new worker loads the last checkpoint. The GPU lab of this lesson does exactly that.
#
# ## 7. How often to save
#
# Saving often wastes time saving; saving rarely loses more work per failure. With a job
# MTBF $M$, a save that stops training for $\delta$, an interval $\tau$ of work between
# saves and a restart costing $R$, to first order each interval pays one save and each
# failure loses half an interval of work and a restart:
#
# $$\text{overhead} \approx \frac{\delta}{\tau} + \frac{\tau/2 + R}{M},\qquad
#   \text{goodput} \approx 1 - \frac{\delta}{\tau} - \frac{\tau/2 + R}{M}.$$
#
# Setting the derivative in $\tau$ to zero gives **Young's interval**, $\tau^* =
# \sqrt{2\delta M}$ (J. W. Young, CACM 1974). Daly refined it with the exact expectation
# for Poisson failures (J. T. Daly, Future Generation Computer Systems 22(3), 2006), in
# which a segment of $\tau + \delta$ takes on average $M e^{R/M}(e^{(\tau+\delta)/M} - 1)$
# of wall time, and found $\tau^* \approx \sqrt{2\delta M}\,\big(1 + \tfrac13\sqrt{\delta/2M}
# + \tfrac19\,\delta/2M\big) - \delta$: within a fraction of a percent of Young's when
# $\delta \ll M$.
#
# **Exercise 7.3** — the interval (seconds) that maximises goodput for a save of
# `save_cost` seconds and a job MTBF of `mtbf` seconds. The check calls it with other costs
# and rates and runs Monte Carlo simulations at Llama 3's, with the 15-minute restart the
# cell after it uses (a 10-minute watchdog and 5 minutes to relaunch and load).

# %%
def optimal_interval(save_cost, mtbf):
    ### BEGIN SOLUTION: Exercise 7.3: the checkpoint interval
    return float(np.sqrt(2 * save_cost * mtbf))
    ### END SOLUTION


# %% tags=["check"]
grade.check_optimal_interval(optimal_interval)

# %% [markdown]
# At Llama 3's rate (one failure every 3.09 hours), a 60-second synchronous save and a
# 15-minute restart (a 10-minute watchdog and 5 minutes to relaunch and load), goodput
# against the interval: Daly's expectation, and 100 simulated runs of 200 MTBFs each per
# point. *Predict first*: how flat is the top?

# %%
save, restart = 60.0, 15 * 60.0
grid = np.geomspace(60, 4 * 3600, 25)
expected = [F.expected_goodput(t, save, job, restart) for t in grid]
simulated = [F.simulate_goodput(t, save, job, restart, runs=100, seed=0).mean() for t in grid[::3]]
best = F.daly_interval(save, job)
fig, ax = plt.subplots(figsize=(7.5, 3.0))
ax.semilogx(grid / 60, expected, label="expected (Daly's model)")
ax.plot(grid[::3] / 60, simulated, "o", ms=4, color="black", label="simulated (100 runs)")
ax.axvline(best / 60, color="C2", ls="--", label=f"Daly's optimum, {best / 60:.1f} min")
young = F.young_interval(save, job)
ax.axvline(young / 60, color="C3", lw=1, label=f"Young's, {young / 60:.1f} min")
ax.set_xlabel("checkpoint interval (minutes)")
ax.set_ylabel("goodput")
ax.set_title("16,384 GPUs at Llama 3's failure rate, 60 s saves, 15 min restarts", fontsize=9)
ax.legend(fontsize=8)
plt.show()
print(f"best goodput {F.expected_goodput(best, save, job, restart):.3f}; "
      f"at half and twice the interval {F.expected_goodput(best / 2, save, job, restart):.3f} and "
      f"{F.expected_goodput(2 * best, save, job, restart):.3f}")
for r_min in (15, 5, 2):
    g = max(F.expected_goodput(t, 1.0, job, r_min * 60) for t in grid)
    print(f"restart {r_min:2d} min, asynchronous saves (1 s stopped): best goodput {g:.3f}")

# %% [markdown]
# The top is flat: half or twice the best interval costs two points. With 60-second
# synchronous saves the best is 83%; make the saves asynchronous (a second stopped) and it
# is 91%, about what Llama 3 reported. What is left is mostly the restart: at one failure
# every 3 hours, 15 minutes per restart alone is 8% of the time, so the next points come
# from catching failures and relaunching in a few minutes, not the watchdog's ten. That is
# where Llama 3's team put its effort: shorter job startup and checkpointing, and fast
# diagnosis (section 3.3.4).
#
# **Napkin 7.2** — goodput, to first order as above: `gpus` GPUs that each fail every
# `gpu_mtbf_hours` hours on average, a save every `interval_minutes` minutes that stops
# training for `save_seconds` seconds, and `restart_minutes` minutes lost per failure to
# detect it and restart.

# %%
def napkin_goodput(gpus=16384, gpu_mtbf_hours=50000, interval_minutes=20, save_seconds=60, restart_minutes=15):
    ### BEGIN SOLUTION: Napkin 7.2: goodput
    mtbf = gpu_mtbf_hours * 3600 / gpus
    tau = interval_minutes * 60
    return 1 - save_seconds / tau - (tau / 2 + restart_minutes * 60) / mtbf
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_goodput(napkin_goodput)

# %% [markdown]
# ## 8. What the large runs do
#
# * **Know what fails.** Llama 3's table 5 counts 148 interruptions from faulty GPUs, 72
#   from HBM3 memory, 54 software bugs, 35 network switches and cables, 7 NCCL watchdog
#   timeouts with no known cause (section 1). Its team relied on PyTorch's NCCL flight
#   recorder (a ring buffer of each rank's recent collectives and their stacks, dumped on a
#   timeout) to find hangs and slow ranks quickly, had to intervene by hand only three times
#   in the 54-day snapshot, and noted that even temperature moved throughput by 1 to 2% over a day (section
#   3.3.4).
# * **Detect fast.** A watchdog of ten minutes costs ten minutes of the whole job per
#   failure (Napkin 7.1). Shorter timeouts detect sooner but risk killing a slow but
#   healthy collective; health checks and the network transport's own errors catch many
#   failures before the timeout.
# * **Save cheaply and often.** Asynchronous saves (section 4) stop training only for a
#   copy to host memory; Young and Daly then say to save every few minutes.
# * **Keep spares.** A spare node standing by lets the job restart on the same mesh at
#   once; without one, resharding (section 5) continues on fewer GPUs. A spare costs its
#   GPUs' idle time; going on smaller costs throughput until the node returns.
# * **Checkpoint in memory.** Gemini (Wang et al., SOSP 2023) keeps checkpoints in the CPU
#   memory of the machine and of peers, with remote storage as the last resort when every
#   machine holding a copy is lost, and reports failure recovery 13 times faster: the price
#   is host memory on every machine and the traffic to copy each checkpoint to a peer.
#
# ## 9. Explore
#
# The job's size, how often one GPU fails, the cost of a save, the interval, asynchronous
# saving and the restart: one simulated run's timeline (work, saves, lost work, restarts,
# failures) and the goodput against the interval, with its optimum.

# %% tags=["nbval-ignore-output"]
from emulator.widgets import FailureExplorer

FailureExplorer(gpus=16384, save_seconds=60, interval_minutes=20, restart_minutes=15)

# %% [markdown]
# ## 10. On real GPUs
#
# `gpu_labs/07_checkpoint.py` trains a small model with its parameters and AdamW state
# sharded over the ranks (FSDP2), saves it with `torch.distributed.checkpoint`, loads it on
# a different number of ranks and checks that training goes on exactly as if it had never
# stopped. Run under `torchrun --max-restarts 1` with `--kill-rank 1 --kill-step 5`, one rank
# kills itself in the middle of a step; the elastic agent stops the others and starts all
# again, and the job resumes from its last checkpoint on its own:
#
# ```
# torchrun --standalone --nproc-per-node 4 -m gpu_labs.07_checkpoint --fresh --stop-after 3
# torchrun --standalone --nproc-per-node 2 -m gpu_labs.07_checkpoint
# TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 4 --max-restarts 1 \
#     -m gpu_labs.07_checkpoint --fresh --kill-rank 1 --kill-step 5
# ```
#
# (The setting on the last line gives each attempt its own rendezvous store: with the
# store torchrun shares by default, restarted workers can read the addresses of the
# workers that died and fail to connect, pytorch/pytorch issue 135712.)

# %%
shutil.rmtree(work, ignore_errors=True)
grade.cleanup()
