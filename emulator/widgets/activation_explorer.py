"""Activation memory of a transformer's layers per GPU, term by term (Korthikanti et al.
2022, whose attention kept its scores: the ``"megatron-2021"`` stack),
for a configuration of sequence, batch, width, heads, tensor parallelism, sequence
parallelism and recomputation; beside it, for a small configuration, the bytes the
tensor-parallel block really keeps on the emulator."""

import ipywidgets as W
import matplotlib.pyplot as plt
import numpy as np
from ml_dtypes import bfloat16

from .. import nn
from ..engine.world import World
from ..accounting import activation_terms
from ..parallel.tensor_parallel.block import TensorParallelBlock, cached_terms
from .common import new_axes, show_model

RECOMPUTE = ("none", "selective", "full")
MEASURE_LIMIT = 2**22  # s*b*h above which the measured bar is not drawn (the emulator would take long)


def measured_terms(s, b, h, a, t, sp, recompute):
    """Bytes one layer keeps on rank 0, by term, running the TP block on ``World(t)`` under
    the stack the formula describes (``"megatron-2021"``: attention's scores kept)."""
    params = nn.TransformerBlock(h, a, 4 * h).init(np.random.default_rng(0))
    x = np.zeros((b, s // t if sp else s, h), np.float32)

    def prog(comm):
        block = TensorParallelBlock(comm, h, a, 4 * h, sequence_parallel=sp, dropout=0.1, act_dtype=bfloat16,
                                    recompute=recompute)
        return cached_terms(block.forward(block.shard(params), x)[1])

    return World(t, stack="megatron-2021").run(prog)[0]


def activation_explorer_model(s, b, h, a, t=1, layers=1, sp=False, recompute="none", gpu_gb=80, measure=True):
    """Per-GPU activation bytes of ``layers`` layers by term, the total against ``gpu_gb``,
    and (when small enough) the measured bytes of one layer."""
    terms = activation_terms(s, b, h, a, t, sp, recompute)
    total = layers * sum(terms.values())
    small = measure and s * b * h <= MEASURE_LIMIT
    measured = measured_terms(s, b, h, a, t, sp, recompute) if small else None
    fig, ax = new_axes(6.8, 3.0)
    names = list(activation_terms(s, b, h, a, t, sp, "none")) + ["layer input"]
    colors = dict(zip(names, plt.cm.tab20(np.arange(len(names)) % 20)))
    unit, label = (1e9, "GB") if total > 1e9 else (1e6, "MB") if total > 1e6 else (1e3, "kB")
    bars = [("formula", {k: layers * v for k, v in terms.items()})]
    if measured is not None:
        bars.append(("measured", {k: layers * measured[k] for k in terms if k in measured}))
    for i, (_, parts) in enumerate(bars):
        bottom = 0.0
        for k, v in parts.items():
            ax.bar(i, v / unit, bottom=bottom, color=colors[k], label=k if i == 0 else None, width=0.6)
            bottom += v / unit
    if gpu_gb * 1e9 / unit < 2 * total / unit:
        ax.axhline(gpu_gb * 1e9 / unit, color="black", ls="--", lw=1)
        ax.text(len(bars) - 0.5, gpu_gb * 1e9 / unit, f"{gpu_gb} GB GPU", fontsize=8, ha="right", va="bottom")
    ax.set_xticks(range(len(bars)))
    ax.set_xticklabels([n for n, _ in bars])
    ax.set_ylabel(f"{label} per GPU")
    ax.set_title(f"{layers} layer(s), s={s} b={b} h={h} a={a}, t={t}{' + SP' if sp else ''}, recompute={recompute}",
                 fontsize=8)
    ax.legend(fontsize=6, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    ax.set_xlim(-0.7, len(bars) - 0.3)
    fig.tight_layout()
    fits = total <= gpu_gb * 1e9
    text = (f"{total / unit:,.4g} {label} of activations per GPU for {layers} layer(s) "
            f"({'fits in' if fits else 'does not fit in'} {gpu_gb} GB)"
            + (f"; measured on the emulator: {layers * sum(measured.values()) / unit:,.4g} {label}"
               if measured is not None else "; too large to run on the emulator here"))
    return {"terms": terms, "total": total, "measured": measured, "fits": fits, "text": text, "figure": fig}


class ActivationExplorer(W.VBox):
    """Controls: sequence, micro-batch, hidden, heads, tensor-parallel size, layers,
    sequence parallelism, recomputation."""

    state = None  # the model's last accepted state

    def __init__(self, s=2048, b=1, h=4096, a=32, t=1, layers=32, sp=False, recompute="none"):
        self.s = W.SelectionSlider(options=[128, 256, 512, 1024, 2048, 4096, 8192, 16384], value=s, description="s")
        self.b = W.SelectionSlider(options=[1, 2, 4, 8], value=b, description="b")
        self.h = W.SelectionSlider(options=[64, 128, 256, 1024, 4096, 8192, 12288], value=h, description="h")
        self.a = W.SelectionSlider(options=[4, 8, 16, 32, 64, 96], value=a, description="heads")
        self.t = W.SelectionSlider(options=[1, 2, 4, 8], value=t, description="t (TP)")
        self.layers = W.SelectionSlider(options=[1, 12, 24, 32, 48, 80, 96, 126], value=layers, description="layers")
        self.sp = W.Checkbox(value=sp, description="sequence parallel")
        self.recompute = W.Dropdown(options=RECOMPUTE, value=recompute, description="recompute")
        self.summary = W.HTML()
        self.image = W.Image(format="png")
        rows = [W.HBox([self.s, self.b, self.h]), W.HBox([self.a, self.t, self.layers]),
                W.HBox([self.sp, self.recompute])]
        super().__init__(rows + [self.summary, self.image])
        for c in (self.s, self.b, self.h, self.a, self.t, self.layers, self.sp, self.recompute):
            c.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, change=None):
        self.state = show_model(self.summary, self.image, "activation-summary", activation_explorer_model,
                                self.s.value, self.b.value, self.h.value, self.a.value, self.t.value,
                                self.layers.value, self.sp.value, self.recompute.value) or self.state
