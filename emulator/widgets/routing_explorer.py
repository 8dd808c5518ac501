"""MoE routing explored: experts, top-k, capacity factor, how strongly the router favours
expert 0 (skew), and the EP size. 512 tokens of a small MoE layer are routed; the bars
show the assignments each expert receives against its capacity, the dropped ones, and
the layer runs on the emulator with expert parallelism for each rank's all-to-all bytes
and time."""

import ipywidgets as W
import numpy as np
from matplotlib.figure import Figure

from .. import nn
from ..engine.world import World
from ..nn.moe import capacity, keep_first, route
from ..parallel import expert_parallel as ep
from .common import show_model

TOKENS, D = 512, 16


def routing_explorer_model(n_experts=8, top_k=2, capacity_factor=1.25, skew=1.0, ep_size=4):
    """Routing counts, drops and the emulator's all-to-all bytes and time per rank."""
    if n_experts % ep_size:
        raise ValueError(f"{n_experts} experts do not split over EP {ep_size}: pick an EP size that divides them")
    if top_k > n_experts:
        raise ValueError(f"top-k ({top_k}) cannot exceed the number of experts ({n_experts})")
    rng = np.random.default_rng(0)
    moe = nn.MoE(D, 2 * D, n_experts, top_k, capacity_factor, dtype=np.float32)
    params = moe.init(rng)
    params["router.w"] = (rng.standard_normal((D, n_experts)) * 0.5).astype(np.float32)
    x = rng.standard_normal((TOKENS, D)).astype(np.float32)
    x[:, 0] = 1.0  # a constant feature: through it the router adds `skew` to expert 0's logit
    params["router.w"][0] = 0.0
    params["router.w"][0, 0] = skew
    idx, _, _ = route(params["router.w"], x, top_k)
    ids = idx.ravel()
    wanted = np.bincount(ids, minlength=n_experts)
    cap = capacity(TOKENS, top_k, n_experts, capacity_factor)
    kept = np.bincount(ids[keep_first(ids, n_experts, cap)], minlength=n_experts)
    world = World(ep_size)
    shards = np.split(x, ep_size)
    world.run(lambda comm: ep.forward(comm, moe, ep.shard_experts(params, ep_size, comm.rank), shards[comm.rank]))
    stats = world.stats()
    fig = Figure(figsize=(8.4, 3.0), dpi=100)
    ax, bx = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    ax.bar(range(n_experts), wanted, color="#DDDDDD", label="routed")
    ax.bar(range(n_experts), kept, color="#4C72B0", label="computed")
    if cap is not None:
        ax.axhline(cap, color="black", ls="--", lw=1, label=f"capacity {cap}")
    ax.set_xticks(range(n_experts))
    ax.set_xlabel("expert")
    ax.set_ylabel("assignments")
    ax.legend(fontsize=7, frameon=False)
    ax.set_title(f"{TOKENS} tokens, top-{top_k}", fontsize=8)
    bx.bar(range(ep_size), [b / 1e3 for b in stats.bytes_sent], color="#DD8452")
    bx.set_xticks(range(ep_size))
    bx.set_xlabel("EP rank")
    bx.set_ylabel("kB sent (all-to-alls)")
    bx.set_title("per rank: bytes; time in the caption", fontsize=8)
    fig.tight_layout()
    dropped = int((wanted - kept).sum())
    text = (f"{dropped} of {TOKENS * top_k} assignments dropped"
            + (f" (capacity {cap} per expert)" if cap is not None else " (dropless)")
            + f"; busiest expert {wanted.max()} vs mean {wanted.mean():.0f}. Per EP rank: "
            + ", ".join(f"{b / 1e3:.1f} kB in {t * 1e6:.1f} us" for b, t in zip(stats.bytes_sent, stats.time)))
    return {"wanted": wanted, "kept": kept, "capacity": cap, "dropped": dropped, "bytes": list(stats.bytes_sent),
            "text": text, "figure": fig}


class RoutingExplorer(W.VBox):
    """Controls: experts, top-k, capacity factor (0: dropless), router skew, EP size."""

    state = None  # the model's last accepted state

    def __init__(self, n_experts=8, top_k=2, capacity_factor=1.25, skew=1.0, ep=4):
        self.n_experts = W.Dropdown(options=[4, 8, 16], value=n_experts, description="experts")
        self.top_k = W.IntSlider(value=top_k, min=1, max=4, description="top-k")
        self.cf = W.FloatSlider(value=capacity_factor or 0.0, min=0.0, max=3.0, step=0.25,
                                description="capacity (0: none)", style={"description_width": "initial"})
        self.skew = W.FloatSlider(value=skew, min=0.0, max=4.0, step=0.5, description="skew")
        self.ep = W.Dropdown(options=[1, 2, 4, 8], value=ep, description="EP size")
        self.summary = W.HTML()
        self.image = W.Image(format="png")
        super().__init__([W.HBox([self.n_experts, self.top_k, self.ep]), W.HBox([self.cf, self.skew]), self.summary,
                          self.image])
        for c in (self.n_experts, self.top_k, self.cf, self.skew, self.ep):
            c.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, change=None):
        self.state = show_model(self.summary, self.image, "routing-summary", routing_explorer_model,
                                self.n_experts.value, self.top_k.value, self.cf.value or None,
                                self.skew.value, self.ep.value) or self.state
