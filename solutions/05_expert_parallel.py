# %% [markdown]
# # Lesson 05 — Mixture of experts and expert parallelism
#
# A mixture-of-experts (MoE) layer replaces a transformer's MLP with many MLPs, the
# experts, and a router that sends each token to a few of them. Parameters grow with the
# number of experts; the compute per token grows only with the few it visits. Attention
# stays dense. Spread over GPUs, each holds some experts and the tokens travel to them:
# two all-to-alls per layer, whose sizes depend on where the router sends the tokens.
#
# You will write top-k routing (Exercise 5.1), the permutation of tokens into expert order
# and back (5.2), the expert-parallel forward (5.3) and backward (5.4), capacity with
# dropping (5.5) and the expert-parallel layer with capacity (5.6); and answer two napkins:
# all-to-all bytes per layer, and tokens dropped under a skewed router.

# %%
import numpy as np
import matplotlib.pyplot as plt

from emulator import Mesh, Topology, World, nn, viz
from emulator.accounting import CASE_STUDIES, all_to_all_bytes_per_layer, experts_per_gpu
from emulator.nn.moe import (capacity, experts_backward_input, experts_backward_weight, experts_forward, keep_first,
                             keep_first_choices_first, route, route_backward)
from emulator.parallel import ParallelDims
from emulator.parallel import expert_parallel as ep
from emulator.parallel.expert_parallel.alternatives import (flat_dispatch, hierarchical_all_to_all,
                                                            shard_experts_tp, tp_moe_forward, two_hop_dispatch)
from emulator.grading import lesson05 as grade
from emulator.notebook import setup

setup()

# %% [markdown]
# ## 1. An MoE layer on one device
#
# For tokens $x$ (T, d): the router computes $p = \mathrm{softmax}(x W_r)$ over $E$
# experts; each token keeps its $k$ most probable experts, with those $k$ probabilities
# renormalised to sum to one as weights. Tokens are sorted by expert so that each expert
# runs one matrix multiplication on a contiguous block; each token's output is the
# weighted sum of its experts' outputs. `nn.MoE` has forward and backward (router
# included):

# %%
moe = nn.MoE(d_model=16, d_ff=32, n_experts=8, top_k=2, dtype=np.float64)
params = moe.init(np.random.default_rng(0))
params["router.w"] *= 30  # a router with opinions
x = np.random.default_rng(1).standard_normal((64, 16))
dy = np.random.default_rng(2).standard_normal((64, 16))
y, cache = moe.forward(params, x)
dx, grads = moe.backward(params, cache, dy)
print(f"tokens per expert: {cache['counts'].tolist()}")
weights_used = 16 * 8 + 2 * (2 * 16 * 32)  # the router and two experts' matrices
print(f"parameters {moe.parameters():,}; used per token {moe.active_parameters():,} ({weights_used:,} of them in "
      f"matrices); forward FLOPs per token {moe.flops((1, 16))['forward']:,} = 2 x {weights_used:,}")

# %% [markdown]
# The same layer against torch's autograd, written apart in `emulator/nn/torch_reference.py`
# (the comparison needs torch; without it the cell says so, and the lesson goes on):

# %%
try:
    import torch
    from emulator.nn import torch_reference as R
except ImportError as missing:
    print(f"comparison with torch skipped: torch cannot be imported here ({missing}); "
          f"pip install torch (or the course's '.[torch]') to run it")
else:
    tp_ = R.to_torch(params)
    tx = torch.tensor(x, requires_grad=True)
    (R.moe(tp_, tx, 2) * torch.tensor(dy)).sum().backward()
    print(f"max difference from torch: output {np.abs(y - R.moe(tp_, tx, 2).detach().numpy()).max():.1e}, input "
          f"gradient {np.abs(dx - tx.grad.numpy()).max():.1e}, router gradient "
          f"{np.abs(grads['router.w'] - tp_['router.w'].grad.numpy()).max():.1e}")

# %% [markdown]
# The 6ND rule of thumb still holds with $N$ the *active* parameters: a token pays for the
# experts it visits, not for all of them. That is the point of MoE: DeepSeek-V3 has 671B
# parameters and runs 37B per token.
#
# **Exercise 5.1** — top-k routing. `logits` is (T, E); return the ids (T, k) of each
# token's k most probable experts, most probable first, and their softmax probabilities
# renormalised over the k (T, k).

# %%
def top_k_route(logits, k):
    ### BEGIN SOLUTION: Exercise 5.1: top-k routing
    z = np.exp(logits - logits.max(1, keepdims=True))
    p = z / z.sum(1, keepdims=True)
    idx = np.argsort(-p, axis=1, kind="stable")[:, :k]
    sel = np.take_along_axis(p, idx, axis=1)
    return idx, sel / sel.sum(1, keepdims=True)
    ### END SOLUTION


# %% tags=["check"]
grade.check_top_k_route(top_k_route)

# %% [markdown]
# Renormalising has a price at $k = 1$: a token's one weight is $p/p = 1$ whatever the
# router says, so the output no longer depends on the router's probabilities and the task
# loss gives the router no gradient; only the auxiliary loss (section 3) would move it.
# Switch Transformer routes top-1 and multiplies the expert's output by the probability
# itself, $y = p_i(x)\,E_i(x)$, unrenormalised, so the router learns from the task (Fedus
# et al. 2021, section 2.1). *Predict*: the router's gradient with $k = 1$ renormalised,
# with $k = 2$, and with Switch's weight. Measured (the library's layer, and torch's
# autograd for Switch's, where torch is installed):

# %%
top1 = nn.MoE(16, 32, 8, 1, dtype=np.float64)
for name, layer in (("top-1, renormalised", top1), ("top-2, renormalised", nn.MoE(16, 32, 8, 2, dtype=np.float64))):
    y1, c1 = layer.forward(params, x)
    g1 = layer.backward(params, c1, dy)[1]["router.w"]
    print(f"{name:22s}: largest router gradient {np.abs(g1).max():.1e}")
try:
    import torch
except ImportError as missing:
    print(f"{'top-1, Switch (y = p E)':22s}: skipped, torch cannot be imported here ({missing}); pip install torch "
          f"to measure it")
else:
    chosen = torch.tensor(top1.forward(params, x)[0])  # weight 1: each token's output is its expert's, E_i(x)
    w_r = torch.tensor(params["router.w"], requires_grad=True)
    p = torch.softmax(torch.tensor(x) @ w_r, dim=1)
    switch = p.max(1).values[:, None] * chosen  # Switch: y = p_i(x) E_i(x), the probability not renormalised
    (switch * torch.tensor(dy)).sum().backward()
    print(f"{'top-1, Switch (y = p E)':22s}: largest router gradient {w_r.grad.abs().max().item():.1e}")

# %% [markdown]
# **Exercise 5.2** — the permutation. With `expert_ids` the flattened (T·k) choices (token
# by token), `permute` returns the order that sorts assignments by expert, stable (token
# order within one expert), and the number of assignments per expert; `unpermute` takes
# the experts' outputs `ys` in that order and returns each token's weighted sum (`tokens[i]`
# is the token of assignment i, `weights` the (T, k) weights).

# %%
def permute(expert_ids, n_experts):
    ### BEGIN SOLUTION: Exercise 5.2: tokens into expert order
    return np.argsort(expert_ids, kind="stable"), np.bincount(expert_ids, minlength=n_experts)
    ### END SOLUTION


def unpermute(ys, order, tokens, weights, n_tokens):
    ### BEGIN SOLUTION: Exercise 5.2: and back, weighted
    y = np.zeros((n_tokens, ys.shape[1]))
    np.add.at(y, tokens[order], weights.ravel()[order, None] * ys)
    return y
    ### END SOLUTION


# %% tags=["check"]
grade.check_permutation(permute, unpermute)

# %% [markdown]
# ## 2. Expert parallelism
#
# Give each of $n$ ranks $E/n$ whole experts (rank $r$: experts $rE/n$ to $(r+1)E/n - 1$)
# and a copy of the router. Each rank routes its own tokens, then:
#
# 1. **count exchange**: an all-to-all of per-expert counts, so every rank knows how many
#    rows it will receive from each other rank;
# 2. **dispatch**: one uneven all-to-all (`all_to_all_single` with split sizes) sends each
#    row to the rank of its expert;
# 3. the experts run on what arrived;
# 4. **combine**: the reverse all-to-all brings the outputs home, to be weighted and summed.
#
# The layer below on 4 ranks equals the single-device layer on all 64 tokens; the bytes of
# each rank's dispatch are its routed rows:

# %%
xs = np.split(x, 4)


def ep_layer(comm):
    local = ep.shard_experts(params, comm.size, comm.rank)
    return ep.forward(comm, moe, local, xs[comm.rank])


world = World(4)
out = world.run(ep_layer)
print(f"max difference from one device: {np.abs(np.concatenate([o[0] for o in out]) - y).max():.1e}")
even = all_to_all_bytes_per_layer(16, 16, 2, 4, dtype_bytes=8)
for r in range(4):
    print(f"rank {r}: " + ", ".join(f"{c.op} {c.nbytes:,} B" for c in world.calls[r]) +
          f"; sent to other ranks {world.stats().bytes_sent[r]:,} B (even routing: {even:,.0f} B + the counts)")

# %% [markdown]
# With $t$ tokens per rank, each routed to $k$ experts spread evenly over $n$ ranks, a
# dispatch sends $(n-1)/n$ of $tk$ rows of width $d$ to other ranks, and the combine as
# many back. The router here is uneven, so the ranks' bytes differ; the call sizes are
# every routed row (a rank's rows for its own experts stay home in a real implementation).
#
# **Exercise 5.3** — the expert-parallel forward, dropless. `params` is this rank's
# (`ep.shard_experts`), `x` its tokens (T, d). Use `route(params["router.w"], x, k)` and
# `experts_forward(params, rows, counts)` (rows sorted by local expert, `counts` per local
# expert), and `comm.all_to_all_single(x, output_split_sizes, input_split_sizes)`. Return
# this rank's output (T, d).

# %%
def ep_forward(comm, moe, params, x):
    ### BEGIN SOLUTION: Exercise 5.3: expert-parallel forward
    n, k = comm.size, moe.top_k
    local = moe.n_experts // n
    idx, weights, _ = route(params["router.w"], x, k)
    ids, tokens = idx.ravel(), np.repeat(np.arange(len(x)), k)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=moe.n_experts)
    incoming = comm.all_to_all_single(counts).reshape(n, local)  # [from rank, my expert]
    send, recv = counts.reshape(n, local).sum(1).tolist(), incoming.sum(1).tolist()
    rows = comm.all_to_all_single(x[tokens[order]], recv, send)
    starts = np.concatenate([[0], np.cumsum(incoming.ravel())])[:-1].reshape(n, local)
    by_expert = np.concatenate([np.arange(starts[i, j], starts[i, j] + incoming[i, j])
                                for j in range(local) for i in range(n)]).astype(int)
    ys, _ = experts_forward(params, rows[by_expert], incoming.sum(0))
    back_rows = np.empty_like(rows)
    back_rows[by_expert] = ys
    back = comm.all_to_all_single(back_rows, send, recv)
    out = np.zeros_like(x)
    np.add.at(out, tokens[order], weights.ravel()[order, None] * back)
    return out
    ### END SOLUTION


# %% tags=["check"]
grade.check_ep_forward(ep_forward)

# %% [markdown]
# **Exercise 5.4** — the backward. `cache` is the library forward's: `cache["order"]`,
# `cache["tokens"]`, `cache["weights"]` as above, `cache["back"]` the expert outputs that
# came home (in `order`), `cache["kept"]` the received rows each local expert computed (in
# expert order), `cache["rows"]` how many rows arrived, `cache["experts"]` the experts'
# cache, `cache["splits"]` the (send, receive) split sizes, `cache["route"]` the router's.
# Send the output gradients to the experts, run `experts_backward_input` and
# `experts_backward_weight`, send the input gradients home, and finish with
# `route_backward(params["router.w"], cache["route"], dweights)` (dweights: the gradient of
# the (T, k) weights) which returns `(dx, dlogits)`; the router's gradient is
# `x.T @ dlogits` (`cache["route"]["x"]` is x).

# %%
def ep_backward(comm, moe, params, cache, dy):
    ### BEGIN SOLUTION: Exercise 5.4: expert-parallel backward
    order, tokens, back, kept = cache["order"], cache["tokens"], cache["back"], cache["kept"]
    send, recv = cache["splits"]
    w = cache["weights"].ravel()
    dweights = np.zeros(len(w))
    dweights[order] = (dy[tokens[order]] * back).sum(-1)
    d_rows = comm.all_to_all_single(w[order, None] * dy[tokens[order]], recv, send)
    dxs = experts_backward_input(params, cache["experts"], d_rows[kept])
    grads = experts_backward_weight(params, cache["experts"], d_rows[kept])
    dx_rows = np.zeros((cache["rows"], dy.shape[1]))
    dx_rows[kept] = dxs
    dx_home = comm.all_to_all_single(dx_rows, send, recv)
    dx, dlogits = route_backward(params["router.w"], cache["route"], dweights.reshape(-1, moe.top_k))
    np.add.at(dx, tokens[order], dx_home)
    grads["router.w"] = cache["route"]["x"].T @ dlogits
    return dx, grads
    ### END SOLUTION


# %% tags=["check"]
grade.check_ep_backward(ep_backward)

# %% [markdown]
# ## 3. Capacity
#
# An expert's buffer has a fixed size in most implementations: the **capacity**,
# $\lceil c \cdot Tk/E \rceil$ assignments for a capacity factor $c$. When the router sends
# more, the ones past capacity are **dropped**: the token gets nothing from that expert
# (the residual connection around the layer still carries it). Which ones depends on the
# order the line forms in. **First come** (token order) is what this library's `nn.MoE`
# and the exercises use. **GShard's order** serves every token's first choice before any
# second choice (DeepSpeed's `top2gating` places the second choices after all the first:
# `deepspeed/moe/sharded_moe.py`), so a token loses its second expert before anyone loses
# a first. Dropless routing gives each expert whatever arrives, with variable-size
# buffers: no token lost, but memory and time set by the busiest expert.
#
# **Exercise 5.5** — which assignments fit. `expert_ids` lists the assignments in arrival
# order; return a boolean per assignment: kept if fewer than `capacity` earlier
# assignments went to the same expert.

# %%
def keep_within_capacity(expert_ids, n_experts, capacity):
    ### BEGIN SOLUTION: Exercise 5.5: capacity, first come first served
    onehot = expert_ids[:, None] == np.arange(n_experts)[None, :]
    place = np.cumsum(onehot, axis=0)[np.arange(len(expert_ids)), expert_ids] - 1
    return place < capacity
    ### END SOLUTION


# %% tags=["check"]
grade.check_capacity(keep_within_capacity)

# %% [markdown]
# A skewed router: 1024 tokens, 8 experts, top-2, at capacity factors 1 and 1.25, and
# dropless (the dropped assignments counted by `nn.MoE`). *Predict first*: does raising
# the capacity factor from 1 to 1.25 save the favourite expert's overflow, or mostly the
# others'?

# %%
skewed = nn.MoE(16, 32, 8, 2, dtype=np.float64)
sp = skewed.init(np.random.default_rng(3))
sp["router.w"] *= 30
u = np.ones(16) / 4.0  # a direction every token leans along; the router likes expert 0 along it
sp["router.w"][:, 0] += 0.8 * u
tokens_1k = np.random.default_rng(4).standard_normal((1024, 16)) + 2 * u
fig, ax = plt.subplots(figsize=(7.5, 2.8))
for i, cf in enumerate((None, 1.0, 1.25)):
    m = nn.MoE(16, 32, 8, 2, capacity_factor=cf, dtype=np.float64)
    _, c = m.forward(sp, tokens_1k)
    ax.bar(np.arange(8) + (i - 1) * 0.27, c["counts"], width=0.27, label=f"{'dropless' if cf is None else f'c = {cf}'}"
           f" ({c['dropped']} dropped)")
    if cf:
        ax.axhline(np.ceil(cf * 1024 * 2 / 8), ls="--", lw=1, color=f"C{i}")
ax.set_xlabel("expert")
ax.set_ylabel("assignments computed")
ax.set_title("skewed router, 1024 tokens, top-2: dashed lines are the capacities", fontsize=9)
ax.legend(frameon=False, fontsize=8)
plt.show()

# %% [markdown]
# Dropless keeps all 2048 assignments, but expert 0's buffer is twice the average (527
# against 256) and two others overflow too. Capacity caps every buffer: at 1.25 each of
# the three overflowing experts keeps 64 more than at 1.0, yet expert 0 still drops 207 of
# its 527. A larger buffer does not fix a skewed router. A **load-balancing loss** (Switch
# Transformer) pushes the router towards even use: $E\sum_e f_e P_e$, with $f_e$ the share
# of assignments expert $e$ received and $P_e$ its mean router probability (1 when
# perfectly balanced). `nn.MoE(aux_loss_coef=...)` adds its gradient to the router's.
# Training only the router on that loss for a few steps (*predict*: can the loss reach 1,
# and does the busiest expert's share fall as fast as the loss?):

# %%
trained = dict(sp)
history = []
balancer = nn.MoE(16, 32, 8, 2, aux_loss_coef=1.0, dtype=np.float64)
for step in range(30):
    out_, c = balancer.forward(trained, tokens_1k)
    history.append((c["aux_loss"], c["counts"].max() / c["counts"].mean()))
    g = balancer.backward(trained, c, np.zeros_like(out_))[1]
    trained["router.w"] = trained["router.w"] - 20.0 * g["router.w"]
fig, ax = plt.subplots(figsize=(7.5, 2.6))
ax.plot([h[1] for h in history], "o-", ms=3, label="busiest expert / mean")
ax.plot([h[0] for h in history], "s-", ms=3, label="load-balancing loss")
ax.axhline(1, color="grey", lw=1)
ax.set_xlabel("step (router trained on the auxiliary loss alone)")
ax.legend(frameon=False)
plt.show()
print(f"busiest expert / mean: {history[0][1]:.2f} -> {history[-1][1]:.2f}")

# %% [markdown]
# The loss first rises (a large step overshoots), then settles at 1 within about 15 steps.
# The busiest expert falls from twice the mean to a few percent above it and jitters
# there: the loss measures how the router's probabilities line up with the counts on
# average, and top-k's hard choices keep a little imbalance it cannot see.
#
# Back to the skewed router at capacity factor 1: the two orders of the line. *Predict*:
# does GShard's order drop fewer assignments than first come?

# %%
idx_1k, w_1k, _ = route(sp["router.w"], tokens_1k, 2)
cap_1k = capacity(1024, 2, 8, 1.0)
choice = np.tile([0, 1], 1024)  # first or second choice of its token
for name, keep in (("first come (token order)", keep_first(idx_1k.ravel(), 8, cap_1k)),
                   ("GShard (first choices first)", keep_first_choices_first(idx_1k.ravel(), 8, cap_1k, 2))):
    lost = ~keep.reshape(1024, 2)
    print(f"{name:29s}: {(~keep).sum()} dropped, of them {(~keep & (choice == 0)).sum():3d} first choices; "
          f"tokens left with no expert {lost.all(1).sum():3d}; router weight dropped {w_1k[lost].sum():6.1f}")
print(f"expert 0 is the first choice of {(idx_1k[:, 0] == 0).sum()} tokens, for {cap_1k} places")

# %% [markdown]
# The same number dropped: each expert keeps its first `capacity` either way, and its
# overflow does not depend on the order. Who is dropped does: first come drops whatever
# arrives late, first choices included, and leaves 169 tokens with no expert at all;
# GShard's order drops second choices first and loses a first choice only where an
# expert's first choices alone overflow it (here only the favourite, chosen first by 358
# tokens for 256 places), so fewer tokens lose everything and less of the router's weight
# is dropped.
#
# **Exercise 5.6** — capacity with expert parallelism. The layer `moe` now has a
# `moe.capacity_factor`; the result must be what one device computes on every rank's tokens
# together: each expert keeps the first `capacity(T_all, k, E, moe.capacity_factor)`
# assignments of the whole batch in token order (rank 0's tokens, then rank 1's, ...; `T_all`
# counts every rank's tokens) and a dropped assignment contributes nothing. Start from your
# Exercise 5.3; the rows that arrive at an expert's rank, taken by source rank, are already in
# that order, so your `keep_within_capacity` (5.5) decides there. Send back zeros for the
# dropped rows (or do not send them at all).

# %%
def ep_forward_capacity(comm, moe, params, x):
    ### BEGIN SOLUTION: Exercise 5.6: expert parallelism with capacity
    n, k = comm.size, moe.top_k
    local = moe.n_experts // n
    idx, weights, _ = route(params["router.w"], x, k)
    ids, tokens = idx.ravel(), np.repeat(np.arange(len(x)), k)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=moe.n_experts)
    incoming = comm.all_to_all_single(counts).reshape(n, local)  # [from rank, my expert]
    send, recv = counts.reshape(n, local).sum(1).tolist(), incoming.sum(1).tolist()
    rows = comm.all_to_all_single(x[tokens[order]], recv, send)
    starts = np.concatenate([[0], np.cumsum(incoming.ravel())])[:-1].reshape(n, local)
    by_expert = np.concatenate([np.arange(starts[i, j], starts[i, j] + incoming[i, j])
                                for j in range(local) for i in range(n)]).astype(int)  # by expert, then source rank
    mine = np.repeat(np.arange(local), incoming.sum(0))  # the local expert of each row in by_expert's order
    keep = keep_within_capacity(mine, local, capacity(n * len(x), k, moe.n_experts, moe.capacity_factor))
    ys, _ = experts_forward(params, rows[by_expert[keep]], np.bincount(mine[keep], minlength=local))
    back_rows = np.zeros_like(rows)  # a dropped row comes back as zeros
    back_rows[by_expert[keep]] = ys
    back = comm.all_to_all_single(back_rows, send, recv)
    out = np.zeros_like(x)
    np.add.at(out, tokens[order], weights.ravel()[order, None] * back)
    return out
    ### END SOLUTION


# %% tags=["check"]
grade.check_ep_capacity(ep_forward_capacity)

# %% [markdown]
# Dropped rows still travel here, both ways: the owner is the first to know which ones
# fit. A rank that knows every rank's counts (an all-gather of them instead of an
# all-to-all) can work out its own rows' places in each line and send only those that fit.
# The library's layer does that (`emulator.parallel.expert_parallel.token_groups`: one
# all-gather of each rank's per-expert counts, which also gives the load-balancing loss the
# whole group's statistics, however many tokens each rank holds): its dispatch carries kept
# rows only.
#
# ## 4. Imbalance is time
#
# With experts split over ranks, the busiest expert's rank computes longest, and every
# other rank waits for it in the combine. The same skewed router on 4 ranks (compute
# charged at a slow 10 GFLOP/s, so that the experts' time stands out from the host's
# launches, 7 µs per kernel, which at a real GPU's speed would hide it in a layer this
# small). *Predict first*: which
# rank finishes last, and what do the others do meanwhile?

# %%
def skewed_layer(comm):
    local = ep.shard_experts(sp, comm.size, comm.rank)
    return ep.forward(comm, nn.MoE(16, 32, 8, 2, dtype=np.float64), local, np.split(tokens_1k, 4)[comm.rank])[1]


world = World(4, topology=Topology(flops=1e10))
caches = world.run(skewed_layer)
viz.gantt(world.timeline(), title="expert parallel forward: rank 0 holds the favourite expert")
plt.show()
for r, c in enumerate(caches):
    print(f"rank {r}: experts {2 * r}, {2 * r + 1} computed {c['counts'].sum()} rows; busy "
          f"{world.timeline().total('compute', r) * 1e6:.0f} us of {world.timeline().makespan * 1e6:.0f}")

# %% [markdown]
# Rank 0, holding the favourite expert, computes nearly five times as many rows as rank
# 3; rank 3 then sits idle (grey) until rank 0 is ready for the combine's all-to-all. The
# layer runs at the pace of the busiest rank, whatever the others hold.
#
# ## 5. The all-to-all across nodes
#
# An all-to-all sends a message to every other rank: across two nodes of 8, each GPU sends
# 8 of its 15 messages over its NIC. NCCL posts all of them at once (one send and one
# receive per peer in one group: nccl-tests' `alltoall.cu`, NCCL's own `ncclAlltoAll`),
# so they share the links together and the busiest port, the NIC, sets the time: its bytes
# over its bandwidth, plus one latency. DeepSeek-V3 dispatches in two hops instead (its
# report, section 3.2.2, and DeepEP's internode kernels): first over InfiniBand, to the
# GPU with the same local index on each target node (the same rail), then over NVLink
# inside that node to the GPU that holds the expert. *Predict first*: for a plain
# all-to-all, which wins, and at which sizes? Measured inside one node and across two:

# %%
topo = Topology(gpus_per_node=8)
print(f"{'bytes per pair':>15s} {'8 GPUs, 1 node':>15s} {'16 GPUs, flat':>14s} {'16 GPUs, 2 hops':>16s}")
for size in (256, 4096, 65536, 1048576):
    times = []
    for n, fn in ((8, lambda comm, ch: comm.all_to_all(ch)), (16, lambda comm, ch: comm.all_to_all(ch)),
                  (16, lambda comm, ch: hierarchical_all_to_all(comm, ch, 8))):
        w = World(n, topology=topo)
        w.run(lambda comm: fn(comm, [np.zeros(size // 4, np.float32) for _ in range(n)]))
        times.append(max(w.stats().time))
    print(f"{size:>15,d} " + " ".join(f"{t * 1e6:>13.1f}us" for t in times))

# %% [markdown]
# The flat all-to-all wins at every size: the two hops put the same bytes through each NIC
# and add an NVLink hop. At 1 MiB per pair each NIC carries 8 MiB, about 180 us at 48 GB/s;
# a schedule that sent one pair at a time, as slow as its slowest pair, would take 15 of
# those cross-node messages in a row, 400 us. What the two hops buy is in the tokens, not
# the schedule: an MoE token goes to $k$ experts, and when several of them sit on one
# node the flat dispatch sends it over the NIC once per GPU, the two-hop dispatch once per
# node (NVLink fans it out there). DeepSeek-V3 adds node-limited routing: each token's 8
# experts lie on at most 4 nodes (report, section 2.1.2), so it crosses InfiniBand at most
# 4 times. Two nodes of 8 GPUs, each token to 8 GPUs drawn at random, rows of 7168 bytes
# (DeepSeek-V3's width in FP8), flat against two hops as the tokens per GPU grow:

# %%
rng_d = np.random.default_rng(7)
print(f"{'tokens per GPU':>14s} {'flat':>9s} {'2 hops':>9s}   {'NIC bytes per GPU, flat / 2 hops':>32s}")
for per_gpu in (1, 16, 32, 128):
    xs_d = [np.zeros((per_gpu, 7168), np.uint8) for _ in range(16)]
    dests = [np.argsort(rng_d.random((per_gpu, 16)), 1)[:, :8] for _ in range(16)]  # 8 GPUs per token
    dests = [(d[:, :, None] == np.arange(16)).any(1) for d in dests]  # as a (tokens, ranks) mask
    row = []
    for fn in (lambda comm: flat_dispatch(comm, xs_d[comm.rank], dests[comm.rank]),
               lambda comm: two_hop_dispatch(comm, xs_d[comm.rank], dests[comm.rank], 8)):
        w = World(16, topology=topo)
        w.run(fn)
        row.append((max(w.stats().time), sum(t.nbytes for t in w.trace if t.link == "nic") / 16))
    print(f"{per_gpu:>14d} {row[0][0] * 1e6:>7.1f}us {row[1][0] * 1e6:>7.1f}us   {row[0][1] / 1e3:>14,.0f} kB / "
          f"{row[1][1] / 1e3:,.0f} kB")

# %% [markdown]
# A quarter of the NIC bytes with two hops: each token's 8 GPUs put about 4 on the other
# node, and the two-hop dispatch sends it there once. With a handful of tokens the extra
# hop's latencies (five small operations against two) decide and the flat dispatch wins;
# from about 32 tokens per GPU the NIC bytes decide and the two hops win, by more as the
# batch grows (a training batch has thousands of tokens per GPU).
#
# ## 6. EP or TP for the experts?
#
# Tensor parallelism could split every expert instead: each rank holds a slice of all
# experts, computes all tokens on its slices, and all-reduces the dense (T, d) output.
# Expert parallelism keeps each expert's matrices whole and moves only the routed rows.
# The same layer on 8 ranks of one node, 1024 tokens, at two widths $d$ (narrow experts,
# d_ff = 64, keep the notebook quick; the bytes depend on $d$; compute charged at an
# H100's peak, each kernel launched by the host as the default `megatron-core` stack does).
# *Predict first*: does the layer that sends fewer bytes always finish first?

# %%
for d in (64, 2048):
    big = nn.MoE(d, 64, 8, 2, dtype=np.float32)
    bp = big.init(np.random.default_rng(5))
    tokens_1k_d = np.random.default_rng(6).standard_normal((1024, d)).astype(np.float32)
    ref_y, _ = big.forward(bp, tokens_1k_d)
    runs = {"TP 8 (slices of every expert)": lambda comm: tp_moe_forward(
                comm, big, shard_experts_tp(bp, 8, comm.rank), tokens_1k_d),
            "EP 8 (one whole expert each)": lambda comm: ep.forward(
                comm, big, ep.shard_experts(bp, 8, comm.rank), np.split(tokens_1k_d, 8)[comm.rank])[0]}
    for name, fn in runs.items():
        w = World(8)
        res = w.run(fn)
        got = res[0] if name.startswith("TP") else np.concatenate(res)
        assert np.abs(got - ref_y).max() < 1e-6   # float32 round-off; its digits vary by CPU
        host = sum(e.end - e.start for e in w.timeline().events if e.rank == 0 and e.name == "wait the host")
        print(f"d={d:4d} {name:30s}: {w.stats().bytes_sent[0] / 1e6:6.2f} MB sent per rank, "
              f"{max(w.stats().time) * 1e6:5.1f} us (GPU waiting for the host {host * 1e6:4.1f}); "
              "equal to one device within 1e-6")

# %% [markdown]
# TP replicates the tokens on every rank and all-reduces dense outputs; EP sends each token
# only where it is routed: a quarter of the bytes here (top-2 of 8). Fewer bytes is not
# yet less time at $d = 64$: the whole layer takes tens of microseconds, about what the
# host needs to issue its kernels (7 µs each), and EP's layer has more of them (the
# router's top-k, the permutation, the all-gather of the counts, two all-to-alls), so its
# GPU waits for the host and TP finishes first. At $d = 2048$ TP's all-reduce of the dense
# output has grown with $d$ while EP's all-to-alls, one latency each (every message at
# once, against the ring all-reduce's 14 steps), carry a quarter of its bytes: EP wins, and
# the wider the layer, the more. With EP equal to the number of experts each rank holds one whole
# expert, its GEMMs full size, and every row that arrives is for that expert: the local
# permutation of tokens by expert, and its inverse, are not needed (Megatron-Core's MoE
# README, its guideline 4, "Prefer EP over TP for Expert Layers": "When `EP = num_experts`,
# local token permutation is eliminated"; `megatron/core/transformer/moe/README.md`,
# `NVIDIA/Megatron-LM` commit d98e8a6).
#
# ## 7. Composition: different splits for attention and experts
#
# Attention and MoE layers need not use the same groups. On 8 ranks, attention may run
# TP 2 x DP 4 while the experts run EP 4 x expert-DP 2: the same ranks, grouped two ways.
# Expert parallelism takes its ranks from the data-parallel ones (and the context-parallel
# ones, when there are any), so the degrees do not simply multiply.

# %%
attention, experts = Mesh({"dp": 4, "tp": 2}), Mesh({"edp": 2, "ep": 4})
for r in range(8):
    print(f"rank {r}: attention TP group {list(attention.group_ranks('tp', r))}, DP group "
          f"{list(attention.group_ranks('dp', r))} | experts EP group {list(experts.group_ranks('ep', r))}, "
          f"expert-DP group {list(experts.group_ranks('edp', r))}")

# %% [markdown]
# That is Megatron's expert tensor parallelism of 1: each expert whole on one rank. The
# library's mesh runtime (lesson 06) keeps the attention's tensor parallelism inside the
# experts too (expert tensor parallelism equal to TP) and carves the expert groups from the
# data-parallel ranks of each TP slice; `ParallelDims` says which ranks form which group:

# %%
dims = ParallelDims(dp=4, tp=2, ep=4)
for r in range(8):
    g = dims.groups_of(r)
    print(f"rank {r}: TP {list(g['tp'])}, DP {list(g['dp'])} | EP {list(g['ep'])} (each expert's hidden units "
          f"split over TP), expert-DP {list(g['edp'])}")

# %% [markdown]
# Hence the bound: the expert groups are cut from the `dp x cp` ranks of each TP slice, so
# `ep` must divide `dp x cp`. The common rule "EP is bounded by DP" is that rule when
# there is no context parallelism (cp = 1); with it, the context-parallel ranks, which hold
# the same weights as the data-parallel ones, can hold experts too. *Predict first*: on 8
# GPUs with TP 2, which of these does `ParallelDims` accept for Mixtral 8x22B's 8 experts?

# %%
from emulator.planner import model_preset

mixtral = model_preset("mixtral-8x22b")
for plan in (ParallelDims(dp=4, tp=2, ep=4), ParallelDims(dp=4, tp=2, ep=8), ParallelDims(dp=2, cp=2, tp=2, ep=4),
             ParallelDims(dp=2, tp=2, pp=2, ep=4)):
    found = plan.problems(mixtral)
    print(f"{str(plan):38s} " + ("accepted" if not found else "refused: " + "; ".join(found)))

# %% [markdown]
# ## 8. Three published MoE models
#
# Experts per GPU and the all-to-all bytes per layer per GPU (forward dispatch and combine,
# bf16, 4096 tokens per GPU), from each model's published shape. The parallelism is
# DeepSeek-V3's own; Mistral and Qwen published none for their training, so theirs are
# NVIDIA Megatron-Bridge recipes, a framework's starting points (the sources are printed):

# %%
print(f"{'model':16s} {'experts':>8s} {'top-k':>6s} {'d_model':>8s} {'EP':>4s} {'PP':>4s} {'TP':>4s} "
      f"{'experts/GPU':>12s} {'MB per layer':>13s}")
for name, m in CASE_STUDIES.items():
    mb = all_to_all_bytes_per_layer(4096, m["d_model"], m["top_k"], m["ep"]) / 1e6
    print(f"{name:16s} {m['n_experts']:>8d} {m['top_k']:>6d} {m['d_model']:>8d} {m['ep']:>4d} {m['pp']:>4d} "
          f"{m['tp']:>4d} {experts_per_gpu(m['n_experts'], m['ep']):>12d} {mb:>13.0f}")
for name, m in CASE_STUDIES.items():
    print(f"  {name}: shape from {m['source']}; parallelism {m['parallelism']}")

# %% [markdown]
# DeepSeek-V3 spreads 256 experts over 64 GPUs (8 nodes), 4 per GPU, each token to 8
# experts: hundreds of MB per layer, most of it across nodes, which is why its dispatch is
# in FP8, why each token is limited to 4 nodes and crosses InfiniBand once per node, and
# why dispatch and combine get kernels of their own rather than a general all-to-all, which
# knows nothing of the routing, the node limit or the SMs the experts' GEMMs need beside
# it. DeepSeek wrote DeepEP for this, down to hand-written PTX (its V1 documentation's
# "Undefined-behavior PTX usage": a read-only `ld.global.nc.L1::no_allocate.L2::256B` load
# used to read volatile data, for speed; `docs/legacy.md` of `deepseek-ai/DeepEP`, commit
# dd758ca); NVIDIA added Hybrid-EP to it, a backend that moves tokens over NVLink with the
# Tensor Memory Accelerator (TMA) instructions to take as few SMs as it can
# (`docs/README_Hybrid-EP.md` on DeepEP's `hybrid-ep` branch, commit 94a9f8f).
#
# **Napkin 5.1** — the forward all-to-all bytes one GPU sends per MoE layer (dispatch and
# combine), for `tokens` tokens on the GPU, width `d_model`, `top_k` experts per token
# spread evenly over `ep` GPUs, `dtype_bytes` per value.

# %%
def napkin_a2a_bytes(tokens=4096, d_model=7168, top_k=8, ep=64, dtype_bytes=2):
    ### BEGIN SOLUTION: Napkin 5.1: all-to-all bytes per layer
    return 2 * tokens * top_k * d_model * dtype_bytes * (ep - 1) / ep
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_a2a(napkin_a2a_bytes)

# %% [markdown]
# **Napkin 5.2** — `tokens` tokens each choose `top_k` of `n_experts` experts; one expert
# receives `hot_share` of all assignments and the others share the rest evenly. With
# capacity $\lceil c\,Tk/E \rceil$ per expert (`capacity_factor` c), how many assignments
# are dropped?

# %%
def napkin_dropped(tokens=4096, top_k=2, n_experts=8, capacity_factor=1.25, hot_share=0.3):
    ### BEGIN SOLUTION: Napkin 5.2: tokens dropped under skew
    total = tokens * top_k
    cap = np.ceil(capacity_factor * total / n_experts)
    rest = (1 - hot_share) * total / (n_experts - 1)
    return max(0.0, hot_share * total - cap) + (n_experts - 1) * max(0.0, rest - cap)
    ### END SOLUTION


# %% tags=["check"]
grade.napkin_drops(napkin_dropped)

# %% [markdown]
# ## 9. Explore
#
# Experts, k, capacity factor, how much the router favours one expert, and the EP size:
# tokens per expert against capacity, the dropped ones, and each rank's all-to-all bytes
# and time, measured on the emulator.

# %% tags=["nbval-ignore-output"]
from emulator.widgets import RoutingExplorer

RoutingExplorer(n_experts=8, top_k=2, capacity_factor=1.25, skew=1.0, ep=4)

# %% [markdown]
# ## 10. On real GPUs
#
# `gpu_labs/05_expert_parallel.py` runs the expert-parallel layer over
# `torch.distributed.all_to_all_single` with split sizes (counts exchanged first), forward
# and backward, against the dense single-process layer; on GPUs it times dispatch and
# combine beside the emulator's prediction, and records its calls for comparison:
#
# ```
# torchrun --standalone --nproc-per-node 4 -m gpu_labs.05_expert_parallel
# ```
#
# **Next:** lesson 06 puts DP, TP, PP, CP and EP on one mesh.
