"""Pictures of plans: where each coordinate of a mesh sits, and predicted beside published."""

import matplotlib.pyplot as plt


STAGE_COLORS = ["#aed6f1", "#f9e79f", "#abebc6", "#f5cba7", "#d7bde2", "#f5b7b1", "#a3e4d7", "#d5dbdb"]


def mesh_layout(dims, gpus_per_node=8, ax=None, max_nodes=8):
    """Nodes as rows, GPUs as cells: each cell's colour is its pipeline stage and its text
    its data- and tensor-parallel coordinates (and cp, ep when used). A caption under the
    grid says which link each axis's group uses."""
    mesh = dims.mesh(gpus_per_node)
    nodes = min(max_nodes, -(-mesh.size // gpus_per_node))
    if ax is None:
        _, ax = plt.subplots(figsize=(1.05 * gpus_per_node + 1.2, 0.55 * nodes + 1.2))
    for node in range(nodes):
        for g in range(gpus_per_node):
            rank = node * gpus_per_node + g
            if rank >= mesh.size:
                continue
            c = mesh.coords(rank)
            ax.add_patch(plt.Rectangle((g, nodes - 1 - node), 0.94, 0.9, color=STAGE_COLORS[c["pp"] % 8]))
            extra = "".join(f" {a}{c[a]}" for a in ("cp",) if dims.cp > 1)
            ax.text(g + 0.47, nodes - 1 - node + 0.45, f"dp{c['dp']} tp{c['tp']}{extra}\npp{c['pp']}", ha="center",
                    va="center", fontsize=6.5)
    ax.set_xlim(0, gpus_per_node)
    ax.set_ylim(0, nodes)
    ax.set_yticks([nodes - 0.55 - n for n in range(nodes)], [f"node {n}" for n in range(nodes)], fontsize=8)
    ax.set_xticks([g + 0.47 for g in range(gpus_per_node)], [f"gpu {g}" for g in range(gpus_per_node)], fontsize=8)
    ax.tick_params(length=0)
    for side in ax.spines.values():
        side.set_visible(False)
    links = []
    for axis in ("tp", "cp", "dp", "pp"):
        if getattr(dims, axis) > 1:
            group = mesh.group_ranks(axis, 0)
            across = len({r // gpus_per_node for r in group}) > 1
            links.append(f"{axis} groups on {'the NICs (across nodes)' if across else 'NVLink (one node)'}")
    ax.set_title(f"{dims}: colour = pipeline stage\n" + "; ".join(links), fontsize=8)
    return ax


def published_plot(rows, ax=None, target=0.15):
    """``rows``: (source, published, predicted) teraFLOP/s per GPU. Predicted against
    published, the diagonal and a band of +-``target``."""
    if ax is None:
        _, ax = plt.subplots(figsize=(5.2, 4.4))
    top = max(max(p, q) for _, p, q in rows) * 1.1
    ax.plot([0, top], [0, top], color="black", lw=0.8)
    ax.fill_between([0, top], [0, top * (1 - target)], [0, top * (1 + target)], color="#d5dbdb", alpha=0.6,
                    label=f"within {target:.0%}")
    markers = {}
    for source, published, predicted in rows:
        name = source.split(",")[0].split(" (")[0]
        if name not in markers:
            markers[name] = "osD^v"[len(markers) % 5]
        ax.scatter([published], [predicted], marker=markers[name], s=30,
                   label=name if name not in ax.get_legend_handles_labels()[1] else None)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel("published teraFLOP/s per GPU")
    ax.set_ylabel("planner's prediction")
    ax.set_title("the planner beside published runs (each source's FLOP count)", fontsize=9)
    ax.legend(fontsize=7, frameon=False, loc="upper left")
    return ax


COLOURS = {"GEMMs": "#2e86c1", "attention": "#5dade2", "memory-bound kernels": "#48c9b0",
           "launch and dispatch": "#f4d03f", "optimizer": "#af7ac5", "tp": "#e67e22", "cp": "#dc7633",
           "ep": "#ba4a00", "dp": "#c0392b", "bubble": "#bfc9ca"}


def draw_breakdown(ax, parts, step, y=0, legend=True):
    """One stacked bar at ``y``: where the step goes (:mod:`emulator.planner.breakdown`), in
    seconds, each part's share of ``step`` in the legend."""
    left = 0.0
    for name, seconds in parts.items():
        if seconds <= 0:
            continue
        ax.barh([y], [seconds], left=left, color=COLOURS.get(name, "#7f8c8d"),
                label=f"{name} {seconds / step:.0%}" if legend else None)
        left += seconds
    ax.set_yticks([])
    ax.set_xlabel("seconds of the step (critical rank)")
    if legend:
        ax.legend(fontsize=6, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def breakdown_bars(rows, ax=None):
    """``rows``: (label, {category: seconds}, predicted step, published step or None). One
    bar per row, its predicted step split as :func:`draw_breakdown` splits it and scaled to
    1, with a black tick where the published step ends (the published step over the
    predicted one)."""
    if ax is None:
        _, ax = plt.subplots(figsize=(7.5, 0.28 * len(rows) + 1.2))
    seen = set()
    for y, (label, parts, step, published) in enumerate(rows):
        left = 0.0
        for name, seconds in parts.items():
            if seconds <= 0:
                continue
            ax.barh([y], [seconds / step], left=left, color=COLOURS.get(name, "#7f8c8d"),
                    label=name if name not in seen else None)
            seen.add(name)
            left += seconds / step
        if published is not None:
            ax.plot([published / step] * 2, [y - 0.42, y + 0.42], color="black", lw=2,
                    label="published step" if "published" not in seen else None)
            seen.add("published")
    ax.set_yticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.6, ls=":")
    ax.set_xlabel("share of the predicted step (critical rank)")
    handles, labels = ax.get_legend_handles_labels()
    order = list(COLOURS) + ["published step"]
    pairs = sorted(zip(handles, labels), key=lambda hl: order.index(hl[1]) if hl[1] in order else len(order))
    ax.legend(*zip(*pairs), fontsize=6, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax
