"""The mesh planner, twice.

:class:`MeshPlanner` is the planner in three numbers: total GPUs, GPUs per node, a model
of N parameters and L layers, a DP x TP x PP split. It checks the product, shows the
training state per GPU under full sharding (16 N / (DP TP PP) bytes) against HBM, the
pipeline bubble with the micro-batches fixed at 4 per stage (m = 4 PP; it has no control for
them, and says so), and where each axis's traffic goes; the plan turns red when TP passes the
GPUs of a node.

:class:`PlanExplorer` is the full planner (:mod:`emulator.planner`): a preset model on a
cluster, every axis, the ZeRO stage, the schedule and recomputation; the estimate (memory
by kind against HBM, where the step goes as a stacked bar, under a chosen software stack);
the ranked plans of a search;
and a button that runs the chosen plan on the emulator and draws predicted beside measured
(saying that it runs, and why a plan cannot, without losing the last run's result).
"""

import time

import ipywidgets as W
from matplotlib.figure import Figure

from ..errors import ConfigError
from ..parallel.dims import RECOMPUTE, SCHEDULES, ParallelDims
from ..planner import cluster_preset, evaluate, model_preset, run_plan, search
from ..machine.stack import PRESETS as STACKS
from ..planner.memory import KINDS
from ..planner.pictures import draw_breakdown
from .common import new_axes, show_figure, show_model

RUN_LIMIT = 64  # GPUs: larger plans are run from benchmarks/, not from a widget


def mesh_planner_model(gpus=64, gpus_per_node=8, n_params=70e9, layers=80, dp=4, tp=8, pp=2, hbm_gb=80):
    """The planner in three numbers. Returns the state per GPU (bytes), the bubble at m = 4 PP
    micro-batches, whether the plan is valid (``ok``) and why not, the text and the figure."""
    problems = []
    if dp * tp * pp != gpus:
        problems.append(f"DP x TP x PP = {dp} x {tp} x {pp} = {dp * tp * pp}, not the {gpus} GPUs")
    red = tp > gpus_per_node
    if red:
        problems.append(f"TP = {tp} passes the {gpus_per_node} GPUs of a node: its all-reduces would cross "
                        f"InfiniBand, tens of times slower than NVLink")
    if pp > layers:
        problems.append(f"PP = {pp} stages for {layers} layers: some stage would be empty")
    state = 16 * n_params / (dp * tp * pp)
    m = 4 * pp
    bubble = (pp - 1) / (m + pp - 1)
    fits = state <= hbm_gb * 1e9
    if not fits:
        problems.append(f"the training state alone, {state / 1e9:.1f} GB per GPU, exceeds {hbm_gb} GB")
    # mesh order pp, dp, tp (tp innermost): an axis stays in a node while the ranks it spans fit in one
    links = {axis: "NVLink" if span <= gpus_per_node else "InfiniBand"
             for axis, span in (("TP", tp), ("DP", tp * dp), ("PP", tp * dp * pp))}
    regime = "; ".join(f"{axis} {size} on {links[axis]}" for axis, size in (("TP", tp), ("PP", pp), ("DP", dp))
                       if size > 1) or "one GPU"
    fig, ax = new_axes(6.4, 2.2)
    ax.barh(["state per GPU", "HBM"], [state / 1e9, hbm_gb], color=["#c0392b" if not fits else "#2e86c1", "#aaa"])
    ax.set_xlabel("GB")
    ax.set_title(f"DP {dp} x TP {tp} x PP {pp}: bubble {bubble:.1%} at m = 4 x PP = {m} micro-batches"
                 + ("  (invalid)" if problems else ""), color="#c0392b" if problems else "black", fontsize=9)
    fig.tight_layout()
    ok = not problems
    text = (f"{'OK' if ok else 'INVALID'}: state per GPU {state / 1e9:.2f} GB (16 N / {dp * tp * pp}); bubble "
            f"{bubble:.1%} at m = {m} micro-batches (this planner fixes m at 4 x PP); {regime}."
            + "".join(f" {p}." for p in problems))
    return {"state": state, "bubble": bubble, "ok": ok, "red": red, "fits": fits, "problems": problems,
            "text": text, "figure": fig}


class MeshPlanner(W.VBox):
    state = None

    def __init__(self, gpus=64, gpus_per_node=8, n_params=70e9, layers=80, dp=4, tp=8, pp=2):
        powers = [2**k for k in range(0, 12)]
        self.gpus = W.SelectionSlider(options=powers[3:], value=gpus, description="GPUs")
        self.per_node = W.SelectionSlider(options=[4, 8, 16], value=gpus_per_node, description="GPUs/node")
        # a fine step, so the slider holds the size asked for (its default, 0.2 in the exponent, turns 70e9 into 63e9)
        self.n_params = W.FloatLogSlider(value=n_params, base=10, min=9, max=12, step=0.001, description="N params")
        self.layers = W.IntSlider(value=layers, min=8, max=128, description="layers L")
        self.dp = W.SelectionSlider(options=powers, value=dp, description="DP")
        self.tp = W.SelectionSlider(options=powers[:7], value=tp, description="TP")
        self.pp = W.SelectionSlider(options=powers[:7], value=pp, description="PP")
        self.summary, self.image = W.HTML(), W.Image(format="png")
        controls = (self.gpus, self.per_node, self.n_params, self.layers, self.dp, self.tp, self.pp)
        super().__init__([W.HBox(controls[:4]), W.HBox(controls[4:]), self.summary, self.image])
        for c in controls:
            c.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, change=None):
        self.state = show_model(self.summary, self.image, "mesh-summary", mesh_planner_model, self.gpus.value,
                                self.per_node.value, self.n_params.value, self.layers.value, self.dp.value,
                                self.tp.value, self.pp.value) or self.state


def plan_explorer_model(model="llama3-70b", cluster="h100", nodes=8, seq_len=4096, batch_tokens=2**21, dp=4, tp=8,
                        pp=2, cp=1, ep=1, zero_stage=1, schedule="1f1b", recompute="selective", micro_batches=16,
                        v=1, top=5, stack="megatron-core"):
    """The full planner on one plan under a software ``stack`` (memory by kind, where the
    step goes, problems) and the ``top`` plans of a search under the same stack."""
    spec = model_preset(model)
    c = cluster_preset(cluster, nodes=nodes)
    dims = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero_stage=zero_stage, schedule=schedule,
                        recompute=recompute, micro_batches=micro_batches, v=v, sequence_parallel=tp > 1)
    est = evaluate(spec, c, dims, seq_len, batch_tokens, stack=stack)
    ranked = search(spec, c, seq_len, batch_tokens, top=top, stack=stack)
    fig = Figure(figsize=(9.6, 2.4), dpi=100)
    left, right = fig.subplots(1, 2)
    if est.step_time is not None:
        values = [est.memory_bytes[k] / 1e9 for k in KINDS]
        left.barh(list(KINDS), values, color="#2e86c1")
        left.axvline(c.hbm_bytes / 1e9, color="#c0392b", ls="--", lw=1)
        left.set_xlabel(f"GB, worst rank (stage {est.worst_stage}); dashed: HBM")
        draw_breakdown(right, est.breakdown, est.step_time)
    fig.suptitle(f"{spec.name} on {c.gpus} GPUs: {dims}" if len(str(dims)) < 90 else f"{spec.name}: {dims}",
                 fontsize=8)
    fig.tight_layout(rect=(0, 0, 0.86, 1))  # room for the breakdown's legend on the right
    head = (f"{stack}: step {est.step_time:.3g} s, {est.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {est.mfu:.1%}, "
            f"bubble {est.bubble:.1%}, memory {est.memory_peak / 1e9:.1f} GB" if est.step_time is not None
            else "not evaluated")
    problems = "".join(f"<br>problem: {p}" for p in est.problems)
    table = "".join(f"<br>{i}. {e.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, {e.memory_peak / 1e9:.0f} GB: {d}"
                    for i, (d, e) in enumerate(ranked, 1))
    text = f"{head}{problems}<br><b>best plans found</b>:{table or ' none fits'}"
    return {"estimate": est, "ranked": ranked, "text": text, "figure": fig, "dims": dims, "model": spec,
            "cluster": c, "seq_len": seq_len, "batch_tokens": batch_tokens, "stack": stack}


def run_chosen(state):
    """Run the state's plan on the emulator (shape-only, dp and tp folded): (text, figure).
    A plan that cannot run (its problems, or too many GPUs for a widget) gives its reason and
    no figure."""
    dims, c = state["dims"], state["cluster"]
    if state["estimate"].step_time is None:
        return "cannot run this plan: " + "; ".join(state["estimate"].problems), None
    if dims.world_size > RUN_LIMIT:
        return (f"{dims.world_size} GPUs is too many to run from a widget (limit {RUN_LIMIT}); "
                f"benchmarks/planner.py --emulator runs a full-size mesh", None)
    spec = state["model"].replace(positions="learned", max_seq=state["seq_len"])
    try:
        pr = run_plan(spec, c, dims, state["seq_len"], state["batch_tokens"], fold=("dp", "tp"),
                      stack=state.get("stack"))
    except ConfigError as exc:
        return f"cannot run this plan: {exc}", None
    rows = pr.table()
    fig = Figure(figsize=(10.0, 0.3 * len(rows) + 1.2), dpi=100)
    ax, bars = fig.subplots(1, 2)
    names = [r["quantity"] for r in rows]
    ax.barh(names, [float(r["error"].rstrip("%")) for r in rows], color="#2e86c1")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("predicted - measured, % of measured")
    est = state["estimate"]
    draw_breakdown(bars, pr.run.breakdown(), pr.run.step_time(), y=0)
    draw_breakdown(bars, est.breakdown, est.step_time, y=1, legend=False)
    bars.set_yticks([0, 1], ["measured\n(legend: its shares)", "predicted"], fontsize=7)
    fig.tight_layout(rect=(0, 0, 0.86, 1))
    return "ran on the emulator: " + "; ".join(f"{r['quantity']}: {r['predicted']} vs {r['measured']}"
                                              for r in rows), fig


class PlanExplorer(W.VBox):
    state = None

    def __init__(self, model="llama3-70b", nodes=8, seq_len=4096, batch_tokens=2**21, stack="megatron-core",
                 **dims):
        d = {**dict(dp=4, tp=8, pp=2, cp=1, ep=1, zero_stage=1, schedule="1f1b", recompute="selective",
                    micro_batches=16, v=1), **dims}
        powers = [2**k for k in range(0, 10)]
        self.model = W.Dropdown(options=["llama3-8b", "llama3-70b", "llama3-405b", "gpt3-175b", "mixtral-8x22b",
                                         "olmo-7b", "yi-34b"], value=model, description="model")
        self.nodes = W.SelectionSlider(options=powers, value=nodes, description="nodes of 8")
        self.axes = {a: W.SelectionSlider(options=powers, value=d[a], description=a.upper()) for a in
                     ("dp", "tp", "pp", "cp", "ep")}
        self.zero = W.Dropdown(options=[0, 1, 2, 3], value=d["zero_stage"], description="ZeRO stage")
        self.schedule = W.Dropdown(options=SCHEDULES, value=d["schedule"], description="schedule")
        self.recompute = W.Dropdown(options=RECOMPUTE, value=d["recompute"], description="recompute")
        self.micro = W.SelectionSlider(options=powers, value=d["micro_batches"], description="micro-batches")
        self.v = W.IntSlider(value=d["v"], min=1, max=4, description="v (chunks)")
        self.stack = W.Dropdown(options=list(STACKS), value=stack, description="stack")
        self.run = W.Button(description="run it on the emulator")
        self.summary, self.image = W.HTML(), W.Image(format="png")
        self.ran, self.ran_image = W.HTML(), W.Image(format="png")
        self.status = W.HTML()  # what the run button is doing, or why it cannot: the last result stays below
        self.seq_len, self.batch_tokens = seq_len, batch_tokens
        controls = [self.model, self.nodes, *self.axes.values(), self.zero, self.schedule, self.recompute,
                    self.micro, self.v, self.stack]
        super().__init__([W.HBox(controls[:2]), W.HBox(controls[2:7]), W.HBox(controls[7:]), self.summary,
                          self.image, W.HBox([self.run, self.status]), self.ran, self.ran_image])
        for c in controls:
            c.observe(self._redraw, names="value")
        self.run.on_click(self._run)
        self._redraw()

    def _redraw(self, change=None):
        self.state = show_model(self.summary, self.image, "plan-summary", plan_explorer_model, self.model.value,
                                "h100", self.nodes.value, self.seq_len, self.batch_tokens,
                                *(s.value for s in self.axes.values()), self.zero.value, self.schedule.value,
                                self.recompute.value, self.micro.value, self.v.value, 5,
                                self.stack.value) or self.state

    def _run(self, button=None):
        if self.state is None:
            self.status.value = "<p class='plan-status'>cannot run: the controls above do not make a plan</p>"
            return
        dims = self.state["dims"]
        self.run.disabled = True
        self.status.value = (f"<p class='plan-status'>running {dims} on {dims.world_size} emulated GPUs "
                             f"(shape-only; this takes a few seconds to half a minute)...</p>")
        start = time.perf_counter()
        try:
            text, fig = run_chosen(self.state)
        finally:
            self.run.disabled = False
        if fig is None:  # refused: say why, keep the last run's result
            self.status.value = f"<p class='plan-status'>{text}</p>"
            return
        self.status.value = f"<p class='plan-status'>done in {time.perf_counter() - start:.1f} s</p>"
        self.ran.value = f"<p class='plan-run'>{text}</p>"
        show_figure(self.ran_image, fig)
