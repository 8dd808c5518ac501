"""How much memory each GPU needs for parameters, gradients and optimizer state, by ZeRO
stage, against an 80 GB GPU."""

import ipywidgets as W
import numpy as np

from ..accounting import zero_bytes_per_gpu
from .common import new_axes, show_figure

STAGES = {"DDP": 0, "ZeRO-1": 1, "ZeRO-2": 2, "ZeRO-3": 3}
KIND_COLORS = {"params": "#4C72B0", "grads": "#55A868", "optimizer": "#C44E52"}
GPU_COUNTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
# Problem 8.1's 30B is left out on purpose: the widget should not answer it
MODEL_SIZES = [("125M", 125e6), ("1.3B", 1.3e9), ("7.5B", 7.5e9), ("13B", 13e9), ("70B", 70e9),
               ("175B", 175e9), ("405B", 405e9), ("1T", 1e12)]


def zero_explorer_model(n_params, dp_size, zero_stage, k=12, gpu_gb=80):
    """Per-GPU bytes at every stage (the chosen one highlighted) and whether it fits."""
    rows = {s: zero_bytes_per_gpu(n_params, dp_size, s, k) for s in range(4)}
    chosen = rows[zero_stage]
    fits = chosen / 1e9 <= gpu_gb
    name = [k_ for k_, v in STAGES.items() if v == zero_stage][0]
    text = (f"{name} on {dp_size} GPU{'s' * (dp_size > 1)}: {chosen / 1e9:.4g} GB per GPU "
            f"(params {chosen.params / 1e9:.3g}, grads {chosen.grads / 1e9:.3g}, "
            f"optimizer {chosen.optimizer / 1e9:.3g}) — "
            + ("fits in" if fits else "does not fit in") + f" {gpu_gb} GB, before activations")
    fig, ax = new_axes(6.2, 2.8)
    x = np.arange(4)
    bottom = np.zeros(4)
    for kind, color in KIND_COLORS.items():
        vals = np.array([getattr(rows[s], kind) / 1e9 for s in range(4)])
        ax.bar(x, vals, bottom=bottom, color=color, label=kind,
               edgecolor=["black" if s == zero_stage else "none" for s in range(4)], linewidth=1.5)
        bottom += vals
    ax.axhline(gpu_gb, color="black", ls="--", lw=1)
    ax.text(3.45, gpu_gb, f"{gpu_gb} GB", va="bottom", ha="right", fontsize=8)
    for s in range(4):
        ax.text(s, bottom[s], f"{bottom[s]:.3g}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x)
    ax.set_xticklabels(list(STAGES))
    ax.set_ylabel("GB per GPU")
    ax.set_title(f"{n_params / 1e9:.3g}B parameters, K = {k} bytes/param, {dp_size} GPUs", fontsize=9)
    ax.legend(fontsize=8, loc="upper right")
    ax.set_ylim(0, max(bottom.max(), gpu_gb) * 1.15)
    fig.tight_layout()
    return {"bytes": {s: rows[s].as_dict() for s in range(4)}, "fits": fits, "text": text, "figure": fig}


class ZeroExplorer(W.VBox):
    """Controls: model size, number of GPUs, ZeRO stage, optimizer bytes per parameter."""

    def __init__(self, n_params=7.5e9, dp_size=64, zero_stage=0, k=12):
        sizes = dict(MODEL_SIZES)
        if n_params not in sizes.values():
            sizes[f"{n_params / 1e9:.3g}B"] = n_params
        self.params = W.SelectionSlider(options=sorted(sizes.items(), key=lambda kv: kv[1]), value=n_params,
                                        description="parameters")
        self.gpus = W.SelectionSlider(options=GPU_COUNTS, value=dp_size, description="GPUs")
        self.zero_stage = W.Dropdown(options=list(STAGES.items()), value=zero_stage, description="ZeRO stage")
        self.k = W.IntSlider(value=k, min=0, max=16, description="K (bytes)")
        self.summary = W.HTML()
        self.image = W.Image(format="png")
        super().__init__([W.HBox([self.params, self.gpus]), W.HBox([self.zero_stage, self.k]), self.summary, self.image])
        for c in (self.params, self.gpus, self.zero_stage, self.k):
            c.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, change=None):
        self.state = zero_explorer_model(self.params.value, self.gpus.value, self.zero_stage.value, self.k.value)
        self.summary.value = f"<p class='zero-summary'>{self.state['text']}</p>"
        show_figure(self.image, self.state["figure"])
