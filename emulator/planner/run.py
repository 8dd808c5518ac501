"""A plan run on the emulator, its predictions beside what the run measured.

``run_plan(model, cluster, dims, seq_len, global_batch_tokens)`` builds the model's
``nn.GPT`` (learned positions), trains one step with :func:`emulator.parallel.run_on_mesh`
on the cluster's topology (shape-only by default: the real shapes, no values; or with data
for a small model) and returns a :class:`PlanRun`: the :class:`~emulator.planner.Estimate`,
the :class:`~emulator.parallel.runtime.MeshRun`, and :meth:`PlanRun.table`, predicted
beside measured: each stage's peak memory, the step time, the pipeline's idle share and
the bytes one rank sends per axis.
"""

import time
from dataclasses import dataclass

import numpy as np

from .. import nn
from ..cost import BUS_FACTOR
from ..errors import ConfigError
from ..machine.work import np_dtype
from ..mesh import DP_CP, EDP
from ..parallel.runtime import run_on_mesh, shape_only_batches
from ..records.table import Table
from ..training import synthetic_batches
from .evaluate import evaluate
from .precision_of import plan_context

RINGS = ("all_reduce", "reduce_scatter", "all_gather")  # a ring's member sends its bus factor times the bytes


@dataclass
class PlanRun:
    estimate: object
    run: object
    wall_seconds: float

    def representative(self, stage):
        """The global rank at coordinates pp=stage, dp=cp=tp=0."""
        d = self.estimate.dims
        return stage * d.dp * d.cp * d.tp

    def measured_memory(self):
        """Each pipeline stage's representative's ledger peak."""
        return [self.run.world.memory[self.representative(s)].peak for s in range(self.estimate.dims.pp)]

    def measured_bubble(self):
        """Idle share of the pipeline as the planner counts it: for each stage's
        representative, the time until its last kernel ends less what it waited for a
        neighbour's activations or gradients, over stages x the latest such end."""
        events = self.run.world.timeline().events
        ends, waits = [], []
        for s in range(self.estimate.dims.pp):
            r = self.representative(s)
            mine = [e for e in events if e.rank == r and e.stream == "compute"]
            end = max(e.end for e in mine if e.kind == "compute")
            ends.append(end)
            waits.append(sum(e.end - e.start for e in mine if e.kind == "idle" and e.name.startswith(("wait recv", "wait send"))
                             and e.end <= end))
        if len(ends) == 1:
            return 0.0
        return 1 - sum(e - w for e, w in zip(ends, waits)) / (len(ends) * max(ends))

    def measured_sent(self, stage):
        """{(axis, link): bytes} the stage's representative sent."""
        r = self.representative(stage)
        return {k: v[r] for k, v in self.run.world.stats().bytes_sent_by_group.items() if v[r]}

    def predicted_sent(self):
        """{axis: bytes} one rank of the slowest stage sends per step (from the estimate's table)."""
        est = self.estimate
        out = {}
        for row in est.comm:
            n = _group_size(est.dims, row["axis"])
            if row["op"] in RINGS:
                sent = BUS_FACTOR[row["op"]](n) * row["bytes"] * row["count"]
            elif row["op"] == "all_to_all":
                sent = (n - 1) * row["bytes"] * row["count"]
            else:  # point to point: the bytes of each message
                sent = row["bytes"] * row["count"]
            out[row["axis"]] = out.get(row["axis"], 0) + sent
        return out

    def comm_stage(self):
        """The stage whose rank the estimate's communication table describes."""
        return self.estimate.comm.rank

    def table(self):
        """Predicted beside measured, with the relative error of each."""
        est, rows = self.estimate, []
        for s, (pred, meas) in enumerate(zip((m for m, _ in est.stage_memory), self.measured_memory())):
            rows.append(_row(f"peak memory, stage {s}", pred, meas, "bytes"))
        rows.append(_row("step time", est.step_time, self.run.step_time(), "s"))
        rows.append(_row("pipeline idle share", est.bubble, self.measured_bubble(), "share"))
        stage = self.comm_stage()
        measured = {}
        for (axis, _), b in self.measured_sent(stage).items():
            measured[axis] = measured.get(axis, 0) + b
        for axis, pred in self.predicted_sent().items():
            rows.append(_row(f"bytes sent, {axis} (stage {stage})", pred, measured.get(axis, 0), "bytes"))
        return Table(rows)

    def worst_errors(self):
        """(memory error of the worst stage, step-time error), relative."""
        meas = max(self.measured_memory())
        return est_err(self.estimate.memory_peak, meas), est_err(self.estimate.step_time, self.run.step_time())


def est_err(pred, meas):
    return (pred - meas) / meas if meas else float(pred != 0)


def _row(what, pred, meas, unit):
    fmt = {"bytes": lambda x: f"{x / 1e6:,.2f} MB", "s": lambda x: f"{x * 1e3:.3f} ms",
           "share": lambda x: f"{x:.1%}"}[unit]
    return {"quantity": what, "predicted": fmt(pred), "measured": fmt(meas), "error": f"{est_err(pred, meas):+.2%}"}


def _group_size(dims, axis):
    return {"tp": dims.tp, "cp": dims.cp, "pp": dims.pp, "ep": dims.ep, DP_CP: dims.dp * dims.cp,
            EDP: dims.edp}[axis]


def run_plan(model, cluster, dims, seq_len, global_batch_tokens, shape_only=True, fold=(), param_bytes=None, seed=0,
             stack=None, precision=None):
    """Run ``dims`` for one step on the emulator (see the module docstring); ``fold``:
    axes to fold in a shape-only run (``("dp", "tp")`` runs one rank per set of alike
    ones, for full-size meshes); ``stack``, ``precision`` and ``param_bytes`` as
    :func:`~emulator.planner.evaluate`'s: the run uses the same."""
    if param_bytes not in (None, 2, 4):
        raise ConfigError(f"run_plan: param_bytes must be 2 (bf16, mixed-precision Adam) or 4 (fp32), got "
                          f"{param_bytes!r}")
    ctx = plan_context(stack, precision, param_bytes)
    mixed = ctx.precision.master is not None
    est = evaluate(model, cluster, dims, seq_len, global_batch_tokens, stack=ctx.stack, precision=ctx.precision)
    if est.step_time is None:
        raise ConfigError("run_plan: the plan cannot run:\n" + "\n".join(f"  - {p}" for p in est.problems))
    gpt = model.to_gpt(seq_len, dtype=np_dtype(ctx.array))
    options = dict(topology=cluster.topology, stack=ctx.stack, precision=ctx.precision)
    batch = global_batch_tokens // seq_len
    t0 = time.perf_counter()
    if shape_only:
        run = run_on_mesh(gpt, None, shape_only_batches(1, batch, seq_len), dims, nn.AdamW(mixed_precision=mixed),
                          shape_only=True, fold=fold, **options)
    else:
        params = gpt.init(np.random.default_rng(seed))
        run = run_on_mesh(gpt, params, synthetic_batches(1, batch, seq_len, model.vocab, seed=seed), dims,
                          nn.AdamW(mixed_precision=mixed), **options)
    return PlanRun(est, run, time.perf_counter() - t0)
