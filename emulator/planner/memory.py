"""Per-GPU memory of a plan: what each rank's ledger holds at its peak, by kind.

The parts, as the emulator's strategies hold them (:mod:`emulator.parallel.data_parallel.ddp`,
``zero1``..``zero3``, :class:`~emulator.parallel.pipeline.PipelineStage`):

* ``params``: this rank's parameters (ZeRO-3: its slice of each layer's flat vector,
  padded to a multiple of the group); ``optimizer``: Adam's state for what it updates
  (the precision policy's master copy and moments: 12 bytes per element under
  Megatron's bf16; ZeRO-1/2/3: its slice only);
* ``grads``: DDP's bucket per layer and ZeRO-1's full gradients, from a layer's first
  backward to the update; ZeRO-2/3's slice; each held from the layer's first backward;
* ``activations``: what each layer's forward keeps, per micro-batch in flight, released
  layer by layer as backward passes (a split backward keeps them, and the output
  gradients, until ``W``);
* ``buffers``: ZeRO-3's gathered layer while it is used, ZeRO-2/3's full gradient while it
  is reduce-scattered, ring attention's K/V blocks (two in forward, with dK/dV four in
  backward) while its core runs.

:func:`stage_peaks` walks each pipeline rank's actions (the schedule's own lists) layer by
layer and returns every rank's peak and its breakdown, as the ledger records them.
"""

from functools import lru_cache
from types import MappingProxyType

import numpy as np

from ..machine.work import dtype_bytes
from ..parallel.data_parallel.buckets import bucket_layers, bucket_limit
from ..parallel.data_parallel.ladder import fsdp_whole_in_pipeline
from ..parallel.pipeline import schedule
from ..parallel.pipeline.actions import stage_of

KINDS = ("params", "grads", "optimizer", "activations", "buffers")


def shard_groups(dims):
    """Ranks each kind of parameter unit is sharded and reduced over: ``dense`` over
    ``dp x cp``, ``experts`` over ``dp x cp / ep`` (:data:`emulator.mesh.REDUCED_OVER`)."""
    return {"dense": dims.dp * dims.cp, "experts": dims.dp * dims.cp // dims.ep}


def updated_elements(layer, groups, zero_stage):
    """Elements of ``layer`` one rank's optimizer updates: all of them under ZeRO-0 or in a
    group of one, else its shard of each unit (``groups``: ranks per unit kind, ``dense``
    and ``experts``), as the data-parallel strategies count them."""
    return sum(elems if (zero_stage == 0 or groups[group] == 1) else -(-elems // groups[group])
               for group, elems in layer.params.items())


def padded(elems, n):
    return -(-elems // n) * n


@lru_cache(maxsize=64)
def byte_sizes(ctx):
    """Bytes per parameter element, by what holds or sends it, under ``ctx``'s precision
    policy: the weights, the gradients, the optimizer (master copy and two moments), ZeRO's
    all-gather of the weights, the data-parallel reduction. Read-only: one table per policy."""
    per = ctx.precision.bytes_per_param(default=ctx.array)
    return MappingProxyType({"params": per["params"], "grads": per["grads"], "optimizer": per["optimizer"],
                             "gather": dtype_bytes(ctx.dtype("param_gather")),
                             "reduce": dtype_bytes(ctx.dtype("grad_reduce"))})


def unsharded_in_pipeline(dims, ctx):
    """Whether ``dims``'s ZeRO-3 runs as FSDP2 inside torch's pipelining: each stage's layers
    gathered from their first forward and their gradients kept whole to the step's end, one
    reduce-scatter per layer after the flush (:class:`~emulator.parallel.data_parallel.
    fsdp_pipeline.FSDPInPipeline`)."""
    return fsdp_whole_in_pipeline(ctx.stack, dims.zero_stage, dims.pp > 1)


class Units:
    """One rank's units (a layer's parameters that reduce over one group) and their bytes."""

    def __init__(self, layers, dims, ctx):
        groups = shard_groups(dims)
        sizes = byte_sizes(ctx)
        param_bytes, opt, grad_bytes, gather = sizes["params"], sizes["optimizer"], sizes["grads"], sizes["gather"]
        whole = unsharded_in_pipeline(dims, ctx)  # its gradients whole until the step's reduce-scatter
        self.z, self.pb = dims.zero_stage, param_bytes
        self.params = self.optimizer = 0
        self.per_layer = []  # per layer: (grads held once its backward ran, gathered, full-gradient buffer)
        for layer in layers:
            grads = gathered = fullgrad = 0
            for group, elems in layer.params.items():
                if not elems:
                    continue
                n = groups[group]
                full, mine = padded(elems, n), padded(elems, n) // n
                self.params += (mine if self.z == 3 else elems) * param_bytes
                self.optimizer += (elems if self.z == 0 else mine) * opt
                grads += (elems if self.z <= 1 else full if whole else mine) * grad_bytes
                gathered += full * gather if self.z == 3 else 0
                fullgrad += full * grad_bytes if (self.z >= 2 and not whole) else 0
            self.per_layer.append((grads, gathered, fullgrad))


def _ddp_buckets(units, dims, ctx, pp_rank):
    """DDP's gradients come bucket by bucket (:mod:`emulator.parallel.data_parallel.buckets`): each
    bucket's bytes held from the first backward of its first layer (backward order)."""
    order = [(c, i) for c in reversed(range(len(units))) for i in reversed(range(len(units[c].per_layer)))]
    grads = [units[c].per_layer[i][0] for c, i in order]
    param_bytes = dtype_bytes(ctx.dtype("params"))
    limit, first = bucket_limit(ctx.stack, dims.dp * dims.cp, pp_rank, param_bytes)
    scale = param_bytes / byte_sizes(ctx)["grads"]  # DDP cuts by the weights' bytes
    buckets = bucket_layers([g * scale for g in grads], limit, first)
    new = {}
    for bucket in buckets:
        for j in bucket:
            new[order[j]] = 0
        new[order[bucket[0]]] = sum(grads[j] for j in bucket)
    for (c, i), g in new.items():
        _, gathered, fullgrad = units[c].per_layer[i]
        units[c].per_layer[i] = (g, gathered, fullgrad)


def _profile(kept, units, kind, first, grad_out, held, release, transient, loss=0.0, keep=False, for_w=None):
    """(peak over the action of (activations, grads, buffers) changes, net change) for one
    pass over a chunk's layers: ``kind`` F, B (unsplit or ``"B-split"``) or W. ``held``:
    ZeRO-3's gathered layers are still held (from an earlier split ``B``, or for the whole
    step: ``keep``, FSDP2 in a pipeline, whose first forward gathers them to stay);
    ``release``: this ``W`` is the last user of them; ``loss``: what the loss keeps (the last
    chunk of the last stage), from after its forward until its backward begins; ``for_w``:
    per layer, what a split ``B`` leaves for its ``W``."""
    for_w = for_w or [0.0] * len(kept)
    a = g = buf = 0
    best = (0, 0, 0)
    if kind in ("B", "B-split"):
        a -= loss

    def check():
        nonlocal best
        if a + g + buf > sum(best):
            best = (a, g, buf)

    rev = list(range(len(kept)))[::-1]
    gathered = [0 if held else units.per_layer[i][1] for i in range(len(kept))]
    if kind == "F":
        for i in range(len(kept)):
            buf += gathered[i] + transient[i][0]
            check()
            buf -= transient[i][0] + (0 if keep else gathered[i])
            a += kept[i]
            check()
        a += loss
        check()
        return best, (a, g, buf)
    if kind == "B-split":
        for i in rev:
            buf += gathered[i] + transient[i][1]
            check()
            buf -= transient[i][1]
            a += for_w[i]
            check()
        a += grad_out
        check()
        return best, (a, g, buf)
    if kind == "W":
        a -= grad_out
    for i in rev:  # B unsplit, or W: release the layer, then hand its gradients on
        grads, full_layer, fullgrad = units.per_layer[i]
        if kind == "B":
            buf += gathered[i] + transient[i][1]
            check()
            buf -= transient[i][1]
        a -= kept[i] + (for_w[i] if kind == "W" else 0.0)
        if (kind == "B" and not keep) or release:
            buf -= gathered[i] if kind == "B" else full_layer
        buf += fullgrad
        check()
        buf -= fullgrad
        if first:
            g += grads
            check()
    return best, (a, g, buf)


def zero3_held(actions, split, whole_step=False):
    """Per action of one rank: whether its chunk's layers are still gathered (a split
    ``B`` whose ``W`` has not run; with ``whole_step``, FSDP2 in a pipeline, every pass
    after the chunk's first forward), and for a ``W`` whether it is their last user."""
    if whole_step:
        seen, out = set(), []
        for kind, c in actions:
            out.append((not (kind == "F" and c not in seen), False))
            if kind == "F":
                seen.add(c)
        return out
    outstanding, out = {}, []
    for kind, c in actions:
        n = outstanding.get(c, 0)
        if split and kind == "B":
            out.append((n > 0, False))
            outstanding[c] = n + 1
        elif split and kind == "W":
            out.append((True, n == 1))
            outstanding[c] = n - 1
        else:
            out.append((n > 0, True))
    return out


def zero3_gathers(name, p, m, v, r, whole_step=False):
    """[per chunk] how many of rank r's ``F`` and ``B`` passes over that chunk gather its
    layers in a step of ``m`` micro-batches of schedule ``name``: every one, less those that
    find them still gathered for a split ``B``'s ``W`` (:func:`zero3_held`), as
    :class:`~emulator.parallel.data_parallel.zero3.ZeRO3` shares them (``whole_step``: the
    first forward only). Past ``(v + 2) p`` micro-batches each one more adds the same count
    (the steady state repeats), so two shorter steps are counted and the line through them
    extended."""
    if whole_step:
        return [1] * v

    def count(k):
        out = [0] * v
        acts = _actions(name, p, k, v)[r]
        for (kind, c), (held, _) in zip(acts, zero3_held(acts, name == "zb_h1")):
            out[c] += kind != "W" and not held
        return out

    start = (v + 1) * p
    if m <= start + p:
        return count(m)
    a, b = count(start), count(start + p)
    return [x + (y - x) * (m - start) // p for x, y in zip(a, b)]


def walked_micro_batches(p):
    """Micro-batches a non-GPipe schedule is walked over: past them, nothing new is held."""
    return 5 * p


def stage_peaks(stage_layers, dims, ctx):
    """Every pipeline rank's ``(peak bytes, {kind: bytes at the peak})``: ``stage_layers[c][r]``
    is the list of :class:`~emulator.planner.layers.Layer` of rank r's chunk c."""
    p, v, m = dims.pp, dims.v, dims.micro_batches
    split = dims.schedule == "zb_h1"
    full = dims.recompute == "full"
    if dims.schedule != "gpipe":  # the peak comes within the warm-up and the first steady micro-batches
        m = min(m, walked_micro_batches(p))
    actions = _actions(dims.schedule, p, m, v)
    out = []
    for r in range(p):
        layers = [stage_layers[c][r] for c in range(v)]
        units = [Units(ls, dims, ctx) for ls in layers]
        if dims.zero_stage == 0:
            _ddp_buckets(units, dims, ctx, r)
        static = {"params": sum(u.params for u in units), "optimizer": sum(u.optimizer for u in units)}
        kept = [[(x.input if full else x.kept) for x in ls] for ls in layers]
        grad_out = [sum(x.grad_out for x in ls) for ls in layers]
        loss = [sum(x.loss for x in ls) for ls in layers]
        for_w = [[x.for_w for x in ls] for ls in layers]
        transient = [[x.transient for x in ls] for ls in layers]
        profiles, keys = {}, []
        whole = unsharded_in_pipeline(dims, ctx)
        held = zero3_held(actions[r], split, whole) if dims.zero_stage == 3 else [(False, True)] * len(actions[r])
        seen = set()
        for (kind, c), (h, release) in zip(actions[r], held):
            k = "B-split" if (kind == "B" and split) else kind
            first = k in ("B", "W") and c not in seen
            if first:
                seen.add(c)
            key = (k, c, first, h, release)
            if key not in profiles:
                profiles[key] = (len(profiles), _profile(kept[c], units[c], k, first, grad_out[c], h, release,
                                                         transient[c], loss[c], whole, for_w[c]))
            keys.append(profiles[key][0])
        table = sorted(profiles.values())
        peaks = np.array([pk for _, (pk, _) in table])[keys]  # (actions, 3): the peak inside each action
        deltas = np.array([dl for _, (_, dl) in table])[keys]  # and what it leaves held
        before = np.cumsum(deltas, axis=0) - deltas  # what is held when each action starts
        at = (before + peaks)[int(np.argmax((before + peaks).sum(axis=1)))]
        by_kind = {"params": static["params"], "grads": float(at[1]), "optimizer": static["optimizer"],
                   "activations": float(at[0]), "buffers": float(at[2])}
        out.append((sum(by_kind.values()), by_kind))
    return out


@lru_cache(maxsize=512)
def _actions(name, p, m, v):
    """Each rank's actions as (kind, chunk)."""
    return tuple(tuple((a.kind, a.chunk) for a in acts) for acts in schedule(name, p, m, v))


def micro_batch_layers(stage_names, p, v):
    """``[chunk][rank] -> names`` from the virtual stages' names."""
    return [[stage_names[stage_of(p, r, c)] for r in range(p)] for c in range(v)]

