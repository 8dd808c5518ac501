"""Pictures of a run: Gantt charts of the simulated timeline, chunk grids of a ring step.

Every function draws on a matplotlib Axes (made if not given) and returns the Figure, so a
notebook cell can end with ``fig;`` or ``plt.close(fig)`` and leak no object repr.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "idle": "#DDDDDD"}


def _axes(ax, figsize):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


def gantt(timeline, ax=None, title=None, unit="ms", label_events=True, figsize=None):
    """Draw a timeline (``world.timeline()`` or a world): for every rank a compute row and,
    just under it, a thinner communication-stream row. Idle time is grey."""
    if hasattr(timeline, "timeline"):
        timeline = timeline.timeline()
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    n = timeline.n_ranks
    fig, ax = _axes(ax, figsize or (9, 0.7 * n + 1.2))
    for e in timeline.events:
        if e.stream == "compute":
            y, h = e.rank - 0.38, 0.5
        else:
            y, h = e.rank + 0.16, 0.22
        color = COLORS[e.kind] if e.stream == "compute" else COLORS["comm"]
        ax.broken_barh([(e.start * scale, e.duration * scale)], (y, h), facecolors=color,
                       edgecolor="white", linewidth=0.5)
        wide = e.duration * scale > 0.04 * max(timeline.makespan * scale, 1e-30)
        if label_events and e.stream == "compute" and e.kind == "compute" and wide:
            ax.text((e.start + e.duration / 2) * scale, e.rank - 0.13, e.name, ha="center", va="center",
                    fontsize=7, color="white", clip_on=True)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r}" for r in range(n)])
    ax.set_ylim(n - 0.5, -0.6)
    ax.set_xlim(0, max(timeline.makespan * scale, 1e-12))
    ax.set_xlabel(f"simulated time ({unit})")
    handles = [Patch(color=COLORS[k], label=k) for k in ("compute", "comm", "idle")]
    ax.legend(handles=handles, loc="upper right", fontsize=8, ncol=3, framealpha=0.9)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


def ring_step(step, ax=None, title=None):
    """One step of a ring collective as a grid: a row per rank, a column per chunk. A cell's
    shade is how many ranks' inputs it already contains (dark = complete); arrows mark the
    chunks sent in this step."""
    n, n_chunks = step.holds.shape
    counts = np.vectorize(lambda b: bin(int(b)).count("1"))(step.holds).astype(float)
    fig, ax = _axes(ax, (1.0 + 0.55 * n_chunks, 0.9 + 0.45 * n))
    ax.imshow(counts, cmap="Blues", vmin=0, vmax=n, aspect="auto")
    for r in range(n):
        for c in range(n_chunks):
            if counts[r, c]:
                ax.text(c, r, f"{int(counts[r, c])}", ha="center", va="center", fontsize=8,
                        color="white" if counts[r, c] > n / 2 else "black")
    for s, d, chunks in zip(step.src, step.dst, step.chunks):
        for c in chunks:
            ax.annotate("", xy=(c + 0.3, d), xytext=(c + 0.3, s),
                        arrowprops=dict(arrowstyle="->", color="#C44E52", lw=1.2,
                                        connectionstyle="arc3,rad=0.3"))
    ax.set_xticks(range(n_chunks))
    ax.set_xticklabels([f"chunk {c}" for c in range(n_chunks)], fontsize=7)
    ax.set_yticks(range(n))
    ax.set_yticklabels([f"rank {r}" for r in range(n)], fontsize=8)
    ax.set_title(title or f"step {step.index + 1}: {step.phase}", fontsize=9)
    fig.tight_layout()
    return fig
