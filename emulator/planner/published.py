"""Published training runs, as their sources give them, and the planner's prediction for each.

Three sources, each with its own way of counting FLOPs (the published teraFLOP/s per GPU
are FLOPs per step over seconds per step over GPUs, and each counts the step's FLOPs
differently, so the prediction is counted the same way as the row it stands beside):

* **Narayanan et al. 2021** ("Efficient Large-Scale Language Model Training on GPU
  Clusters Using Megatron-LM", SC21, arXiv:2104.04473), Table 1, also printed as an image in
  the Megatron-LM README until July 2024 (``images/cases_april2021.png``): GPT models of
  1.7B to 1T parameters on Selene (DGX A100 80 GB, 8 HDR NICs per node), sequence 2048,
  vocabulary 51,200, tensor parallelism without sequence parallelism (which came a year
  later, with Korthikanti et al. 2022). Their FLOPs per step, 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) (the
  paper's section 5.1), count the recomputed forward pass: full activation recomputation.
* **Megatron-LM README** (``images/model_table.png``, commit f2e5db4 of July 2024, Megatron-
  Core r0.8.0): GPT models of 1.7B to 462B on H100 with data parallelism 48, sequence 4096,
  vocabulary 131,072; teraFLOP/s counted by ``num_floating_point_operations`` of
  ``megatron/training/training.py`` at that commit: 12 B s l h^2 ((2 + s/h) + 4 + V/(2 l h))
  for these models (no recomputation counted: MFU). The README says these runs overlapped
  data-parallel (``--overlap-grad-reduce --overlap-param-gather``), tensor-parallel
  (``--tp-comm-overlap``) and pipeline communication with compute; the megatron-core stack
  (:mod:`emulator.machine.stack_sources`) schedules those overlaps as Megatron-Core does.
* **Llama 3 405B** (Dubey et al. 2024, arXiv:2407.21783), section 3.3.2 and Table 4: 8,192
  and 16,384 H100s, TP 8, PP 16, CP 1 or 16, 16M tokens per step; BF16 MFU 43%, 41%, 38%.
  Counted here as the planner's MFU counts (6N plus attention over the whole sequence).

Each row is evaluated with its published axes and one sequence per micro-batch; what its
source does not state (the schedule: 1F1B or interleaved with 2 chunks, where the code the
source ran could build it, :mod:`~emulator.planner.interleaving`; the ZeRO stage;
recomputation, unless stated) is searched, and the fastest plan that fits is the
prediction (:func:`predict`). The device model is the emulator's, calibrated from
kernel figures only (:mod:`emulator.machine.device_calibration`); nothing here is fitted
to these rows.
"""

from dataclasses import dataclass

from ..parallel.dims import ParallelDims
from .cluster import cluster_preset
from .evaluate import evaluate
from .interleaving import ANY, MEGATRON_CORE_R08, MEGATRON_V25, Interleaving
from .interleaving import LLAMA3 as LLAMA3_PIPELINE
from .models import model_preset

NARAYANAN = "Narayanan et al. 2021, Table 1 (arXiv:2104.04473)"
MEGATRON = "NVIDIA/Megatron-LM README, images/model_table.png (commit f2e5db4, 2024-07)"
LLAMA3 = "Llama 3 paper (arXiv:2407.21783), Table 4"


@dataclass(frozen=True)
class PublishedRun:
    source: str
    model: str  # a model_preset name
    gpus: int
    tp: int
    pp: int
    cp: int
    batch: int  # sequences per step
    seq_len: int
    tflops_per_gpu: float  # as published
    flops: str  # how the source counts a step's FLOPs: "narayanan", "megatron", "mfu"
    cluster: str
    dims: ParallelDims  # the published axes, one sequence per micro-batch (the rest is searched)
    stated: str  # settings the source states, fixed here
    stack: str = "megatron-core"  # the software stack it ran (emulator.machine.stack), from what its source says
    stack_source: str = ""  # why that stack
    interleaving: Interleaving = ANY  # the interleaved pipelines its code could build

    @property
    def dp(self):
        return self.gpus // (self.tp * self.pp * self.cp)


def step_flops(run, model):
    """The FLOPs of one step as ``run``'s source counts them."""
    B, s, l, h, V = run.batch, run.seq_len, model.n_layers, model.d_model, model.vocab
    if run.flops == "narayanan":
        return 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    if run.flops == "megatron":
        return 12 * B * s * l * h * h * ((2 + s / h) + model.d_ff / h * model.widen + V / (2 * l * h))
    return model.model_flops_per_token(s) * B * s


def _dims(gpus, tp, pp, cp, batch):
    dp = gpus // (tp * pp * cp)
    return ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, micro_batches=batch // dp, sequence_parallel=tp > 1)


STACK_NARAYANAN = ("Narayanan et al. 2021 ran Megatron-LM itself (section 5: 'our implementation ... "
                   "https://github.com/nvidia/megatron-lm'), the 2021 code: megatron-2021")
STACK_MEGATRON = ("the Megatron-LM README (f2e5db4, line 66) describes Megatron-Core runs with "
                  "--overlap-grad-reduce --overlap-param-gather --tp-comm-overlap: megatron-core")
STACK_LLAMA3 = ("Meta's training code is not public; section 3.3.2 describes Megatron-style tensor and "
                "pipeline parallelism with communication overlapped and fp32 gradient reduction: priced as "
                "megatron-core, the nearest preset")


def _narayanan(name, tp, pp, gpus, batch, tflops):
    return PublishedRun(NARAYANAN, f"megatron-{name}", gpus, tp, pp, 1, batch, 2048, tflops, "narayanan", "a100",
                        _dims(gpus, tp, pp, 1, batch).replace(recompute="full", sequence_parallel=False),
                        "full recomputation (section 5.1; their FLOP count includes it); no sequence parallelism "
                        "(it came with Korthikanti et al. 2022: Megatron-LM v2.5, e269e200, has no "
                        "--sequence-parallel, so norms and dropout run whole on every tensor-parallel rank)",
                        "megatron-2021", STACK_NARAYANAN, MEGATRON_V25)


def _megatron(name, tp, pp, gpus, batch, tflops):
    return PublishedRun(MEGATRON, f"megatron-h100-{name}", gpus, tp, pp, 1, batch, 4096, tflops, "megatron", "h100",
                        _dims(gpus, tp, pp, 1, batch).replace(zero_stage=1),
                        "the distributed optimizer (ZeRO-1): --overlap-param-gather, which the README names, "
                        "requires it (megatron/training/arguments.py, d98e8a6, lines 1024-1027)", "megatron-core",
                        STACK_MEGATRON, MEGATRON_CORE_R08)


def _llama(gpus, cp, dp, seq, tflops):
    batch = 16 * 2**20 // seq
    return PublishedRun(LLAMA3, "llama3-405b", gpus, 8, 16, cp, batch, seq, tflops, "mfu", "h100",
                        _dims(gpus, 8, 16, cp, batch), "", "megatron-core", STACK_LLAMA3, LLAMA3_PIPELINE)


RUNS = [
    _narayanan("1.7b", 1, 1, 32, 512, 137), _narayanan("3.6b", 2, 1, 64, 512, 138),
    _narayanan("7.5b", 4, 1, 128, 512, 142), _narayanan("18b", 8, 1, 256, 1024, 135),
    _narayanan("39b", 8, 2, 512, 1536, 138), _narayanan("76b", 8, 4, 1024, 1792, 140),
    _narayanan("145b", 8, 8, 1536, 2304, 148), _narayanan("310b", 8, 16, 1920, 2160, 155),
    _narayanan("530b", 8, 35, 2520, 2520, 163), _narayanan("1t", 8, 64, 3072, 3072, 163),
    _megatron("1.7b", 1, 1, 48, 192, 408.8), _megatron("7.1b", 2, 1, 96, 192, 465.9),
    _megatron("16b", 4, 1, 192, 192, 489.1), _megatron("32b", 8, 1, 384, 192, 459.6),
    _megatron("70b", 8, 2, 768, 384, 419.7), _megatron("119b", 8, 4, 1536, 768, 420.5),
    _megatron("177b", 8, 6, 2304, 1152, 432.8), _megatron("314b", 8, 8, 3072, 1536, 474.4),
    _megatron("462b", 8, 16, 6144, 3072, 459.9),
    _llama(8192, 1, 64, 8192, 430), _llama(16384, 1, 128, 8192, 400), _llama(16384, 16, 8, 131072, 380),
]


TARGET = 0.15  # the published rows' target: within 15% of each row's teraFLOP/s per GPU


def why_off(est, published_tflops, predicted_tflops, target=TARGET):
    """("fast" or "slow", the predicted step's shares by category and its ``gap``: the
    published step over the predicted one, less one) for a row off by more than
    ``target``; ("", {}) for one within it."""
    err = predicted_tflops / published_tflops - 1
    if abs(err) <= target:
        return "", {}
    shares = {k: v / est.step_time for k, v in est.breakdown.items() if v > 0}
    shares["gap"] = err  # published step over predicted, less one (= predicted rate over published, less one)
    return ("fast" if err > 0 else "slow"), shares


def settings(base, n_layers, interleaving=ANY):
    """The plans tried for a published mesh ``base`` (its axes fixed), grouped by
    schedule: each setting the source does not state (the schedule: 1F1B, or interleaved
    with 2 chunks where the micro-batches divide and the source's code could build it,
    :mod:`~emulator.planner.interleaving`; the ZeRO stage unless ``base`` has one;
    recomputation unless ``base`` has one), in the order a person tries them: least
    recomputation first (it adds compute), then the lowest ZeRO stage (ZeRO-1/2 leave
    collectives after the pipeline, ZeRO-3 gathers every layer), the first that fits kept."""
    scheds = [dict(schedule="1f1b", v=1)]
    if (base.pp > 1 and base.micro_batches % base.pp == 0 and 2 * base.pp <= n_layers
            and not interleaving.problem(n_layers, base.pp, 2)):
        scheds.append(dict(schedule="interleaved_1f1b", v=2))
    recomputes = [base.recompute] if base.recompute != "none" else ["none", "selective", "full"]
    stages = [base.zero_stage] if base.zero_stage else [0, 1, 2, 3]
    return [[base.replace(zero_stage=z, recompute=r, **sc) for r in recomputes for z in stages] for sc in scheds]


def fastest_fitting(model, cluster, base, seq_len, tokens, stack=None, interleaving=ANY):
    """The Estimate of the fastest of :func:`settings` that fits in HBM (per schedule the
    first that fits, then the faster of those); if none fits, the one needing the least
    memory (its estimate says by how much it does not fit)."""
    picks, smallest = [], None
    for group in settings(base, model.n_layers, interleaving):
        for dims in group:
            est = evaluate(model, cluster, dims, seq_len, tokens, stack=stack)
            if est.step_time is None:
                continue
            if est.fits:
                picks.append(est)
                break
            if smallest is None or est.memory_peak < smallest.memory_peak:
                smallest = est
    return max(picks, key=lambda e: e.tokens_per_s_per_gpu) if picks else smallest


def predict(run):
    """(the planner's Estimate of the plan it picks for ``run``: its published axes, the
    rest by :func:`fastest_fitting`; its teraFLOP/s per GPU counted as the source counts
    them)."""
    model = model_preset(run.model)
    cluster = cluster_preset(run.cluster, nodes=run.gpus // 8)
    est = fastest_fitting(model, cluster, run.dims, run.seq_len, run.batch * run.seq_len, run.stack,
                          run.interleaving)
    return est, step_flops(run, model) / est.step_time / run.gpus / 1e12
