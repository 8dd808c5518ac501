"""Failures and checkpoints: job size, how often a GPU fails, what a save costs, how often
to save, synchronous or asynchronous; a simulated run's timeline (work, saves, failures,
lost work, restarts) and the goodput against the interval, the optimum marked."""

import ipywidgets as W
import numpy as np

from ..accounting import failures as F
from ..parallel.checkpoint.storage import Storage
from .common import new_axes, show_figure

GPU_COUNTS = [1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072]
KIND_COLORS = {"work": "#4C72B0", "save": "#55A868", "lost": "#C44E52", "restart": "#DDAA33"}
COPY_SHARE = Storage().write_bandwidth / Storage().host_bandwidth  # an async save stops training for the copy only
LLAMA3_GPU_MTBF_HOURS = int(round(F.LLAMA3_INTERRUPTIONS["gpus"] * F.llama3_job_mtbf() / 3600, -2))  # 50,700 h
MTBF_HOURS = [5000, 10000, 20000, 30000, LLAMA3_GPU_MTBF_HOURS, 80000, 100000, 200000]
SAVE_SECONDS = [1, 5, 10, 30, 60, 120, 300, 600]
INTERVAL_MINUTES = [1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120, 240]


def failure_explorer_model(gpus=16384, gpu_mtbf_hours=LLAMA3_GPU_MTBF_HOURS, save_seconds=60.0, interval_minutes=20.0,
                           async_save=False, restart_minutes=15.0, days=2.0, seed=0):
    """One simulated run of ``days`` of work and the goodput curve, for these settings.
    Asynchronous saving stops training only to copy to host memory (the write's share
    ``COPY_SHARE``) and completes ``save_seconds`` later."""
    mtbf = F.job_mtbf(gpu_mtbf_hours * 3600, gpus)
    block = save_seconds * COPY_SHARE if async_save else save_seconds
    lag = save_seconds if async_save else 0.0
    restart, interval = restart_minutes * 60, interval_minutes * 60
    best = F.best_interval(block, mtbf, restart, lag)
    spans, failures = F.simulate_run(interval, block, mtbf, restart, lag, work=days * F.DAY, seed=seed)
    wall = spans[-1].end
    done = sum(s.end - s.start for s in spans if s.kind == "work")
    lost = sum(s.end - s.start for s in spans if s.kind == "lost")
    expected = F.expected_goodput(interval, block, mtbf, restart, lag)
    at_best = F.expected_goodput(best, block, mtbf, restart, lag)
    grid = np.geomspace(max(min(best, interval) / 10, 1.0), max(best, interval) * 10, 60)
    curve = [F.expected_goodput(t, block, mtbf, restart, lag) for t in grid]
    sims = grid[::10]
    sim = [F.simulate_goodput(t, block, mtbf, restart, lag, work=20 * mtbf, runs=40, seed=seed + 1).mean()
           for t in sims]

    fig, (top, bottom) = _two_axes()
    for kind, color in KIND_COLORS.items():
        bars = [(s.start / 3600, (s.end - s.start) / 3600) for s in spans if s.kind == kind]
        top.broken_barh(bars, (0, 1), facecolors=color, label=kind)
    top.vlines([f / 3600 for f in failures], -0.15, 1.15, color="black", lw=0.8, label="failure")
    top.set_xlim(0, wall / 3600)
    top.set_yticks([])
    top.set_xlabel("hours of wall time")
    top.set_title(f"one run of {days:g} days of work: {len(failures)} failures, goodput {done / wall:.1%}",
                  fontsize=9)
    top.legend(fontsize=7, ncol=5, loc="upper center", bbox_to_anchor=(0.5, -1.05), frameon=False)
    bottom.semilogx(grid / 60, curve, color="#4C72B0", label="expected (Daly's model)")
    bottom.plot(sims / 60, sim, "o", ms=4, color="black", label="simulated, 40 runs")
    bottom.axvline(best / 60, color="#55A868", ls="--", lw=1, label=f"optimum {best / 60:.1f} min")
    bottom.axvline(interval / 60, color="#C44E52", lw=1, label=f"yours {interval_minutes:.3g} min")
    bottom.set_xlabel("checkpoint interval (minutes)")
    bottom.set_ylabel("goodput")
    bottom.set_ylim(max(0.0, min(curve) - 0.02), 1.0)
    bottom.legend(fontsize=7, loc="lower center")
    text = (f"{gpus:,} GPUs failing once per {gpu_mtbf_hours:,.0f} h each: the job fails every {mtbf / 3600:.2f} h. "
            f"{'An asynchronous' if async_save else 'A synchronous'} save stops training {block:.3g} s"
            + (f" (then writes for {lag:g} s in the background)" if async_save else "") +
            f". Saving every {interval_minutes:.3g} min: expected goodput {expected:.1%}; the best interval is "
            f"{best / 60:.1f} min ({at_best:.1%}). This run lost {lost / 3600:.1f} h of work and "
            f"{sum(s.end - s.start for s in spans if s.kind == 'restart') / 3600:.1f} h restarting.")
    return {"mtbf": mtbf, "best": best, "expected": expected, "at_best": at_best, "failures": failures,
            "spans": spans, "goodput_run": done / wall, "text": text, "figure": fig}


def _two_axes():
    fig, top = new_axes(7.5, 4.8)
    top.set_position([0.08, 0.82, 0.88, 0.1])
    bottom = fig.add_axes([0.08, 0.1, 0.88, 0.5])
    return fig, (top, bottom)


def _options(values, value):
    """The slider's stops, with ``value`` among them (a value the widget was given)."""
    return sorted(set(values) | {value})


class FailureExplorer(W.VBox):
    """Controls: GPUs, a GPU's mean time between failures, the save's cost, the interval,
    asynchronous saving, the restart's cost. Sliders stop at listed values (what the
    browser sends back is then exactly what the model was given)."""

    def __init__(self, gpus=16384, gpu_mtbf_hours=LLAMA3_GPU_MTBF_HOURS, save_seconds=60, interval_minutes=20,
                 async_save=False, restart_minutes=15):
        self.gpus = W.SelectionSlider(options=_options(GPU_COUNTS, gpus), value=gpus, description="GPUs")
        self.gpu_mtbf = W.SelectionSlider(options=_options(MTBF_HOURS, gpu_mtbf_hours), value=gpu_mtbf_hours,
                                          description="GPU MTBF (h)")
        self.save = W.SelectionSlider(options=_options(SAVE_SECONDS, save_seconds), value=save_seconds,
                                      description="save (s)")
        self.interval = W.SelectionSlider(options=_options(INTERVAL_MINUTES, interval_minutes), value=interval_minutes,
                                          description="interval (min)")
        self.async_save = W.Checkbox(value=async_save, description="asynchronous save")
        self.restart = W.IntSlider(value=restart_minutes, min=1, max=60, description="restart (min)")
        for c in (self.gpu_mtbf, self.save, self.interval, self.restart):
            c.style.description_width = "100px"
        self.summary = W.HTML()
        self.image = W.Image(format="png")
        super().__init__([W.HBox([self.gpus, self.gpu_mtbf]), W.HBox([self.save, self.interval]),
                          W.HBox([self.restart, self.async_save]), self.summary, self.image])
        for c in (self.gpus, self.gpu_mtbf, self.save, self.interval, self.async_save, self.restart):
            c.observe(self._redraw, names="value")
        self._redraw()

    def _redraw(self, change=None):
        self.state = failure_explorer_model(self.gpus.value, self.gpu_mtbf.value, self.save.value,
                                            self.interval.value, self.async_save.value, self.restart.value)
        self.summary.value = f"<p class='failure-summary'>{self.state['text']}</p>"
        show_figure(self.image, self.state["figure"])
