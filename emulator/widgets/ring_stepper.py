"""Step through a ring collective: which chunk each rank holds and sends at step k."""

import ipywidgets as W
import numpy as np

from ..algorithms import global_view as C
from .. import viz
from .common import new_axes, show_figure

COLLECTIVES = {
    "all_reduce": lambda bufs: C.plan_all_reduce(bufs, "sum", "ring"),
    "reduce_scatter": lambda bufs: C.plan_reduce_scatter(bufs, "sum", "ring"),
    "all_gather": lambda bufs: C.plan_all_gather(bufs, "ring"),
}


def ring_stepper_model(n, step, collective="all_reduce", chunk_bytes=1):
    """The ring's state after ``step`` communication steps (0 = before any).

    Returns a dict: ``total_steps``, ``phase``, ``sends`` [(src, dst, chunk)],
    ``complete`` (how many (rank, chunk) cells hold their final value), ``bytes_sent``
    per rank so far (chunks of ``chunk_bytes``), ``text`` and ``figure``."""
    if collective not in COLLECTIVES:
        raise ValueError(f"collective must be one of {list(COLLECTIVES)}, got {collective!r}")
    if not 1 <= n <= 16:
        raise ValueError(f"n must be between 1 and 16 ranks, got {n}")
    shape = (n, 1) if collective != "all_gather" else (1,)
    bufs = [np.full(shape, float(r)) for r in range(n)]
    plan = COLLECTIVES[collective](bufs)
    steps = [C.initial_step(plan)] + list(C.steps_of(plan))
    total = len(steps) - 1
    if not 0 <= step <= total:
        raise ValueError(f"step must be between 0 and {total} for {collective} on {n} ranks, got {step}")
    cur = steps[step]
    sent = np.zeros(n, int)
    for s in steps[1:step + 1]:
        np.add.at(sent, s.src, chunk_bytes)
    sends = [(int(a), int(b), int(c[0])) for a, b, c in zip(cur.src, cur.dst, cur.chunks)]
    owned = [(r, r) for r in range(n)] if collective == "reduce_scatter" else \
        [(r, c) for r in range(n) for c in range(n)]  # a reduce-scatter keeps only chunk r on rank r
    complete = sum(cur.complete(r, c) for r, c in owned)
    if step == 0:
        text = (f"{collective} on {n} ranks: {total} steps. Step 0: every rank holds only its own data "
                f"(each row is a rank, each column a chunk; the number is how many ranks' inputs a cell holds).")
    else:
        moves = ", ".join(f"{a}→{b}: chunk {c}" for a, b, c in sends)
        text = f"step {step} of {total} ({cur.phase}): {moves}. Complete cells: {complete}."
    fig, ax = new_axes(1.2 + 0.55 * n, 0.9 + 0.42 * n)
    viz.ring_step(cur, ax=ax, title=f"{collective}, step {step}/{total}" + (f" ({cur.phase})" if step else ""))
    return {"total_steps": total, "phase": cur.phase, "sends": sends, "complete": complete,
            "bytes_sent": sent.tolist(), "text": text, "figure": fig}


class RingStepper(W.VBox):
    """Controls: collective, number of ranks, step. Shows the chunk grid and what moves."""

    def __init__(self, n=4, collective="all_reduce"):
        self.collective = W.Dropdown(options=list(COLLECTIVES), value=collective, description="collective")
        self.ranks = W.IntSlider(value=n, min=2, max=8, description="ranks")
        self.step = W.IntSlider(value=0, min=0, max=1, description="step")
        self.caption = W.HTML()
        self.image = W.Image(format="png")
        super().__init__([W.HBox([self.collective, self.ranks, self.step]), self.caption, self.image])
        for control in (self.collective, self.ranks):
            control.observe(self._reshape, names="value")
        self.step.observe(self._redraw, names="value")
        self._reshape()

    def _reshape(self, change=None):
        n = self.ranks.value
        total = 2 * (n - 1) if self.collective.value == "all_reduce" else n - 1
        self.step.max = total
        self.step.value = min(self.step.value, total)
        self._redraw()

    def _redraw(self, change=None):
        self.state = ring_stepper_model(self.ranks.value, self.step.value, self.collective.value)
        self.caption.value = f"<p class='ring-caption'>{self.state['text']}</p>"
        show_figure(self.image, self.state["figure"])
