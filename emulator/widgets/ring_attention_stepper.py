"""Ring attention step by step: which K/V block each rank holds at step k, which blocks of
the score matrix it computes (or skips under a causal mask), and the work each rank has
done so far. The sequence is drawn as 2c pieces; the score matrix as a 2c x 2c grid of
(query piece, key piece) cells, coloured by the rank that computes them."""

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..parallel.context_parallel import LAYOUTS, blocks, positions
from .common import show_figure


def ring_attention_stepper_model(c=4, causal=True, layout="contiguous", step=0):
    """State after ``step`` (0-based) of the ring: cells computed (by rank and step),
    per-rank work (in cells, a computed block counting whole), the text and figure."""
    if not 0 <= step < c:
        raise ValueError(f"step must be in 0..{c - 1} for a ring of {c} ranks, got {step}")
    owner = np.full((2 * c, 2 * c), -1)  # rank that computes the cell, -1: not (yet)
    when = np.full((2 * c, 2 * c), -1)
    work = np.zeros(c)
    holds = []
    for t in range(step + 1):
        for r in range(c):
            src = (r - t) % c
            if t == step:
                holds.append(src)
            qp, kp = positions(r, c, 2, layout), positions(src, c, 2, layout)  # two pieces each
            for rows, cols, _ in blocks(r, src, c, 2, causal, layout):
                for i in qp[rows]:
                    for j in kp[cols]:
                        owner[i, j], when[i, j] = r, t
                        work[r] += 1
    colors = plt.cm.tab10(np.arange(10))
    fig = Figure(figsize=(8.4, 3.6), dpi=100)  # outside pyplot: a redraw leaks nothing into the cell
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    for i in range(2 * c):
        for j in range(2 * c):
            hidden = causal and j > i
            if owner[i, j] >= 0:
                alpha = 1.0 if when[i, j] == step else 0.35
                ax.add_patch(plt.Rectangle((j, i), 1, 1, color=colors[owner[i, j] % 10], alpha=alpha, lw=0))
                if hidden:  # computed with a mask: the work is spent, the scores thrown away
                    ax.add_patch(plt.Rectangle((j, i), 1, 1, fill=False, hatch="///", color="white", lw=0))
            elif hidden and when[i, j] < 0:
                ax.add_patch(plt.Rectangle((j, i), 1, 1, color="#EEEEEE", lw=0))
    ax.set_xlim(0, 2 * c)
    ax.set_ylim(2 * c, 0)
    ax.set_xticks(np.arange(2 * c) + 0.5)
    ax.set_yticks(np.arange(2 * c) + 0.5)
    ax.set_xticklabels(range(2 * c), fontsize=7)
    ax.set_yticklabels(range(2 * c), fontsize=7)
    ax.set_xlabel("key piece")
    ax.set_ylabel("query piece")
    ax.set_aspect("equal")
    ax.set_title(f"score blocks after step {step} (bright: this step)", fontsize=8)
    bx.bar(range(c), work, color=[colors[r % 10] for r in range(c)])
    bx.set_xlabel("rank")
    bx.set_ylabel("cells computed so far")
    bx.set_xticks(range(c))
    bx.set_title("work per rank", fontsize=8)
    fig.tight_layout()
    text = (f"step {step} of {c - 1}: " + ", ".join(f"rank {r} holds K/V of rank {s}" for r, s in enumerate(holds))
            + f". Work so far per rank: {', '.join(f'{w:g}' for w in work)}"
            + (" (grey: hidden by the causal mask and skipped; hatched: computed under a mask)" if causal else ""))
    return {"owner": owner, "work": work, "holds": holds, "text": text, "figure": fig}


class RingAttentionStepper(W.VBox):
    """Controls: ranks c, causal, layout, step."""

    def __init__(self, c=4, causal=True, layout="contiguous", step=0):
        self.c = W.IntSlider(value=c, min=1, max=8, description="ranks c")
        self.causal = W.Checkbox(value=causal, description="causal")
        self.split = W.Dropdown(options=LAYOUTS, value=layout, description="layout")
        self.step = W.IntSlider(value=step, min=0, max=c - 1, description="step")
        self.caption = W.HTML()
        self.image = W.Image(format="png")
        super().__init__([W.HBox([self.c, self.causal, self.split]), self.step, self.caption, self.image])
        for control in (self.c, self.causal, self.split, self.step):
            control.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, change=None):
        if change is not None and change["owner"] is self.c:
            self.step.max = self.c.value - 1
        self.state = ring_attention_stepper_model(self.c.value, self.causal.value, self.split.value,
                                                  min(self.step.value, self.c.value - 1))
        self.caption.value = f"<p class='ring-attention-caption'>{self.state['text']}</p>"
        show_figure(self.image, self.state["figure"])
