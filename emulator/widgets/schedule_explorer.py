"""Pipeline schedules executed: pick a schedule, stages, micro-batches, chunks and the cost
of forward, input-gradient and weight-gradient passes; the emulator runs one step of a
small GPT (one block per chunk, a free network, those costs) and draws its Gantt chart,
the measured bubble beside the formula, and the micro-batches each stage held at its
peak (measured from the ledger) beside what the schedule predicts."""

import ipywidgets as W
import numpy as np

from .. import nn
from ..machine.topology import Topology
from ..engine.world import World
from ..accounting import pipeline_bubble
from ..parallel import pipeline as pp
from ..viz.schedules import ACTION_COLORS
from ..viz import gantt
from .common import new_axes, show_model

RATIOS = {"1:1:1 (matmuls)": (1, 1, 1), "1:2:0 (backward whole)": (1, 2, 0), "1:1.5:0.5": (1, 1.5, 0.5),
          "2:1:1": (2, 1, 1)}
UNIT = 1e-3  # a stage's forward of ratio 1 takes 1 ms


def schedule_explorer_model(schedule="1f1b", p=4, m=8, v=1, ratio=(1, 1, 1)):
    """Run one step; returns the measured bubble, the formula's, peak micro-batches per
    stage (measured and predicted), a text summary and the figure."""
    s = pp.schedule(schedule, p, m, v)  # ValueError on a bad combination, said by the library
    model = nn.GPT(vocab=8, d_model=8, n_heads=1, d_ff=8, n_layers=p * v, max_seq=2)
    params = model.init(np.random.default_rng(0))
    x = np.zeros((m, 2), dtype=np.int64)
    world = World(p, topology=Topology.free_network())
    costs = tuple(UNIT * c for c in ratio)
    run = pp.run(world, model, params, s, x, x, costs=costs)
    try:
        formula = pipeline_bubble(p, m, v, schedule=schedule, costs=ratio)
    except ValueError:
        formula = None  # outside the formula's range (ZB-H1 with W > B)
    held = run.peak_micro_batches()
    predicted = pp.in_flight(s)
    fig, ax = new_axes(8.2, 0.45 * p + 1.4)
    gantt(world.timeline(), ax=ax, colors=ACTION_COLORS, label_events=False,
          title=f"{schedule}, p={p}, m={m}" + (f", v={v}" if v > 1 else "") + f", F:B:W = {ratio[0]:g}:{ratio[1]:g}:"
          f"{ratio[2]:g}: bubble {run.bubble:.1%}")
    text = (f"measured bubble {run.bubble:.2%}; formula " + (f"{formula:.2%}" if formula is not None else "n/a (W > B)")
            + f". Peak micro-batches held per stage, measured: {', '.join(f'{h:.3g}' for h in held)}; "
            f"the schedule's count: {', '.join(map(str, predicted))}"
            + (" (chunks; a chunk is 1/v of a stage)" if v > 1 else "")
            + (" (ZB-H1 also keeps B's output gradients until W, so its bytes run higher)" if schedule == "zb_h1"
               else ""))
    return {"bubble": run.bubble, "formula": formula, "held": held, "predicted": predicted, "text": text,
            "figure": fig, "world": world}


class ScheduleExplorer(W.VBox):
    """Controls: schedule, p, m, v, F:B:W ratio."""

    state = None  # the model's last accepted state

    def __init__(self, schedule="1f1b", p=4, m=8, v=1, ratio="1:1:1 (matmuls)"):
        self.schedule = W.Dropdown(options=pp.NAMES, value=schedule, description="schedule")
        self.p = W.IntSlider(value=p, min=1, max=8, description="p (stages)")
        self.m = W.IntSlider(value=m, min=1, max=32, description="m (micro)")
        self.v = W.IntSlider(value=v, min=1, max=4, description="v (chunks)")
        self.ratio = W.Dropdown(options=list(RATIOS), value=ratio, description="F:B:W")
        self.summary = W.HTML()
        self.image = W.Image(format="png")
        super().__init__([W.HBox([self.schedule, self.ratio]), W.HBox([self.p, self.m, self.v]), self.summary,
                          self.image])
        for c in (self.schedule, self.p, self.m, self.v, self.ratio):
            c.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, change=None):
        self.state = show_model(self.summary, self.image, "schedule-summary", schedule_explorer_model,
                                self.schedule.value, self.p.value, self.m.value, self.v.value,
                                RATIOS[self.ratio.value]) or self.state
