"""Pictures of a run: Gantt charts of the simulated timeline, chunk grids of a ring step.

Every function draws on a matplotlib Axes (made if not given) and returns the Figure, so a
notebook cell can end with ``fig;`` or ``plt.close(fig)`` and leak no object repr.
"""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.patches import Patch

from ..records.memory import KINDS

COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "idle": "#DDDDDD"}


def _axes(ax, figsize):
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize)
        return fig, ax
    return ax.figure, ax


def gantt(timeline, ax=None, title=None, unit="ms", label_events=True, figsize=None, colors=None, streams=None,
          kind_of=None):
    """Draw a timeline (``world.timeline()`` or a world): for every rank a compute lane and,
    under it, one thinner lane per communication stream it used (``comm tp``, ``comm dp``,
    ``p2p 0->1``), each named on the left. Idle time on the compute lane is grey.
    ``colors``: {first letter of a compute event's name: colour}, e.g. a pipeline's F, B
    and W (:data:`emulator.viz.schedules.ACTION_COLORS`). ``streams``: the communication
    streams to draw, by the start of their names (``("comm dp",)``; ``()`` for none).
    ``kind_of``: a function from a compute event's name to its key in ``colors``, instead of
    the first letter (:func:`training_pass` with :data:`PASS_COLORS`: forward, backward,
    weight gradients, for a run of ``run_on_mesh`` whose kernels are named by module)."""
    if hasattr(timeline, "timeline"):
        timeline = timeline.timeline()
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    lanes, labels = {}, []
    for r in range(timeline.size):
        for stream in timeline.streams(r):
            if stream != "compute" and streams is not None and not stream.startswith(tuple(streams)):
                continue
            lanes[(r, stream)] = len(labels)
            labels.append(f"rank {timeline.ranks[r]}" if stream == "compute" else stream)
    fig, ax = _axes(ax, figsize or (9, 0.32 * len(labels) + 1.2))
    bars = {}  # (lane, height, colour) -> spans: one collection each draws thousands of events fast
    for e in timeline.events:
        if (e.rank, e.stream) not in lanes:
            continue
        y = lanes[(e.rank, e.stream)]
        compute = e.stream == "compute"
        h = 0.8 if compute else 0.55
        color = COLORS[e.kind] if compute else COLORS["comm"]
        if colors and compute and e.kind == "compute":
            color = colors.get(kind_of(e.name) if kind_of else e.name[:1], color)
        bars.setdefault((y, h, color), []).append((e.start * scale, e.duration * scale))
        wide = e.duration * scale > 0.04 * max(timeline.makespan * scale, 1e-30)
        if label_events and compute and e.kind == "compute" and wide:
            ax.text((e.start + e.duration / 2) * scale, y, e.name, ha="center", va="center",
                    fontsize=7, color="white", clip_on=True)
    for (y, h, color), spans in bars.items():
        ax.broken_barh(spans, (y - h / 2, h), facecolors=color, edgecolor="white", linewidth=0.5)
    ax.set_yticks(range(len(labels)))
    ax.set_yticklabels(labels, fontsize=8)
    for tick, label in zip(ax.get_yticklabels(), labels):
        if not label.startswith("rank"):
            tick.set_color("#666666")
            tick.set_fontsize(7)
    ax.set_ylim(len(labels) - 0.5, -0.6)
    ax.set_xlim(0, max(timeline.makespan * scale, 1e-12))
    ax.set_xlabel(f"simulated time ({unit})")
    kinds = {k: COLORS[k] for k in ("compute", "comm", "idle")}
    if colors:
        kinds = {**{k: c for k, c in colors.items()}, "comm": COLORS["comm"], "idle": COLORS["idle"]}
    if all(stream == "compute" for _, stream in lanes):  # no communication lane drawn
        kinds.pop("comm")
    handles = [Patch(color=c, label=k) for k, c in kinds.items()]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title)
    fig.tight_layout()
    return fig


PASS_COLORS = {"forward": "#4C72B0", "backward": "#55A868", "weight gradients": "#8172B2"}


def training_pass(name):
    """Which pass a module's kernel belongs to, from its name in the timeline ("MLP in",
    "MLP in backward", "MLP weight gradients"): a key of :data:`PASS_COLORS`."""
    if name.endswith("backward"):
        return "backward"
    return "weight gradients" if "gradients" in name else "forward"


KIND_COLORS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52", "activations": "#8172B2",
               "buffers": "#CCB974"}


def memory_over_time(ledger, ax=None, title=None, unit="us", scale_bytes=1e3, label="kB"):
    """What one rank holds over simulated time, stacked by kind (``world.memory[r]``),
    with the true peak marked and its breakdown at that moment in the legend."""
    times, by_kind = ledger.history_by_kind()
    t = times * {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    fig, ax = _axes(ax, (7.5, 2.8))
    layers = [by_kind[k] / scale_bytes for k in KINDS]
    peak = ledger.peak_breakdown
    labels = [f"{k} ({peak[k] / scale_bytes:,.1f} at peak)" for k in KINDS]
    ax.stackplot(t, *layers, step="post", labels=labels, colors=[KIND_COLORS[k] for k in KINDS], alpha=0.9)
    top = ledger.peak / scale_bytes
    t_peak = ledger.peak_time * {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    ax.plot([t_peak], [top], "v", color="black", ms=6)
    ax.annotate(f"peak {top:,.1f} {label}", (t_peak, top), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_ylabel(f"{label} held")
    ax.set_ylim(0, top * 1.18 if top else 1)
    ax.set_xlim(t[0], max(t[-1], 1e-12))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
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


def megatron_split(t=2, figsize=(9, 2.6)):
    """The Megatron MLP on t ranks: X replicated, A cut by columns, B by rows (a colour per
    rank), each rank's partial product, and the all-reduce that sums them."""
    fig, ax = plt.subplots(figsize=figsize)
    colors = plt.cm.tab10(np.arange(t))

    def block(x, y, w, h, color, text=None, alpha=0.85):
        ax.add_patch(plt.Rectangle((x, y), w, h, facecolor=color, edgecolor="white", alpha=alpha))
        if text:
            ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=8, color="white")

    block(0, 0.5, 1.2, 2, "#666666", "X\n(b s, h)")
    ax.text(1.45, 1.5, "x", fontsize=12, va="center")
    for r in range(t):  # A = [A_1 ... A_t], by columns
        block(1.8 + r * 2.4 / t, 0.5, 2.4 / t, 2, colors[r], f"A{r + 1}")
    ax.text(4.45, 1.5, "GELU, then x", fontsize=9, va="center")
    for r in range(t):  # B = [B_1; ...; B_t], by rows
        block(6.1, 2.5 - (r + 1) * 2 / t, 1.6, 2 / t, colors[r], f"B{r + 1}")
    ax.annotate("", xy=(8.6, 1.5), xytext=(7.9, 1.5), arrowprops=dict(arrowstyle="->", lw=1.5))
    for r in range(t):
        block(8.8, 2.5 - (r + 1) * 2 / t, 1.2, 2 / t * 0.85, colors[r], f"partial {r + 1}")
    ax.text(10.2, 1.5, "all-reduce\n(sum)  ->  Z", fontsize=9, va="center")
    ax.set_title(f"Megatron MLP on {t} ranks: rank r holds A_r (columns of A) and B_r (rows of B) and computes "
                 f"GELU(X A_r) B_r; one all-reduce sums the partials", fontsize=9)
    ax.set_xlim(-0.2, 12.2)
    ax.set_ylim(0.2, 2.8)
    ax.axis("off")
    fig.tight_layout()
    return fig


def topologies(figsize=(9, 3.4)):
    """A GPU fat tree (NVLink inside a node, InfiniBand leaf and spine switches above)
    beside a TPU 2D torus (neighbour links only, wrapping around)."""
    fig, (a, b) = plt.subplots(1, 2, figsize=figsize)
    # fat tree: 4 nodes of 4 GPUs, 2 leaf switches, 1 spine
    for node in range(4):
        x0 = node * 2.5
        a.add_patch(plt.Rectangle((x0 - 0.15, -0.35), 2.0, 0.7, fill=False, lw=1, ls="--", color="grey"))
        for g in range(4):
            a.plot(x0 + g * 0.55, 0, "s", color=COLORS["compute"], ms=9)
        a.plot([x0, x0 + 1.65], [0.15, 0.15], color="#2ca02c", lw=3, alpha=0.6)
        leaf = 1.9 if node < 2 else 6.9
        a.plot([x0 + 0.8, leaf], [0.35, 1.5], color=COLORS["comm"], lw=1.2)
    for leaf in (1.9, 6.9):
        a.plot(leaf, 1.5, "o", color="k", ms=8)
        a.plot([leaf, 4.4], [1.5, 2.6], color=COLORS["comm"], lw=2)
    a.plot(4.4, 2.6, "o", color="k", ms=10)
    a.text(4.4, 2.85, "spine switch", ha="center")
    a.text(-0.2, -0.7, "node = 4 GPUs on NVLink (green); nodes reach each other via leaf and spine\n"
           "switches over InfiniBand (orange): any GPU can reach any other, few hops",
           fontsize=8, va="top")
    a.set_title("GPU cluster: fat tree")
    a.set_xlim(-0.5, 10)
    a.set_ylim(-1.5, 3.1)
    a.axis("off")
    k = 4
    for i in range(k):
        for j in range(k):
            if i < k - 1:
                b.plot([i, i + 1], [j, j], color="#2ca02c", lw=2, zorder=1)
            if j < k - 1:
                b.plot([i, i], [j, j + 1], color="#2ca02c", lw=2, zorder=1)
            b.plot(i, j, "s", color=COLORS["compute"], ms=11, zorder=2)
    for t in range(k):  # wrap-around links, drawn as arcs past the edge
        b.annotate("", xy=(0, t), xytext=(k - 1, t), arrowprops=dict(
            arrowstyle="-", color="#2ca02c", lw=1, ls=":", connectionstyle="arc3,rad=0.12"))
        b.annotate("", xy=(t, 0), xytext=(t, k - 1), arrowprops=dict(
            arrowstyle="-", color="#2ca02c", lw=1, ls=":", connectionstyle="arc3,rad=-0.12"))
    b.text(-0.5, -0.9, "every chip links only to its 4 neighbours; edges wrap around (dotted):\n"
           "cheap, regular neighbour traffic; far chips are many hops apart", fontsize=8, va="top")
    b.set_title("TPU pod: 2D torus")
    b.set_xlim(-0.8, k)
    b.set_ylim(-1.7, k)
    b.axis("off")
    fig.tight_layout()
    return fig


def primitives(n=4, figsize=(9, 2.6)):
    """All-reduce, reduce-scatter and all-gather on n ranks, as before/after bars."""
    fig, axes = plt.subplots(1, 3, figsize=figsize)
    colors = plt.cm.tab10(np.arange(n))
    for ax, name in zip(axes, ("all-reduce", "reduce-scatter", "all-gather")):
        for r in range(n):
            y = n - 1 - r
            if name == "all-gather":
                ax.barh(y, 1, left=r, color=colors[r], height=0.6)
                for c in range(n):
                    ax.barh(y, 1, left=n + 1.5 + c, color=colors[c], height=0.6)
            else:
                for c in range(n):
                    ax.barh(y, 1, left=c, color=colors[r], height=0.6, alpha=0.8)
                span = range(n) if name == "all-reduce" else [r]
                for c in span:
                    ax.barh(y, 1, left=n + 1.5 + c, color="#444444", height=0.6)
        ax.annotate("", xy=(n + 1.3, (n - 1) / 2), xytext=(n + 0.2, (n - 1) / 2),
                    arrowprops=dict(arrowstyle="->", lw=1.5))
        ax.set_yticks(range(n))
        ax.set_yticklabels([f"rank {r}" for r in reversed(range(n))], fontsize=8)
        ax.set_xticks([])
        ax.set_title(name)
    axes[0].text(0, -1.1, "colour = a rank's input; dark = sum over ranks", fontsize=8)
    fig.tight_layout()
    return fig
