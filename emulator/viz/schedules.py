"""Pictures of pipeline schedules: the grid of who computes what when, and the
activations each stage holds over a step.

``schedule_grid(schedule)`` draws :func:`emulator.parallel.pipeline.simulate`'s timing (equal
stages, a free network): one row per rank, a box per action labelled with its micro-batch,
coloured by kind (forward, backward or input gradient, weight gradient); chunks of an
interleaved schedule are told apart by shade. The executed run is drawn by
:func:`emulator.viz.gantt` with ``colors=ACTION_COLORS``.
"""

import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from ..parallel.pipeline import bubble_of, simulate

ACTION_COLORS = {"F": "#4C72B0", "B": "#55A868", "W": "#8172B2"}
_LIGHT = {"F": "#A1B7DC", "B": "#A8D3B2", "W": "#C0B7DA"}


def schedule_grid(schedule, costs=(1, 1, 1), ax=None, title=None, figsize=None):
    """The schedule on a time axis in units of a stage's forward (``costs=(t_f, t_b, t_w)``).
    Returns the Figure; the title gives the bubble."""
    timing = simulate(schedule, costs)
    p = len(schedule)
    end = max(e for acts in timing.values() for _, _, e in acts)
    if ax is None:
        fig, ax = plt.subplots(figsize=figsize or (min(14, 2 + 0.32 * end * p / max(1, p) + 4), 0.42 * p + 1.1))
    else:
        fig = ax.figure
    for r, acts in timing.items():
        for a, s, e in acts:
            color = (_LIGHT if a.chunk % 2 else ACTION_COLORS)[a.kind]
            ax.broken_barh([(s, e - s)], (r - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.6)
            if (e - s) / end > 0.012:
                ax.text((s + e) / 2, r, str(a.microbatch), ha="center", va="center", fontsize=7, color="white"
                        if a.chunk % 2 == 0 else "black", clip_on=True)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"rank {r}" for r in range(p)], fontsize=8)
    ax.set_ylim(p - 0.5, -0.6)
    ax.set_xlim(0, end)
    ax.set_xlabel("time (one stage's forward = 1)" if tuple(costs)[0] == 1 else "time")
    kinds = sorted({a.kind for acts in schedule for a in acts}, key="FBW".index)
    names = {"F": "forward", "B": "backward" if "W" not in kinds else "B: input gradient", "W": "W: weight gradient"}
    handles = [Patch(color=ACTION_COLORS[k], label=names[k]) for k in kinds]
    if any(a.chunk for acts in schedule for a in acts):
        handles.append(Patch(color=_LIGHT["F"], label="odd chunks (lighter)"))
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(title or f"bubble {bubble_of(timing):.1%}", fontsize=9)
    fig.tight_layout()
    return fig


def activations_over_time(world, ax=None, title=None, unit="ms", per=None, label=None):
    """Activation bytes each rank holds over simulated time, one line per rank; with
    ``per`` (bytes of one micro-batch) in micro-batches."""
    fig, ax = (plt.subplots(figsize=(7.5, 2.6)) if ax is None else (ax.figure, ax))
    scale = {"s": 1.0, "ms": 1e3, "us": 1e6}[unit]
    for led in world.memory:
        times, by_kind = led.history_by_kind()
        ax.step(times * scale, by_kind["activations"] / (per or 1e3), where="post", label=f"rank {led.rank}")
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_ylabel(label or ("micro-batches held" if per else "kB of activations"))
    ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
