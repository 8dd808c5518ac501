# %% [markdown]
# # Lesson 02 — Tensor and sequence parallelism
#
# Data parallelism and ZeRO decide where the *training state* lives. They never split the
# math: every rank still runs every layer on its slice of the batch, and keeps that
# layer's activations. This lesson splits the layers themselves, the way Megatron-LM does:
# each matrix cut across the GPUs of a node, so that two matrix multiplications in a row
# cost one collective. Then it counts, tensor by tensor, what a layer keeps for backward,
# and splits what tensor parallelism leaves whole (sequence parallelism).
#
# You will write the Megatron MLP (Exercise 2.1) and attention split by heads (2.2), the
# MLP half of a sequence-parallel block, forward (2.3: where the all-gather and the
# reduce-scatter go) and backward (2.4: their mirror images, and the all-reduce that
# sequence parallelism needs and that is easy to forget), and a cross-entropy that never
# gathers the logits (2.5); and answer Problems 8.3 and 8.4 and a napkin on crossing a
# node boundary.

# %%
from collections import Counter

import numpy as np
import matplotlib.pyplot as plt
from ml_dtypes import bfloat16

from emulator import World, Topology, nn, viz
from emulator.accounting import (activation_bytes_per_layer, activation_terms, tp_bytes_per_layer,
                                 pp_bytes_per_boundary, zero_bytes_per_gpu)
from emulator.cost import collective_time
from emulator.parallel.tensor_parallel import ColumnParallelLinear, RowParallelLinear, copy_to_tp_region
from emulator.parallel.tensor_parallel.regions import all_gather_dim, reduce_scatter_dim
from emulator.parallel.tensor_parallel.block import TensorParallelBlock, cached_terms
from emulator.grading import lesson02 as grade
from emulator.notebook import setup

setup()

# %% [markdown]
# ## 1. Why data parallelism is not enough
#
# Three limits from lesson 01. Data parallelism *spends batch size*, and past the critical
# batch more batch buys little. ZeRO-1 and ZeRO-2 still hold every parameter on every GPU,
# so they stop helping once the parameters alone do not fit. ZeRO-3 shards the parameters
# but not the activations, and it cannot split the math of one layer: each rank gathers
# the whole layer and runs all of it. How do those numbers look for a GPT-3-sized model
# (175B parameters, 96 layers of width 12288 with 96 heads, sequences of 2048) on 1024
# GPUs, one sequence per GPU?

# %%
psi, L, h, a, s = 175e9, 96, 12288, 96, 2048
state = zero_bytes_per_gpu(psi, 1024, 3)
acts = L * activation_bytes_per_layer(s, 1, h, a)
print(f"ZeRO-3 on 1024 GPUs: {state / 1e9:.1f} GB of parameters, gradients and optimizer state per GPU")
print(f"activations of one sequence through {L} layers: {acts / 1e9:.1f} GB per GPU, whatever ZeRO does")

# %% [markdown]
# The state shrinks to almost nothing; the activations do not move, and they do not fit in
# an 80 GB GPU. Model parallelism changes what travels: instead of moving parameters to the
# data (ZeRO), it moves activations between the GPUs that each hold a piece of the model.
#
# Tensor parallelism, which this lesson builds, cuts every layer, so every GPU works on the
# same sequences at the same time: it asks for no batch and leaves no bubble. *Predict
# first*: one sequence, a small GPT on 4 GPUs, split by data, by layers (a pipeline of 4
# stages, lesson 03) and by tensor parallelism. Which runs, and how much of the step does
# each GPU compute? (The GPU is slowed to 1 GFLOP/s so that this small model's layers
# compute for longer than their all-reduces take on NVLink, as a large model's do.)

# %%
from emulator import ConfigError
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.training import synthetic_batches

small_gpt = nn.GPT(vocab=64, d_model=64, n_heads=4, d_ff=256, n_layers=4, max_seq=32, dtype=np.float64)
one_sequence = synthetic_batches(1, 1, 32, 64, seed=1)
for name, dims in (("DP 4", ParallelDims(dp=4)), ("PP 4", ParallelDims(pp=4)), ("TP 4", ParallelDims(tp=4))):
    try:
        run = run_on_mesh(small_gpt, small_gpt.init(np.random.default_rng(0)), one_sequence, dims, nn.AdamW(),
                          topology=Topology(flops=1e9))
    except ConfigError as err:
        print(f"{name}: refused: {str(err).splitlines()[-1].strip(' -')}")
        continue
    tl = run.world.timeline()
    busy = [tl.total("compute", r) / run.step_time() for r in range(tl.size)]
    print(f"{name}: step {run.step_time() * 1e3:5.2f} ms; each GPU computes " + ", ".join(f"{b:.0%}" for b in busy)
          + " of it")

# %% [markdown]
# Data parallelism needs a sequence per GPU and refuses; the pipeline runs, but with one
# micro-batch only one stage works at a time, three quarters of each GPU's step idle (its
# bubble); tensor parallelism keeps all four computing nearly the whole step, a quarter of
# one GPU's step long. What it pays instead is the all-reduces, on every layer (sections 4
# and 5).
#
# ## 2. The Megatron MLP: columns, then rows
#
# The MLP is $Z = \mathrm{GELU}(XA)\,B$. Cut $A$ by columns into $[A_1, \dots, A_t]$: rank
# $r$ computes $\mathrm{GELU}(XA_r)$, a slice of the hidden activation, with no
# communication, because GELU works element by element. Cut $B$ by rows into
# $[B_1; \dots; B_t]$: rank $r$ already holds the activation slice that $B_r$ needs, and
# $\mathrm{GELU}(XA_r)B_r$ is its *partial* $Z$. The sum of the partials is $Z$: one
# all-reduce for two matrix multiplications.

# %%
viz.megatron_split(4)
plt.show()

# %% [markdown]
# Two operators frame the split, a dual pair: **f** before the block is the identity in
# forward (every rank already has $X$) and an all-reduce in backward (each rank's $dX$ is a
# partial sum); **g** after it is an all-reduce in forward and the identity in backward.
# The row-parallel bias is added *once*, after the reduction. The library's
# `ColumnParallelLinear` and `RowParallelLinear` do this; here they are on 4 emulated GPUs,
# against the single-device MLP, with the trace read back:

# %%
mlp = nn.MLP(16, 64, dtype=np.float64)
p_full = mlp.init(np.random.default_rng(0))
p_full["fc2.b"] += 0.5  # a bias that would show if it were added four times
x = np.random.default_rng(1).standard_normal((2, 8, 16))
z_ref, _ = mlp.forward(p_full, x)


def megatron_mlp(comm):
    fc1, fc2 = ColumnParallelLinear(comm, 16, 64, dtype=np.float64), RowParallelLinear(comm, 64, 16, dtype=np.float64)
    u, _ = fc1.forward(fc1.shard(nn.sub(p_full, "fc1")), copy_to_tp_region(comm, x))
    return fc2.forward(fc2.shard(nn.sub(p_full, "fc2")), nn.gelu(u))[0]


world = World(4)
out = world.run(megatron_mlp)
print(f"max |Z - single device| on every rank: {max(np.abs(z - z_ref).max() for z in out):.1e}")
print("rank 0's calls:", world.calls[0])

# %% [markdown]
# **Exercise 2.1** — the Megatron MLP, forward and backward, as a per-rank program. `p` is
# this rank's shard: `fc1.w` (h, d_ff/t) and `fc1.b` (d_ff/t) its columns of $A$,
# `fc2.w` (d_ff/t, h) its rows of $B$, `fc2.b` (h) the whole bias. `x` and `dy` are
# replicated. Forward returns `(y, cache)`; backward returns `(dx, grads)` with `grads`
# keyed like `p`. Use `nn.gelu` and `nn.gelu_backward(u, dy)`, and `comm.all_reduce`
# where the f and g operators need it. The check compares with `nn.MLP` on 1, 2 and 4
# ranks and counts your collectives.

# %%
def tp_mlp_forward(comm, p, x):
    ### BEGIN SOLUTION: Exercise 2.1: Megatron MLP forward
    u = x @ p["fc1.w"] + p["fc1.b"]  # (b, s, d_ff/t): my columns, no communication
    g = nn.gelu(u)
    y = comm.all_reduce(g @ p["fc2.w"]) + p["fc2.b"]  # g: sum the partials, then the bias once
    return y, {"x": x, "u": u, "g": g}
    ### END SOLUTION


def tp_mlp_backward(comm, p, cache, dy):
    ### BEGIN SOLUTION: Exercise 2.1: Megatron MLP backward
    x, u, g = cache["x"], cache["u"], cache["g"]
    grads = {"fc2.b": dy.sum((0, 1)), "fc2.w": g.reshape(-1, g.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])}
    du = nn.gelu_backward(u, dy @ p["fc2.w"].T)
    grads["fc1.w"] = x.reshape(-1, x.shape[-1]).T @ du.reshape(-1, du.shape[-1])
    grads["fc1.b"] = du.sum((0, 1))
    dx = comm.all_reduce(du @ p["fc1.w"].T)  # f: the partial input gradients summed
    return dx, grads
    ### END SOLUTION


# %% tags=["check"]
grade.check_tp_mlp(tp_mlp_forward, tp_mlp_backward)


# %% [markdown]
# ## 3. Attention, split by heads
#
# Heads are independent: split them over the ranks. The q, k and v projections are
# column-parallel (rank $r$ computes its heads' queries, keys and values), the attention
# itself runs on those heads alone (`nn.AttentionCore`, the same code one device runs), and
# the output projection is row-parallel: one all-reduce again. Norms (and, in lesson 05,
# MoE routers) are small and stay replicated.
#
# **Exercise 2.2** — attention split by heads. `p` holds this rank's columns of `q.w`,
# `k.w`, `v.w` (h, h/t) and `q.b`, `k.b`, `v.b` (h/t), its rows of `o.w` (h/t, h), and the
# whole `o.b`. Split the projections into heads of width `h / n_heads` (this rank has
# `n_heads / t` of them), run a causal `nn.AttentionCore(causal=True)` on them (its
# `forward({}, (q, k, v))` and `backward_input({}, cache, do)` work on (b, heads, s, dh)
# arrays), and finish with the row-parallel output projection.

# %%
def _split_heads(t, dh):
    b, s, _ = t.shape
    return t.reshape(b, s, -1, dh).transpose(0, 2, 1, 3)


def _merge_heads(t):
    b, nh, s, dh = t.shape
    return t.transpose(0, 2, 1, 3).reshape(b, s, nh * dh)


def tp_attention_forward(comm, p, x, n_heads=4):
    ### BEGIN SOLUTION: Exercise 2.2: attention split by heads, forward
    dh = x.shape[-1] // n_heads
    core = nn.AttentionCore(causal=True)
    q, k, v = (_split_heads(x @ p[f"{n}.w"] + p[f"{n}.b"], dh) for n in "qkv")  # my heads
    heads, core_cache = core.forward({}, (q, k, v))
    merged = _merge_heads(heads)  # (b, s, h/t)
    y = comm.all_reduce(merged @ p["o.w"]) + p["o.b"]
    return y, {"x": x, "core": core_cache, "merged": merged, "dh": dh}
    ### END SOLUTION


def tp_attention_backward(comm, p, cache, dy, n_heads=4):
    ### BEGIN SOLUTION: Exercise 2.2: attention split by heads, backward
    x, merged, dh = cache["x"], cache["merged"], cache["dh"]
    grads = {"o.b": dy.sum((0, 1)), "o.w": merged.reshape(-1, merged.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])}
    dq, dk, dv = nn.AttentionCore(causal=True).backward_input({}, cache["core"], _split_heads(dy @ p["o.w"].T, dh))
    dx = 0
    for n, g in (("q", dq), ("k", dk), ("v", dv)):
        g = _merge_heads(g)
        grads[f"{n}.w"] = x.reshape(-1, x.shape[-1]).T @ g.reshape(-1, g.shape[-1])
        grads[f"{n}.b"] = g.sum((0, 1))
        dx = dx + g @ p[f"{n}.w"].T
    return comm.all_reduce(dx), grads
    ### END SOLUTION


# %% tags=["check"]
grade.check_tp_attention(tp_attention_forward, tp_attention_backward)

# %% [markdown]
# A whole block, then: two all-reduces in forward and two in backward. The library's
# `TensorParallelBlock` puts your two pieces together with the norms, residuals and
# dropouts (same parameters as `nn.TransformerBlock`); its trace on 4 ranks:

# %%
d, heads, ff, b, s = 64, 8, 256, 2, 32
block_params = nn.TransformerBlock(d, heads, ff, dtype=np.float64).init(np.random.default_rng(2))
xb = np.random.default_rng(3).standard_normal((b, s, d))


def block_step(comm, sequence_parallel=False, recompute="none", backward=True, keep_gathered_input=False):
    tb = TensorParallelBlock(comm, d, heads, ff, sequence_parallel=sequence_parallel, act_dtype=np.float64,
                             recompute=recompute, keep_gathered_input=keep_gathered_input)
    p = tb.shard(block_params)
    sl = slice(comm.rank * s // comm.size, (comm.rank + 1) * s // comm.size) if sequence_parallel else slice(None)
    y, cache = tb.forward(p, xb[:, sl])
    if not backward:
        return y, sum(nn.cache_bytes(cache).values())
    comm.compute(flops=1e9, name="rest")  # between forward and backward
    return tb.backward(p, cache, np.ones_like(y))


world = World(4)
world.run(block_step)
for c in world.calls[0]:
    print(f"  {c.op:11s} {c.nbytes:>8,d} B on group {c.group}")
print(f"bytes sent per rank: {world.stats().bytes_sent[0]:,d}; "
      f"formula 8 b s h (t-1)/t with 8-byte floats: {tp_bytes_per_layer(b, s, d, 4, dtype_bytes=8):,.0f}")

# %% [markdown]
# ## 4. Traffic: TP against PP
#
# Each of the four all-reduces moves $2\frac{t-1}{t}$ times the $b \cdot s \cdot h$
# activations, so tensor parallelism sends $8\,bsh\,\frac{t-1}{t}$ *elements* per GPU per
# layer, in collectives that *block* the next matrix multiplication; in bytes, times the
# bytes of one element (2 in bf16, 8 for the float64 above). A pipeline (lesson 03) sends
# $bsh$ elements per micro-batch from one stage to the next, point to point.
# `emulator.accounting.tp_bytes_per_layer` and `pp_bytes_per_boundary` hold the formulas;
# the measurement above agrees with the first.
#
# **Problem 8.3** — for `b` sequences of `s` tokens of width `h` in activations of
# `dtype_bytes` bytes, tensor parallelism over `t` GPUs: how many bytes does each GPU send
# per layer, and how many cross one pipeline boundary? The check tries the problem's
# numbers (b=4, s=8192, h=8192, t=8, bf16) and others.

# %%
def problem_8_3(b=4, s=8192, h=8192, t=8, dtype_bytes=2):
    ### BEGIN SOLUTION: Problem 8.3: TP against PP traffic
    act = b * s * h * dtype_bytes
    return 8 * act * (t - 1) / t, act
    ### END SOLUTION


# %% tags=["check"]
grade.problem_8_3(problem_8_3)

# %% [markdown]
# Problem 8.3's two numbers are not alike: the first counts tensor parallelism's forward
# and backward, the second one direction of a boundary. Compared like with like, forward and
# backward on both sides (a boundary sends the activations forward and their gradient back):

# %%
tp_layer = tp_bytes_per_layer(4, 8192, 8192, 8)  # forward and backward, per GPU, per layer
cut = 2 * pp_bytes_per_boundary(4, 8192, 8192)  # forward and backward, per micro-batch
print(f"TP 8, one layer: {tp_layer / 1e9:.2f} GB per GPU; one pipeline boundary: {cut / 1e9:.2f} GB: "
      f"{tp_layer / cut:.1f}x per layer, {tp_layer / cut:.1f}k x for a stage of k layers "
      f"(k = 10: {10 * tp_layer / cut:.0f}x)")

# %% [markdown]
# 3.5 times the bytes per layer, and a pipeline stage of $k$ layers sends its one boundary's
# bytes while tensor parallelism sends 3.5 $k$ times as many, in blocking collectives: TP
# belongs on the fastest link there is. (The "7x" often quoted divides TP's forward and
# backward by the boundary's forward alone: $8\,bsh\,\frac{t-1}{t} = 7\,bsh$ at $t = 8$,
# against $bsh$.)
#
# ## 5. TP across a node boundary
#
# The same layer with $t = 8$: inside one node of 8 GPUs; over two nodes of 4 with a
# 400G NIC per GPU (today's rail-optimized H100 clusters, NCCL's channels spreading the
# crossing over every NIC); and over two nodes with a single NIC each (an older or cheaper
# cluster). The compute is charged at an H100's peak; the all-reduces carry the
# activations of a realistic layer (b=1, s=4096, h=8192, bf16: 64 MB each). Predict the
# ratios before you run it.

# %%
big = dict(b=1, s=4096, h=8192)
act_bytes = 2 * big["b"] * big["s"] * big["h"]
flops = 24 * big["b"] * big["s"] * big["h"] ** 2 / 8  # this rank's eighth of a layer's forward matmuls


def tp_layer_in_time(comm):
    x = np.zeros(act_bytes // 4, np.float32)  # a message of the activations' size (its values do not matter)
    for half in ("attention", "MLP"):
        comm.compute(flops=flops / 2, name=half)
        comm.all_reduce(x)


layouts = {"one node": Topology(gpus_per_node=8), "two nodes, a NIC per GPU": Topology(gpus_per_node=4),
           "two nodes, one NIC each": Topology(gpus_per_node=4, nics_per_node=1)}
fig, axes = plt.subplots(3, 1, figsize=(9, 5.4))
times, all_reduce, computing = {}, {}, {}
for ax, (name, topo) in zip(axes, layouts.items()):
    world = World(8, topology=topo)
    world.run(tp_layer_in_time)
    times[name] = max(world.stats().time)
    tl = world.timeline()
    all_reduce[name] = tl.total("comm", 0, stream="comm world") / 2  # two all-reduces per layer
    computing[name] = tl.total("compute", 0)
    viz.gantt(world.timeline().of_ranks(range(2)), ax=ax, unit="ms", label_events=False,
              title=f"TP 8, {name}: a layer's forward takes {times[name] * 1e3:.2f} ms (ranks 0-1 shown)")
plt.show()
nvlink, nic = Topology().nvlink, Topology().nic
print(f"the links: NVLink {nvlink.beta / 1e9:.0f} GB/s, one NIC {nic.beta / 1e9:.0f} GB/s per direction: "
      f"{nvlink.beta / nic.beta:.1f}x")
for name, t_layer in times.items():
    print(f"{name:26s}: {t_layer * 1e3:6.2f} ms, {t_layer / times['one node']:4.1f}x one node; each all-reduce "
          f"{all_reduce[name] * 1e3:.2f} ms ({all_reduce[name] / all_reduce['one node']:.1f}x), compute "
          f"{computing[name] * 1e3:.2f} ms")

# %% [markdown]
# Inside a node the all-reduces ride NVLink. Across nodes every ring step of every
# all-reduce waits on the NICs, and nothing hides that wait: the next matrix
# multiplication needs the result. With a NIC per GPU and NCCL's channels, the crossing is
# spread over all of them and the layer is about 1.4x slower (more for the smaller,
# latency-bound messages of smaller layers, and those NICs are also wanted by the data-
# and pipeline-parallel traffic). With one NIC per node, 7.7x is the gap between the
# links (NVLink's 370 GB/s against one NIC's 48 GB/s per direction). Each all-reduce pays
# nearly all of it, 7.3x, because a ring runs at the pace of its slowest hop; the layer
# pays 3.8x, because its compute takes as long as before. The larger the share of
# communication in a layer, the closer it comes to the links' 7.7x. So tensor
# parallelism stays within a node: $t \le 8$ on H100/H200 machines. (TPU pods, whose
# chips all sit on one uniform fast torus, run wider TP.)
#
# **Napkin 2.1** — how long does one all-reduce of the bf16 activations (`b` x `s` x `h`)
# take over `t` tensor-parallel ranks, `gpus_per_node` per node (NVLink inside, one NIC
# per GPU between nodes, a channel per NIC as in lesson 00)? Use lesson 00's ring formulas
# and link numbers.

# %%
def napkin_tp_across_nodes(b=1, s=4096, h=8192, t=16, gpus_per_node=8):
    ### BEGIN SOLUTION: Napkin 2.1: one TP all-reduce, inside or across nodes
    S, g = 2 * b * s * h, gpus_per_node
    nv, ib = Topology().nvlink, Topology().nic
    if t <= g:
        return 2 * (t - 1) * (nv.alpha + S / t / nv.beta)
    per_node = g  # a channel per NIC: each NIC carries one channel's piece, NVLink the other g - 1
    piece = S / (t * per_node)
    return 2 * (t - 1) * max(ib.alpha + piece / ib.beta, nv.alpha + (per_node - 1) * piece / nv.beta)
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_tp_across_nodes(napkin_tp_across_nodes)

# %% [markdown]
# ## 6. Activation memory, tensor by tensor
#
# What does one layer keep for backward? Korthikanti et al. (2022) count it for a layer
# with bf16 activations and 1-byte dropout masks: $sbh\,(34 + 5\,as/h)$ bytes, where the
# first term is everything of size $s \times b \times h$ (or 4h wide in the MLP) and the
# second the attention scores, quadratic in $s$. `TensorParallelBlock` keeps exactly those
# tensors (bf16, dropout masks of one byte), under the names of the formula's terms, so
# the ledger can be read beside the formula line by line. The formula counts Megatron-LM's
# attention of that time, which wrote the scores to HBM: the emulator runs that code path
# under the `megatron-2021` software stack (`World(..., stack="megatron-2021")`; its kernels
# and their sources are in `emulator/machine/stack_sources.py`). Here on 4 ranks, with tensor
# parallelism alone. *Predict first*: which of the tensors shrink by 4, and which does
# every rank keep whole?

# %%
sm, bm, hm, am = 64, 2, 64, 8  # small enough to run, large enough for every term
pm = nn.TransformerBlock(hm, am, 4 * hm).init(np.random.default_rng(4))
xm = np.random.default_rng(5).standard_normal((bm, sm, hm)).astype(np.float32)


def measure(comm, sp=False, recompute="none"):
    tb = TensorParallelBlock(comm, hm, am, 4 * hm, sequence_parallel=sp, dropout=0.1, act_dtype=bfloat16,
                             recompute=recompute)
    sl = slice(comm.rank * sm // comm.size, (comm.rank + 1) * sm // comm.size) if sp else slice(None)
    _, cache = tb.forward(tb.shard(pm), xm[:, sl])
    comm.memory.hold("layer", cache, "activations")
    return cached_terms(cache)


t = 4
got = World(t, stack="megatron-2021").run(measure)[0]
want = activation_terms(sm, bm, hm, am, t)
print(f"{'tensor kept for backward':34s} {'ledger':>8s} {'formula':>8s}")
for term, v in want.items():
    print(f"{term:34s} {got[term]:>8,d} {v:>8,.0f}")
print(f"{'total':34s} {sum(got.values()):>8,d} {sum(want.values()):>8,.0f}   "
      f"= sbh (10 + 24/t + 5as/(ht)) = {activation_bytes_per_layer(sm, bm, hm, am, t):,.0f}")

# %% [markdown]
# Every term agrees exactly. Read which ones tensor parallelism divided by $t$ (the
# matrix-multiplication inputs of the split layers, the attention scores) and which it
# did not: the norms' inputs, the inputs of the column-parallel layers, the dropout masks
# after the row-parallel ones. Those $10\,sbh$ bytes are replicated on every rank. Now all
# five cases at once, measured and computed:

# %%
cases = [("one GPU", 1, False, "none"), ("TP", t, False, "none"), ("TP + SP", t, True, "none"),
         ("TP + SP, selective", t, True, "selective"), ("TP + SP, full", t, True, "full")]
print(f"{'':20s} {'measured':>9s} {'formula':>9s}")
for name, tt, sp, rc in cases:
    m = sum(World(tt, stack="megatron-2021").run(measure, sp, rc)[0].values())
    f = activation_bytes_per_layer(sm, bm, hm, am, tt, sp, rc)
    assert m == f
    print(f"{name:20s} {m:>9,d} {f:>9,.0f}")

# %% [markdown]
# The formulas: $sbh(34 + 5as/h)$ on one GPU; $sbh(10 + 24/t + 5as/(ht))$ with TP;
# $sbh(34/t + 5as/(ht))$ with TP and sequence parallelism (next section); selective
# recomputation recomputes the softmax and its dropout in backward and drops the
# $5as/h$ term; full recomputation keeps only the layer's input.
#
# Today's Megatron-Core runs attention as one fused kernel (FlashAttention or cuDNN's), the
# emulator's default stack: the scores never reach HBM, and what backward keeps of the
# softmax is its statistics, one fp32 number per row of scores, $4as$ bytes per sequence.
# The quadratic term is gone without any recomputation:

# %%
flash = sum(World(t).run(measure)[0].values())
print(f"TP, fused attention: measured {flash:,d} bytes, formula "
      f"{activation_bytes_per_layer(sm, bm, hm, am, t, attention='flash'):,.0f}; "
      f"with the scores in HBM {activation_bytes_per_layer(sm, bm, hm, am, t):,.0f}")

# %% [markdown]
# When is memory at its peak? Run a stack of four such layers forward, then backward,
# holding each layer's activations until its backward and its gradients until the end
# (the compute charged at 100 GFLOP/s, so that the small layers take visible time):

# %%
def stack(comm, layers=4):
    tb = TensorParallelBlock(comm, hm, am, 4 * hm, dropout=0.1, act_dtype=bfloat16)
    p = tb.shard(pm)
    caches, y = [], xm
    for i in range(layers):
        y, cache = tb.forward(p, y)
        caches.append(comm.memory.hold(f"layer {i}", cache, "activations"))
        comm.compute(flops=nn.total_flops(nn.TransformerBlock(hm, am, 4 * hm).flops(xm.shape)) / 3 / t, name=f"F{i}")
    dy = np.ones_like(y)
    for i in reversed(range(layers)):
        dy, grads = tb.backward(p, caches[i], dy)
        comm.compute(flops=2 * nn.total_flops(nn.TransformerBlock(hm, am, 4 * hm).flops(xm.shape)) / 3 / t,
                     name=f"B{i}")
        comm.memory.hold(f"grads {i}", grads, "grads")
        comm.memory.hold(f"input grad {i}", dy, "buffers")
        if i + 1 < layers:
            comm.memory.release(f"input grad {i + 1}")
        comm.memory.release(f"layer {i}")


world = World(t, topology=Topology(flops=1e11), stack="megatron-2021")
world.run(stack)
viz.memory_over_time(world.memory[0], title="rank 0, four TP layers: forward, then backward")
plt.show()

# %% [markdown]
# Activations pile up through forward and peak as backward begins, while the first
# gradients already exist; backward then frees them layer by layer. At scale the hump is
# far taller than the parameters.
#
# **Problem 8.4** — a model with width `h`, `a` heads and `L` layers trains on sequences
# of `s` tokens, micro-batch `b`, with tensor and sequence parallelism over `t` GPUs and
# selective recomputation. How many bytes of activations does one layer keep per GPU, and
# all `L` layers? And without sequence parallelism? Return the four numbers. (The
# problem's numbers: h=12288, a=96, L=96, s=4096, b=1, t=8.)

# %%
def problem_8_4(h=12288, a=96, L=96, s=4096, b=1, t=8):
    ### BEGIN SOLUTION: Problem 8.4: activation memory with and without sequence parallelism
    sbh = s * b * h
    with_sp, without = sbh * 34 / t, sbh * (10 + 24 / t)  # selective: the 5as/h term is recomputed
    return with_sp, L * with_sp, without, L * without
    ### END SOLUTION


# %% tags=["check"]
grade.problem_8_4(problem_8_4)

# %% [markdown]
# Explore the formula: sequence, batch, width, heads, TP degree, layers, sequence
# parallelism, recomputation. For small configurations the widget also runs the block on
# the emulator and draws the measured bytes beside the formula.

# %% tags=["nbval-ignore-output"]
from emulator.widgets import ActivationExplorer

ActivationExplorer(s=128, b=1, h=64, a=4, t=2, layers=12)

# %% [markdown]
# ## 7. Sequence parallelism
#
# The replicated $10\,sbh$ belong to the norms, dropouts and residual adds: work done
# element by element, independently for every position of the sequence. Split them along
# the sequence over the same $t$ ranks. Then the all-reduce after a row-parallel layer
# becomes a **reduce-scatter** along the sequence (each rank keeps its positions of the
# summed output), and before a column-parallel layer an **all-gather** along the
# sequence brings the whole input back. An all-reduce *is* a reduce-scatter plus an
# all-gather, so in forward the bytes are the same. Megatron-LM's operators
# (`megatron/core/tensor_parallel/mappings.py`) are
# `gather_from_sequence_parallel_region` (all-gather in forward, reduce-scatter in
# backward) and `reduce_scatter_to_sequence_parallel_region` (reduce-scatter in forward,
# all-gather in backward); `emulator.parallel.tensor_parallel.regions` has both, under the same
# names.
#
# **Exercise 2.3** — the MLP half of a sequence-parallel block, $y = x +
# \mathrm{MLP}(\mathrm{LN}(x))$, forward. `x` is this rank's (b, s/t, h) slice of the
# sequence; `p` holds the norm's `ln.g` and `ln.b` (h) and fc2's bias `fc2.b` (h), whole,
# and this rank's columns of fc1 (`fc1.w` (h, d_ff/t), `fc1.b` (d_ff/t)) and rows of fc2
# (`fc2.w` (d_ff/t, h)). Return `(y, cache)`, `y` this rank's (b, s/t, h) slice. Where do
# the all-gather and the reduce-scatter go? `all_gather_dim(comm, x)` and
# `reduce_scatter_dim(comm, x)` run them along the sequence (dim 1); `nn.layer_norm(x, g,
# b)` is the norm. The check compares with one device on 1 to 4 ranks and reads your
# collectives. (The attention half follows the same pattern around q, k, v and o.)

# %%
def sp_mlp_forward(comm, p, x):
    ### BEGIN SOLUTION: Exercise 2.3: the sequence-parallel MLP half, forward
    a = nn.layer_norm(x, p["ln.g"], p["ln.b"])  # (b, s/t, h): the norm on my positions only
    a_all = all_gather_dim(comm, a)  # (b, s, h): fc1 needs every position
    u = a_all @ p["fc1.w"] + p["fc1.b"]  # (b, s, d_ff/t): my columns
    g = nn.gelu(u)
    z = reduce_scatter_dim(comm, g @ p["fc2.w"]) + p["fc2.b"]  # (b, s/t, h): the sum for my positions, bias once
    return x + z, {"x": x, "a": a, "u": u, "g": g}
    ### END SOLUTION


# %% tags=["check"]
grade.check_sp_forward(sp_mlp_forward)

# %% [markdown]
# One thing breaks quietly. Under sequence parallelism each rank runs the norms on its
# own positions only, so the gradient of a norm's weights on a rank covers only those
# positions: a partial sum. The same holds for the row-parallel biases, now added on the
# sequence slice. Without an all-reduce of those gradients the ranks update their
# "replicated" copies differently, and the replicas drift apart. Watch it happen: here
# the library's whole block is trained for a few SGD steps with that all-reduce left out,
# and the first norm's weights compared across the four ranks. *Predict first*: is the
# gap between the ranks' copies a rounding error, or as large as the update itself?

# %%
def drift(comm, forget, steps=3):
    # reduce_partial_grads=False: the block leaves that all-reduce out (the mesh runtime does so,
    # and sums those gradients with the data-parallel ones; here nothing sums them)
    tb = TensorParallelBlock(comm, d, heads, ff, sequence_parallel=True, act_dtype=np.float64,
                             reduce_partial_grads=not forget)
    p = tb.shard(block_params)
    sl = slice(comm.rank * s // comm.size, (comm.rank + 1) * s // comm.size)
    for _ in range(steps):
        y, cache = tb.forward(p, xb[:, sl])
        _, grads = tb.backward(p, cache, y / (y.size * comm.size))  # the gradient of the mean of y^2 / 2
        p = {k: v - grads[k] for k, v in p.items()}  # plain SGD, learning rate 1
    return p["ln1.g"]


for forget in (True, False):
    g = World(4).run(drift, forget)
    print(f"{'without' if forget else 'with':7s} the all-reduce: ln1.g moved by up to {np.abs(g[0] - 1).max():.1e} "
          f"in 3 steps; largest difference between the ranks' copies: {max(np.abs(gi - g[0]).max() for gi in g):.1e}")

# %% [markdown]
# A subclass that only skipped the collective (overriding `sync_sequence_parallel_grads`)
# would not get this far: every module of the library declares the kernels and collectives
# each of its passes runs, and the emulator fails a pass whose collectives differ from its
# declaration, naming the rank. On a cluster nothing checks: the run trains on, and the
# copies drift.

# %% [markdown]
# **Exercise 2.4** — the backward of your sublayer. `dy` is this rank's (b, s/t, h) slice
# of the output gradient. Return `(dx, grads)`: `dx` this rank's slice of the input
# gradient, `grads` keyed like `p`, each equal to one device's gradient (this rank's
# slice of it, for fc1 and fc2's weight). Every collective of the forward has its mirror
# image here; fc1's weight gradient needs the norm's output for the whole sequence again
# (keep the gathered copy in the cache, or gather it again); and the partial gradients
# need the all-reduce you just saw missing. `nn.layer_norm_backward(x, g, dy)` returns
# `(dx, dg, db)`; `nn.gelu_backward(u, dy)` as in Exercise 2.1.

# %%
def sp_mlp_backward(comm, p, cache, dy):
    ### BEGIN SOLUTION: Exercise 2.4: the sequence-parallel MLP half, backward
    x, a, u, g = cache["x"], cache["a"], cache["u"], cache["g"]
    h = x.shape[-1]
    grads = {"fc2.b": dy.sum((0, 1))}  # my positions only: a partial sum
    dz = all_gather_dim(comm, dy)  # (b, s, h): the reduce-scatter's mirror image
    grads["fc2.w"] = g.reshape(-1, g.shape[-1]).T @ dz.reshape(-1, h)
    du = nn.gelu_backward(u, dz @ p["fc2.w"].T)  # (b, s, d_ff/t)
    a_all = all_gather_dim(comm, a)  # the norm's output again, for fc1's weight gradient
    grads["fc1.w"] = a_all.reshape(-1, h).T @ du.reshape(-1, du.shape[-1])
    grads["fc1.b"] = du.sum((0, 1))
    da = reduce_scatter_dim(comm, du @ p["fc1.w"].T)  # (b, s/t, h): the all-gather's mirror image
    dx, grads["ln.g"], grads["ln.b"] = nn.layer_norm_backward(x, p["ln.g"], da)
    partial = ("ln.g", "ln.b", "fc2.b")  # they saw only my positions
    summed = comm.all_reduce(np.concatenate([grads[k] for k in partial]))
    for i, k in enumerate(partial):
        grads[k] = summed[i * h:(i + 1) * h]
    return dy + dx, grads
    ### END SOLUTION


# %% tags=["check"]
grade.check_sp_backward(sp_mlp_forward, sp_mlp_backward)

# %% [markdown]
# Does a step with sequence parallelism move what a step with tensor parallelism alone
# moves? Predict, then measure the library's whole block (both halves, the all-reduce of
# the partial gradients included) on 4 ranks, forward and backward apart:

# %%
print(f"{'bytes sent per rank':20s} {'forward':>9s} {'backward':>9s} {'step':>9s}")
for sp in (False, True):
    fwd, step = World(4), World(4)
    fwd.run(block_step, sp, backward=False)
    step.run(block_step, sp)
    f, total = fwd.stats().bytes_sent[0], step.stats().bytes_sent[0]
    print(f"{'TP + SP' if sp else 'TP':20s} {f:>9,d} {total - f:>9,d} {total:>9,d}")
back = {op: (n - fwd.stats().bytes_by_op.get(op, 0)) // 4 for op, n in step.stats().bytes_by_op.items()}
calls = Counter(c.op for c in step.calls[0][len(fwd.calls[0]):])
print("the backward with SP, per rank: " + ", ".join(f"{op} {n:,d} B in {calls[op]} call(s)" for op, n in back.items()))

# %% [markdown]
# In forward both send the same 98,304 bytes. The backward with sequence parallelism
# sends more. The mirror images of the forward's collectives (two all-gathers, two
# reduce-scatters) carry what TP's two backward all-reduces carry, 98,304 bytes. On top
# come two more all-gathers, 49,152 bytes: the weight gradients of q, k, v and fc1 need
# their inputs (the norms' outputs) for the whole sequence, and the block, as Megatron
# does (`LinearWithGradAccumulationAndAsyncCommunication.backward` in
# `megatron/core/tensor_parallel/layers.py`), keeps only its slice for backward and
# gathers it again, overlapping the gather with the input-gradient matmul. And the
# all-reduce of the partial gradients, 4,608 bytes (Megatron does it in
# `_allreduce_non_tensor_model_parallel_grads`,
# `megatron/core/distributed/finalize_model_grads.py`). A whole step sends 250,368 bytes
# per rank against tensor parallelism's 196,608, 27% more. Megatron-Core leaves sequence
# parallelism off unless asked: `sequence_parallel: bool = False` in
# `megatron/core/model_parallel_config.py`, turned on by `--sequence-parallel`
# (`megatron/training/arguments.py`; `NVIDIA/Megatron-LM` commit f2e5db4).
#
# That extra is a choice between bytes and memory. Keeping the two gathered inputs in the
# cache instead saves both all-gathers, and costs, on each rank, the whole (b, s, h)
# instead of its (b, s/t, h) slice: $(t-1)/t \cdot bsh$ more elements for each of the
# two, exactly the elements its all-gather would have sent (here 24,576 bytes each).
# Megatron re-gathers: activations are what limits a long sequence, and the gather hides
# under the input-gradient matmul. Your Exercise 2.4 could do either. The library's block
# does both (`keep_gathered_input=True` keeps the copies); measured on the same 4 ranks:

# %%
for keep in (False, True):
    fwd, step = World(4), World(4)
    cached = fwd.run(block_step, True, backward=False, keep_gathered_input=keep)[0][1]
    step.run(block_step, True, keep_gathered_input=keep)
    back = step.stats().bytes_sent[0] - fwd.stats().bytes_sent[0]
    print(f"{'keep the gathered inputs' if keep else 're-gather (Megatron)':25s} backward sends {back:>7,d} B, "
          f"the forward caches {cached:>7,d} B per rank")

# %% [markdown]
# 49,152 bytes fewer sent in backward, 49,152 bytes more held from forward to backward: the
# same bytes, spent once as traffic or once as memory.
#
# ## 8. The vocabulary, split
#
# The last layer of a language model multiplies by an $h \times V$ matrix, $V$ the
# vocabulary (128k for Llama 3). Split it by columns, column-parallel as before, and
# each rank holds the logits of its $V/t$ words, (b, s, V/t). Gathering the (b, s, V)
# logits to compute the loss would be the largest tensor of the step. It is not needed:
# the softmax's normaliser needs, per token, only the max over the vocabulary, the sum of
# exponentials and the target's logit, and each of those is a sum (or max) of the ranks'
# parts.
#
# **Exercise 2.5** — vocabulary-parallel cross-entropy. `logits_shard` is (b, s, V/t),
# the columns of this rank's words `rank * V/t ... (rank+1) * V/t`; `targets` (b, s) are
# word ids. Return `(loss, gradient of logits_shard)` equal to `nn.cross_entropy` on the
# full logits (the mean over tokens), moving only per-token numbers between ranks.

# %%
def vocab_parallel_cross_entropy(comm, logits_shard, targets, vocab):
    ### BEGIN SOLUTION: Exercise 2.5: cross-entropy over vocabulary-split logits
    n = vocab // comm.size
    lo = comm.rank * n
    m = comm.all_reduce(logits_shard.max(-1), op="max")
    e = np.exp(logits_shard - m[..., None])
    total = comm.all_reduce(e.sum(-1))
    mine = (targets >= lo) & (targets < lo + n)
    picked = np.take_along_axis(logits_shard, np.where(mine, targets - lo, 0)[..., None], -1)[..., 0]
    target_logit = comm.all_reduce(np.where(mine, picked, 0.0))
    grad = e / total[..., None]
    idx = np.nonzero(mine)
    grad[idx + (targets[idx] - lo,)] -= 1
    return float(np.mean(np.log(total) + m - target_logit)), grad / targets.size
    ### END SOLUTION


# %% tags=["check"]
grade.check_vocab_parallel_cross_entropy(vocab_parallel_cross_entropy)

# %% [markdown]
# ## 9. On real GPUs
#
# `gpu_labs/02_tensor_parallel.py` builds column- and row-parallel layers in torch with
# `torch.autograd.Function` f/g operators (`gpu_labs/torch_parallel/tensor_parallel.py`),
# checks the Megatron MLP and attention block against the dense block on t ranks, runs the
# same block with PyTorch's DTensor (`parallelize_module` with `ColwiseParallel`,
# `RowwiseParallel`, `SequenceParallel`) against both, compares its calls with the
# emulator's, and on GPUs times the TP all-reduces of a layer beside the model:
#
# ```
# torchrun --standalone --nproc-per-node 8 -m gpu_labs.02_tensor_parallel
# ```
#
# **Next:** lesson 03 cuts the model along its depth instead: pipeline parallelism.
