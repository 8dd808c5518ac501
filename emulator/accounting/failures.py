"""Failures at scale in numbers: how often a job fails, how often to checkpoint, and the
share of time spent making progress (goodput).

The model (Young 1974; Daly 2006): failures strike the job at random, as a Poisson
process of mean time between failures ``M`` (a job of N GPUs, each failing
independently with mean time ``m``, has ``M = m / N``). Training runs in segments of
``interval`` seconds of work, each closed by a checkpoint that stops training for
``save_cost`` seconds. A failure loses the work since the last checkpoint that was
complete, and costs ``restart`` seconds (detection, relaunch, reading the checkpoint;
a failure can strike a restart too). Asynchronous saving stops training only for the
copy to host memory (``save_cost``) but completes ``lag`` seconds later: a failure in
that window loses the previous interval as well, and a save cannot start before the
previous one's write has ended (training waits ``lag - interval`` when the interval is
the shorter).

* :func:`job_mtbf`: ``m / N``;
* :func:`young_interval`: ``sqrt(2 save_cost M)``, the interval that minimises the
  first-order cost ``save_cost / interval + interval / (2 M)`` (J. W. Young, "A first
  order approximation to the optimum checkpoint interval", CACM 17(9), 1974);
* :func:`daly_interval`: Daly's higher-order estimate, ``sqrt(2 d M) (1 + sqrt(d/2M)/3 +
  (d/2M)/9) - d`` for ``d < 2M``, else ``M`` (J. T. Daly, "A higher order estimate of
  the optimum checkpoint interval for restart dumps", Future Generation Computer
  Systems 22(3), 2006; it predicts 117, 57 and 9.1 minutes for d = 5 min and M = 24 h,
  6 h and 15 min, the cases of its figures 3 to 5);
* :func:`expected_goodput`: the expectation, from Daly's complete model: a segment of
  ``c = interval + save_cost`` takes ``M e^(R/M) (e^(c/M) - 1)`` seconds of wall time on
  average. Counted between failures instead: a stretch from a restart to the next failure
  lasts ``M`` on average (then ``M (e^(R/M) - 1)`` more to restart) and completes
  ``1 / (e^(c/M) - 1)`` segments; asynchronous saving keeps a segment less whenever the
  failure comes less than ``lag`` after a checkpoint, which leaves ``e^(-lag/M) / (e^(c/M)
  - 1)``. So goodput = ``interval e^(-lag/M) / (M e^(R/M) (e^(c/M) - 1))``;
* :func:`simulate_goodput`: the same by Monte Carlo, many runs with failures drawn at
  random; :func:`simulate_run`: one run, event by event, for a picture.

Llama 3's pretraining numbers (:data:`LLAMA3_INTERRUPTIONS`): 466 job interruptions in a
54-day snapshot on up to 16,384 H100 GPUs, 47 planned and 419 unexpected, 148 of these
from faulty GPUs; more than 90% effective training time (Llama 3 paper, "The Llama 3 Herd
of Models", arXiv 2407.21783, section 3.3.4 and its table 5). 419 unexpected in 54 days
is one every 3.1 hours. :data:`LLAMA3_TABLE5` is that table row by row, and
:func:`llama3_interruptions_by` adds it up by category or component.
"""

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError

HOUR, DAY = 3600.0, 86400.0

LLAMA3_INTERRUPTIONS = dict(days=54, gpus=16384, total=466, planned=47, unexpected=419, faulty_gpu=148, gpu_hbm3=72,
                            software_bug=54, network=35, host_maintenance=32, nccl_watchdog_timeouts=7,
                            effective_training_time=0.90,
                            source="Llama 3 paper (arXiv 2407.21783), section 3.3.4, table 5")


# Llama 3 paper, Table 5: root causes of the 419 unexpected interruptions of the 54-day
# snapshot, (component, category, interruptions, the percentage as printed). The counts add
# up to 419; the printed percentages add up to 94.9%, since the first row's 30.1% is not
# 148 / 419 (35.3%), and the text's 58.7% for GPU issues is the GPU rows' printed percentages.
LLAMA3_TABLE5 = (
    ("Faulty GPU", "GPU", 148, 30.1), ("GPU HBM3 Memory", "GPU", 72, 17.2),
    ("Software Bug", "Dependency", 54, 12.9), ("Network Switch/Cable", "Network", 35, 8.4),
    ("Host Maintenance", "Unplanned Maintenance", 32, 7.6), ("GPU SRAM Memory", "GPU", 19, 4.5),
    ("GPU System Processor", "GPU", 17, 4.1), ("NIC", "Host", 7, 1.7), ("NCCL Watchdog Timeouts", "Unknown", 7, 1.7),
    ("Silent Data Corruption", "GPU", 6, 1.4), ("GPU Thermal Interface + Sensor", "GPU", 6, 1.4),
    ("SSD", "Host", 3, 0.7),
    ("Power Supply", "Host", 3, 0.7), ("Server Chassis", "Host", 2, 0.5), ("IO Expansion Board", "Host", 2, 0.5),
    ("Dependency", "Dependency", 2, 0.5), ("CPU", "Host", 2, 0.5), ("System Memory", "Host", 2, 0.5),
)
HARDWARE = ("GPU", "Host", "Network")  # the categories of confirmed or suspected hardware faults


def llama3_interruptions_by(what="category", table=LLAMA3_TABLE5):
    """Table 5's interruptions added up by ``"category"`` or ``"component"``: {name: count},
    largest first."""
    if what not in ("category", "component"):
        raise ConfigError(f"llama3_interruptions_by: what must be 'category' or 'component', got {what!r}")
    out = {}
    for component, category, count, _ in table:
        key = category if what == "category" else component
        out[key] = out.get(key, 0) + count
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def llama3_job_mtbf():
    """Seconds between Llama 3's unexpected interruptions: 54 days / 419."""
    return LLAMA3_INTERRUPTIONS["days"] * DAY / LLAMA3_INTERRUPTIONS["unexpected"]


def _positive(**values):
    for name, v in values.items():
        if not (isinstance(v, (int, float, np.integer, np.floating)) and v > 0 and math.isfinite(v)):
            raise ConfigError(f"{name} must be a positive number of seconds (or GPUs), got {v!r}")


def job_mtbf(gpu_mtbf, gpus):
    """The job's mean time between failures when each of ``gpus`` GPUs fails independently
    every ``gpu_mtbf`` seconds on average."""
    _positive(gpu_mtbf=gpu_mtbf, gpus=gpus)
    return gpu_mtbf / gpus


def young_interval(save_cost, mtbf):
    _positive(save_cost=save_cost, mtbf=mtbf)
    return math.sqrt(2 * save_cost * mtbf)


def daly_interval(save_cost, mtbf):
    _positive(save_cost=save_cost, mtbf=mtbf)
    if save_cost >= 2 * mtbf:
        return mtbf
    x = save_cost / (2 * mtbf)
    return math.sqrt(2 * save_cost * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - save_cost


def _check(interval, save_cost, mtbf, restart, lag):
    """The arguments checked; returns the time a save stops training (with the wait for
    the previous asynchronous write when the interval is shorter than it)."""
    _positive(interval=interval, mtbf=mtbf)
    for name, v in (("save_cost", save_cost), ("restart", restart), ("lag", lag)):
        if not (v >= 0 and math.isfinite(v)):
            raise ConfigError(f"{name} must be a number of seconds >= 0, got {v!r}")
    return save_cost + max(0.0, lag - interval)


def best_interval(save_cost, mtbf, restart=0.0, lag=0.0):
    """The interval of the highest expected goodput, searched (Daly's formula is the
    answer when ``lag`` is 0; an asynchronous write longer than that interval moves it)."""
    start = daly_interval(max(save_cost, 1e-9), mtbf)
    grid = np.geomspace(start / 50, max(start, lag) * 50, 4000)
    return float(grid[np.argmax([expected_goodput(t, save_cost, mtbf, restart, lag) for t in grid])])


def expected_goodput(interval, save_cost, mtbf, restart=0.0, lag=0.0):
    """The expected share of wall time that is new progress (Daly's complete model; see
    the module's docstring), from 0 to ``interval / (interval + save_cost)``."""
    save_cost = _check(interval, save_cost, mtbf, restart, lag)
    growth = math.expm1((interval + save_cost) / mtbf)
    if not math.isfinite(growth):
        return 0.0
    return interval * math.exp(-lag / mtbf) / (mtbf * math.exp(restart / mtbf) * growth)


def goodput_first_order(gpus, gpu_mtbf_hours, interval_minutes, save_seconds, restart_minutes):
    """Goodput to first order, in a napkin's units: per interval one save, per failure
    (every GPU MTBF / GPUs) half an interval of lost work and the restart."""
    mtbf = gpu_mtbf_hours * 3600 / gpus
    tau, restart = interval_minutes * 60, restart_minutes * 60
    return 1 - save_seconds / tau - (tau / 2 + restart) / mtbf


def goodput_daly(gpus, gpu_mtbf_hours, interval_minutes, save_seconds, restart_minutes):
    """:func:`expected_goodput` (Daly's complete model) in the same units."""
    return expected_goodput(interval_minutes * 60, save_seconds, gpu_mtbf_hours * 3600 / gpus, restart_minutes * 60)


def watchdog_gpu_hours(gpus, timeout_minutes):
    """GPU-hours spent waiting when a rank dies and every GPU waits in its collective
    until its watchdog fires after ``timeout_minutes``."""
    return gpus * timeout_minutes / 60


def _restarts(rng, n, restart, mtbf):
    """Wall time of ``n`` restarts of ``restart`` seconds each, a failure restarting one."""
    total = np.zeros(n)
    pending = np.ones(n, bool) if restart > 0 else np.zeros(n, bool)
    while pending.any():
        x = rng.exponential(mtbf, pending.sum())
        done = x >= restart
        idx = np.nonzero(pending)[0]
        total[idx] += np.where(done, restart, x)
        pending[idx[done]] = False
    return total


def simulate_goodput(interval, save_cost, mtbf, restart=0.0, lag=0.0, work=None, runs=200, seed=0):
    """Goodput of ``runs`` simulated runs (an array), each doing ``work`` seconds of
    training (default: 200 mean times between failures) with failures drawn at random."""
    save_cost = _check(interval, save_cost, mtbf, restart, lag)
    work = 200 * mtbf if work is None else work
    rng = np.random.default_rng(seed)
    c = interval + save_cost
    need = math.ceil(work / interval)  # segments
    done = np.zeros(runs, np.int64)
    wall = np.zeros(runs)
    active = np.ones(runs, bool)
    while active.any():
        idx = np.nonzero(active)[0]
        x = rng.exponential(mtbf, len(idx))  # time to the next failure, from the last restart
        n = np.floor(x / c).astype(np.int64)  # segments completed before it
        finish = done[idx] + n >= need
        f_idx = idx[finish]
        wall[f_idx] += (need - done[f_idx]) * c
        done[f_idx] = need
        active[f_idx] = False
        o_idx, n, x = idx[~finish], n[~finish], x[~finish]
        lost_previous = (x - n * c < lag) & (n > 0)  # the last checkpoint was not on storage yet
        done[o_idx] += n - lost_previous
        wall[o_idx] += x + _restarts(rng, len(o_idx), restart, mtbf)
    return need * interval / wall


@dataclass(frozen=True)
class Span:
    """One stretch of a simulated run: ``kind`` is work, save, lost (work a failure
    threw away), restart; ``start``, ``end`` in seconds of wall time."""

    kind: str
    start: float
    end: float


def simulate_run(interval, save_cost, mtbf, restart=0.0, lag=0.0, work=None, seed=0):
    """One run, span by span (:class:`Span`), and the failure times: for a timeline."""
    save_cost = _check(interval, save_cost, mtbf, restart, lag)
    work = 20 * mtbf if work is None else work
    rng = np.random.default_rng(seed)
    spans, failures = [], []
    t, done, need = 0.0, 0, math.ceil(work / interval)
    next_failure = rng.exponential(mtbf)
    while done < need:
        seg_end = t + interval + save_cost
        if next_failure >= seg_end:
            spans += [Span("work", t, t + interval), Span("save", t + interval, seg_end)]
            t, done = seg_end, done + 1
            continue
        failures.append(next_failure)
        lost_from = t
        if done and spans and next_failure - t < lag:  # the last checkpoint is not durable: its interval is lost too
            done -= 1
            lost_from = max(s.start for s in spans if s.kind == "work")
            spans = [s for s in spans if s.start < lost_from]
        spans.append(Span("lost", lost_from, next_failure))
        t = next_failure
        while True:  # a restart, which a failure may interrupt
            nxt = t + rng.exponential(mtbf)
            if nxt >= t + restart:
                spans.append(Span("restart", t, t + restart))
                t = t + restart
                next_failure = nxt
                break
            failures.append(nxt)
            spans.append(Span("restart", t, nxt))
            t = nxt
    return spans, failures
