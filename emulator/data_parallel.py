"""Data parallelism from DDP to ZeRO-3 (FSDP), as per-rank programs on the emulator.

Every rank holds the model (or a shard of it), takes 1/n of each global batch, and the
ranks agree on the update. What differs is what each rank keeps and which collective
makes them agree (Rajbhandari et al., "ZeRO", 2020):

* stage 0 (DDP): everything replicated; one all-reduce of the gradients per step.
* stage 1: optimizer state sharded. Reduce-scatter the gradients (each rank gets the sum
  for its slice), update the slice, all-gather the parameters: the same bytes as the
  all-reduce, because all-reduce = reduce-scatter + all-gather.
* stage 2: gradients sharded too: each layer's gradient is reduce-scattered as soon as
  backward produces it, and the full copy freed at once.
* stage 3 (FSDP): parameters sharded too: a layer's parameters are all-gathered just before
  its forward, freed after it, gathered again for its backward: 3 x the parameter bytes
  of traffic instead of 2 x.

The unit of sharding is a layer of ``model.layers``: its parameters flattened into one
vector (``FlatLayout``), padded to a multiple of n, rank r owning the r-th slice.
Every rank records what it holds in its memory ledger (params, grads, optimizer,
activations, and gathered or full-size temporaries under buffers) and charges its compute
to the simulated clock (2 FLOPs per parameter per token forward, 4 backward).
"""

from dataclasses import dataclass

import numpy as np
from ml_dtypes import bfloat16

from . import nn
from .nn.module import sub


@dataclass
class FlatLayout:
    """A layer's parameters as one flat vector of ``padded`` elements (a multiple of n)."""

    names: list
    shapes: list
    offsets: list
    size: int
    padded: int

    @classmethod
    def of(cls, params, n):
        names = sorted(params)
        shapes = [params[k].shape for k in names]
        sizes = [int(np.prod(s)) for s in shapes]
        offsets = list(np.cumsum([0] + sizes[:-1]))
        size = sum(sizes)
        return cls(names, shapes, offsets, size, -(-size // n) * n)

    def flatten(self, params, dtype=None):
        dtype = dtype or params[self.names[0]].dtype
        flat = np.zeros(self.padded, dtype)
        for k, off, shape in zip(self.names, self.offsets, self.shapes):
            flat[off:off + int(np.prod(shape))] = params[k].reshape(-1)
        return flat

    def unflatten(self, flat):
        return {k: flat[off:off + int(np.prod(shape))].reshape(shape)
                for k, off, shape in zip(self.names, self.offsets, self.shapes)}

    def shard(self, flat, rank, n):
        s = self.padded // n
        return flat[rank * s:(rank + 1) * s].copy()


def layouts(model, params, n):
    return {name: FlatLayout.of(sub(params, name), n) for name, _ in model.layers}


# --------------------------------------------------------------------------- pieces
def zero1_update(comm, flat_params, flat_grads, opt, state):
    """ZeRO-1 on one flat vector: reduce-scatter the gradient, update this rank's slice with
    its optimizer state, all-gather the updated slices. Returns (full params, state)."""
    n, r = comm.size, comm.rank
    g = comm.reduce_scatter(flat_grads) / n  # the mean gradient of my slice
    s = flat_params.shape[0] // n
    new, state = opt.step({"flat": flat_params[r * s:(r + 1) * s]}, {"flat": g}, state)
    return comm.all_gather(new["flat"]), state


def gather_layer(comm, layout, shard, name, async_op=False):
    """ZeRO-3: all-gather a layer's parameter shards into full tensors (held as buffers
    until :func:`free_layer`). With ``async_op`` returns a handle whose ``wait()`` does it."""
    h = comm.all_gather(shard, async_op=True)

    def finish():
        full = h.wait()
        comm.memory.hold(f"gathered:{name}", full, "buffers")
        return layout.unflatten(full)

    if async_op:
        return _Deferred(finish)
    return finish()


def free_layer(comm, name):
    comm.memory.release(f"gathered:{name}")


class _Deferred:
    def __init__(self, fn):
        self._fn, self._done, self._value = fn, False, None

    def wait(self):
        if not self._done:
            self._value, self._done = self._fn(), True
        return self._value


# --------------------------------------------------------------------------- training
def _upcast(params):
    """Mixed precision: bf16 parameters are used in fp32 (the forward and backward run in
    fp32; only storage and communication are bf16)."""
    return {k: v.astype(np.float32) if v.dtype == bfloat16 else v for k, v in params.items()}


def _forward_backward(comm, model, get_params, x, y, on_layer_grads, done_with_params=None):
    """Forward through the layers, backward in reverse. ``get_params(name, next_name)``
    gives a layer's parameters (``next_name``: the layer that runs after it, for
    prefetching); ``on_layer_grads(name, grads)`` is called as soon as a layer's gradients
    exist. Returns the local loss."""
    tokens = np.asarray(x).size
    caches, h = {}, x
    names = [n for n, _ in model.layers]
    for i, (name, layer) in enumerate(model.layers):
        p = get_params(name, names[i + 1] if i + 1 < len(names) else None)
        h, caches[name] = layer.forward(_upcast(p), h)
        comm.compute(flops=2 * sum(v.size for v in p.values()) * tokens, name=f"F {name}")
        if done_with_params:
            done_with_params(name)
        comm.memory.hold(f"act:{name}", caches[name], "activations")  # every array in the cache
    loss, lcache = nn.cross_entropy(h, y)
    dy = nn.cross_entropy_backward(lcache)
    for i, (name, layer) in reversed(list(enumerate(model.layers))):
        p = get_params(name, names[i - 1] if i > 0 else None)
        up = _upcast(p)
        dx = layer.backward_input(up, caches[name], dy)
        grads = layer.backward_weight(up, caches[name], dy)
        comm.compute(flops=4 * sum(v.size for v in p.values()) * tokens, name=f"B {name}")
        comm.memory.release(f"act:{name}")
        del caches[name]
        if done_with_params:
            done_with_params(name)
        on_layer_grads(name, {k: g.astype(p[k].dtype) for k, g in grads.items()})
        dy = dx
    return loss


def data_parallel_train(comm, model, params, batches, opt, stage=0, prefetch=False):
    """Train ``model`` from ``params`` on ``batches`` (a list of global (x, y)) with ZeRO
    ``stage`` 0-3 on this rank. ``opt`` is an :class:`emulator.nn.AdamW` (with
    ``mixed_precision=True`` when params are bf16). Returns a dict with the local
    ``losses``, the ``shards`` this rank owns per layer (stages 1-3) and, for stages 0-2,
    the full ``params`` every rank ends with.

    Stage 0 all-reduces each layer's gradients (one bucket per layer) asynchronously as soon
    as backward produces them, so they travel behind the rest of the backward pass, and
    waits for all of them before the optimizer step, as PyTorch's DDP does."""
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"stage must be 0 (DDP), 1, 2 or 3, got {stage!r}")
    n, r = comm.size, comm.rank
    for x, _ in batches:
        if len(x) % n:
            raise ValueError(f"a global batch of {len(x)} examples does not split over {n} ranks; "
                             f"data parallelism needs a multiple of {n} (and at least {n})")
    lay = layouts(model, params, n)
    mem = comm.memory
    full = {name: sub(params, name) for name in lay}  # the layer's full params (stages 0-2)
    shards = {name: lay[name].shard(lay[name].flatten(full[name]), r, n) for name in lay}
    if stage < 3:
        mem.hold("params", full, "params")
    else:
        mem.hold("params", shards, "params")
        full = None
    if stage == 0:
        state = opt.init(params)
    else:
        state = {name: opt.init({"flat": shards[name]}) for name in lay}
    mem.hold("optimizer", state, "optimizer")
    losses = []
    for x, y in batches:
        b = len(x) // n
        xl, yl = x[r * b:(r + 1) * b], y[r * b:(r + 1) * b]
        grads, grad_shards, pending = {}, {}, {}

        def get_params(name, nxt):
            if stage < 3:
                return full[name]
            got = pending.pop(name, None)
            p = got.wait() if got else gather_layer(comm, lay[name], shards[name], name)
            if prefetch and nxt is not None:  # start the next layer's gather behind this compute
                pending[nxt] = gather_layer(comm, lay[nxt], shards[nxt], nxt, async_op=True)
            return p

        def on_layer_grads(name, g):
            if stage == 0:  # one bucket per layer, reduced behind the rest of backward
                flat = lay[name].flatten(g)
                mem.hold(f"grads:{name}", flat, "grads")
                pending[name] = comm.all_reduce(flat, async_op=True)
                return
            if stage == 1:
                grads[name] = g
                mem.hold(f"grads:{name}", g, "grads")
                return
            flat = lay[name].flatten(g)  # stages 2 and 3: reduce-scatter now, keep only my slice
            mem.hold(f"fullgrad:{name}", flat, "buffers")
            grad_shards[name] = comm.reduce_scatter(flat) / n
            mem.release(f"fullgrad:{name}")
            mem.hold(f"grads:{name}", grad_shards[name], "grads")

        loss = _forward_backward(comm, model, get_params, xl, yl, on_layer_grads,
                                 done_with_params=(lambda name: free_layer(comm, name)) if stage == 3 else None)
        losses.append(loss)
        if stage == 0:
            mean = {}
            for name in lay:
                reduced = lay[name].unflatten(pending.pop(name).wait() / n)
                mean.update({f"{name}.{k}": v for k, v in reduced.items()})
            params, state = opt.step(params, mean, state)
            full = {name: sub(params, name) for name in lay}
        elif stage == 1:
            for name in lay:
                flat = lay[name].flatten(grads[name])
                full_flat, state[name] = zero1_update(comm, lay[name].flatten(full[name]), flat, opt, state[name])
                full[name] = lay[name].unflatten(full_flat)
        else:
            for name in lay:
                new, state[name] = opt.step({"flat": shards[name]}, {"flat": grad_shards[name]}, state[name])
                shards[name] = new["flat"]
                if stage == 2:
                    full[name] = lay[name].unflatten(comm.all_gather(shards[name]))
        for name in lay:
            mem.release(f"grads:{name}")
        if stage < 3:
            params = {f"{name}.{k}": v for name, p in full.items() for k, v in p.items()}
            mem.release("params")
            mem.hold("params", full, "params")
    if stage == 0:
        shards = None
    elif stage < 3:
        shards = {name: lay[name].shard(lay[name].flatten(full[name]), r, n) for name in lay}
    return {"losses": losses, "shards": shards, "params": params if stage < 3 else None}


def assemble(model, params0, results):
    """Full parameters from every rank's shards (global view, no messages)."""
    n = len(results)
    lay = layouts(model, params0, n)
    out = {}
    for name, layout in lay.items():
        flat = np.concatenate([res["shards"][name] for res in results])
        out.update({f"{name}.{k}": v for k, v in layout.unflatten(flat).items()})
    return out


def train_single(model, params, batches, opt):
    """The reference: one device, the whole global batch. Returns (params, losses)."""
    state = opt.init(params)
    losses = []
    for x, y in batches:
        logits, cache = model.forward(_upcast(params), x)
        loss, lc = nn.cross_entropy(logits, y)
        _, grads = model.backward(_upcast(params), cache, nn.cross_entropy_backward(lc))
        params, state = opt.step(params, {k: g.astype(params[k].dtype) for k, g in grads.items()}, state)
        losses.append(loss)
    return params, losses


def synthetic_batches(steps, batch, seq, vocab, seed=0):
    """Token sequences with a learnable rule (each next token = previous + 1 mod vocab,
    from a random start, with a little noise), as a list of global (x, y) batches."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        start = rng.integers(0, vocab, (batch, 1))
        seqs = (start + np.arange(seq + 1)) % vocab
        noise = rng.random(seqs.shape) < 0.05
        seqs = np.where(noise, rng.integers(0, vocab, seqs.shape), seqs)
        out.append((seqs[:, :-1], seqs[:, 1:]))
    return out
