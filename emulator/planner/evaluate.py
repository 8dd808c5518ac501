"""``evaluate(model, cluster, dims, seq_len, global_batch_tokens)``: one plan's memory,
communication, bubble, step time and utilisation, and every problem, in words.

The figures are what the emulator would measure running the plan (:mod:`.memory`,
:mod:`.timing`); :func:`emulator.planner.run_plan` runs it to show both side by side.
"""

from dataclasses import asdict, dataclass, field
from functools import lru_cache

from ..accounting.pipeline import pipeline_bubble
from ..errors import ConfigError
from ..machine import elementwise
from ..machine.stack import stack_preset
from ..machine.work import dtype_bytes
from ..parallel.dims import ParallelDims
from ..parallel.pipeline import schedule
from ..parallel.pipeline import simulator
from ..parallel.pipeline.actions import stage_of
from ..parallel.tensor_parallel.op_checkpoint import problems as op_checkpoint_problems
from .breakdown import breakdown, lines as breakdown_lines
from .cluster import Cluster
from .comm import comm_table, expose_as_breakdown
from .layers import ops_flops, rank_layers, split_names
from .memory import KINDS, shard_groups, stage_peaks, unsharded_in_pipeline, updated_elements
from .models import ModelSpec
from .precision_of import plan_context
from .timer import Timer
from .timing import action_durations, layer_times


@dataclass
class Estimate:
    """What the planner predicts for one plan. Times in seconds, memory in bytes."""

    model: ModelSpec
    cluster: Cluster
    dims: ParallelDims
    seq_len: int
    global_batch_tokens: int
    problems: list
    context: object = field(default=None, repr=False)  # the stack and precision policy it assumes
    micro_batch: int = None  # sequences per micro-batch
    memory_bytes: dict = None  # worst rank, by kind, at its peak
    memory_peak: float = None
    worst_stage: int = None
    stage_memory: list = None  # per pipeline rank: (peak, by kind)
    step_time: float = None
    pipeline_time: float = None
    optimizer_time: list = field(default=None, repr=False)  # per pipeline rank: its update's seconds
    breakdown: dict = None  # where the critical rank's step goes, in seconds (emulator.planner.breakdown)
    tokens_per_s_per_gpu: float = None
    mfu: float = None
    hfu: float = None
    bubble: float = None
    bubble_formula: float = None
    comm: object = None
    stage_ends: list = field(default=None, repr=False)  # per pipeline rank: when its last action ends
    timeline: dict = field(default=None, repr=False)  # the simulated schedule (of at most 5 p micro-batches)

    @property
    def valid(self):
        return not [p for p in self.problems if not p.startswith("slow:")]

    @property
    def fits(self):
        return self.memory_peak is not None and self.memory_peak <= self.cluster.hbm_bytes

    def summary(self):
        """A few lines a person reads."""
        if self.step_time is None:
            return f"{self.dims}: not evaluated:\n" + "\n".join(f"  - {p}" for p in self.problems)
        m = self.memory_bytes
        lines = [f"{self.dims} on {self.dims.world_size:,} GPUs, {self.micro_batch} sequence(s) per micro-batch",
                 f"  memory, worst rank (stage {self.worst_stage}): {self.memory_peak / 1e9:.2f} GB of "
                 f"{self.cluster.hbm_bytes / 1e9:.0f} (" + ", ".join(f"{k} {m[k] / 1e9:.2f}" for k in KINDS) + ")",
                 f"  step {self.step_time:.4g} s, bubble {self.bubble:.1%} (formula {self.bubble_formula:.1%}), "
                 f"{self.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {self.mfu:.1%}, HFU {self.hfu:.1%}"]
        if self.context is not None:
            lines.append(f"  as {self.context.stack.name} runs it, {self.context.precision.name}")
        if self.breakdown:
            lines.append("  where the step goes (the rank that finishes last):")
            lines += breakdown_lines(self.breakdown, self.step_time)
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)

    def __repr__(self):
        return f"Estimate({self.summary()})"

    def as_dict(self):
        """Plain numbers and strings (for ``--json``)."""
        out = {"dims": asdict(self.dims), "world_size": self.dims.world_size, "valid": self.valid,
               "problems": list(self.problems), "micro_batch": self.micro_batch}
        if self.step_time is not None:
            out.update(memory_bytes={k: float(v) for k, v in self.memory_bytes.items()},
                       memory_peak=float(self.memory_peak), worst_stage=self.worst_stage,
                       step_time=self.step_time, tokens_per_s_per_gpu=self.tokens_per_s_per_gpu, mfu=self.mfu,
                       hfu=self.hfu, bubble=self.bubble, bubble_formula=self.bubble_formula,
                       comm=[dict(row) for row in self.comm], breakdown=dict(self.breakdown or {}),
                       stack=self.context.stack.name, attention_kernel=self.context.stack.flash_kernel,
                       precision=self.context.precision.name)
        return out


def _check_inputs(model, cluster, dims, seq_len, global_batch_tokens):
    if not isinstance(model, ModelSpec):
        raise ConfigError(f"evaluate: model must be a ModelSpec (or model_preset(name)), got {type(model).__name__}")
    if not isinstance(cluster, Cluster):
        raise ConfigError(f"evaluate: cluster must be a Cluster (cluster_preset('h100', nodes=...)), got "
                          f"{type(cluster).__name__}")
    if not isinstance(dims, ParallelDims):
        raise ConfigError(f"evaluate: dims must be a ParallelDims, got {type(dims).__name__}")
    for name, v in (("seq_len", seq_len), ("global_batch_tokens", global_batch_tokens)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"evaluate: {name} must be a positive int, got {v!r}")


def structural_problems(model, cluster, dims, seq_len, global_batch_tokens, stack=None):
    """What makes the plan impossible before any arithmetic, every problem at once: a GPU
    count that is not the cluster's, a batch that is not whole sequences or is too small for
    the replicas, every size that does not divide (:meth:`ParallelDims.problems`: the
    heads, the K/V heads, d_ff, the vocabulary, the layers, the sequence, the batch), and a
    per-op checkpoint the ``stack`` (None: ``"megatron-core"``) cannot run."""
    out = []
    if dims.recompute == "op":
        out += op_checkpoint_problems(stack_preset(stack), dims.cp, model.n_experts)
    if dims.world_size != cluster.gpus:
        out.append(f"dp x tp x pp x cp = {dims.world_size:,} GPUs, but the cluster has {cluster.gpus:,}")
    batch = None
    if global_batch_tokens % seq_len:
        out.append(f"the global batch ({global_batch_tokens:,} tokens) is not a whole number of {seq_len}-token "
                   f"sequences")
    else:
        batch = global_batch_tokens // seq_len
        per = dims.dp * dims.micro_batches
        if batch < per:
            out.append(f"dp x micro_batches = {per:,} micro-batches need at least {per:,} sequences; the global "
                       f"batch has {batch:,}: lower dp or the micro-batches")
            batch = None
    out += dims.problems(model.with_seq(seq_len), seq_len, batch)
    return out


def placement_problems(cluster, dims):
    """Where the plan's axes sit on the nodes, known without evaluating it: tensor
    parallelism across a node (the plan is invalid, though it can be priced) and an expert
    all-to-all across nodes (slow, but valid)."""
    out = []
    g = cluster.gpus_per_node
    if dims.tp > g:
        out.append(f"tp={dims.tp} crosses a node ({g} GPUs per node): its collectives run on the NICs; keep tp within "
                   f"a node")
    if dims.ep > 1 and dims.tp * dims.ep > g:
        out.append(f"slow: the ep={dims.ep} all-to-all crosses nodes (tp x ep = {dims.tp * dims.ep} > {g} GPUs per "
                   f"node)")
    return out


def evaluate(model, cluster, dims, seq_len, global_batch_tokens, param_bytes=None, mixed=None, stack=None,
             precision=None):
    """The :class:`Estimate` of training ``model`` on ``cluster`` with ``dims``, sequences
    of ``seq_len`` tokens and ``global_batch_tokens`` per step, as the software ``stack``
    runs it (a name or a :class:`~emulator.machine.stack.Stack`; None: ``"megatron-core"``)
    in its precision policy, or ``precision`` (a policy or its name). The old shorthands
    still work: ``param_bytes=2, mixed=True``: bf16 weights and gradients with mixed-
    precision Adam (16 bytes per parameter, the ZeRO paper's); ``param_bytes=4,
    mixed=False``: fp32 throughout."""
    _check_inputs(model, cluster, dims, seq_len, global_batch_tokens)
    ctx = plan_context(stack, precision, param_bytes, mixed)
    problems = structural_problems(model, cluster, dims, seq_len, global_batch_tokens, ctx.stack)
    est = Estimate(model, cluster, dims, seq_len, global_batch_tokens, problems, context=ctx)
    if problems:  # not evaluated: every structural problem, and where its axes would sit
        est.problems = problems + placement_problems(cluster, dims)
        return est
    model = model.with_seq(seq_len)
    batch = global_batch_tokens // seq_len
    b = batch // (dims.dp * dims.micro_batches)
    est.micro_batch = b
    p, v, m = dims.pp, dims.v, dims.micro_batches
    names = split_names(model.n_layers, p * v)
    timer = Timer(cluster, dims, ctx.stack)
    layers = [[rank_layers(model, dims, b, seq_len, ctx, names[_stage(p, r, c)]) for r in range(p)]
              for c in range(v)]
    est.stage_memory = stage_peaks(layers, dims, ctx)
    worst = max(range(p), key=lambda r: est.stage_memory[r][0])
    est.worst_stage, (est.memory_peak, est.memory_bytes) = worst, est.stage_memory[worst]

    memo = {}

    def times(x, r):  # the blocks of a stage share their ops, and alike stages their times
        key = (id(x.ops), x.partial, tuple(x.params.items()), timer.stage_key(r))
        if key not in memo:
            memo[key] = layer_times(timer, x, r, dims, ctx)
        return memo[key]

    per_layer = [[[times(x, r) for x in layers[c][r]] for c in range(v)] for r in range(p)]
    boundary = b * (seq_len // dims.cp // (dims.tp if dims.sequence_parallel else 1)) * model.d_model * \
        dtype_bytes(ctx.dtype("pp"))

    played = {}

    def play(m_sim):
        """The pipeline of ``m_sim`` micro-batches: (timing, each rank's end, busy seconds, tails, table)."""
        actions = _schedule(dims.schedule, p, m_sim, v)
        durations = [action_durations(actions[r], per_layer[r], dims, prefetch=ctx.stack.fsdp_prefetch,
                                      whole_step=unsharded_in_pipeline(dims, ctx)) for r in range(p)]
        host = [action_durations(actions[r], per_layer[r], dims, host=True) for r in range(p)]
        timing = simulator.play(actions, durations, lambda src, dst: timer.p2p(boundary, src, dst), host,
                                _waits(dims.schedule, p, m_sim, v))
        ends = [simulator.rank_end(timing[r]) for r in range(p)]
        busy = sum(e - s0 for r in range(p) for _, s0, e in timing[r])
        tails, table = comm_table(est, layers, per_layer, timer, timing, boundary, ctx, m_sim)
        played[m_sim] = timing
        return timing, ends, busy, tails, table

    cap = steady_cap(p, v)
    # where a host issues slower than its GPU computes, its lead builds up over the whole step
    # and no two short plays lie on one line: play the schedule whole
    host_bound = any(t["host " + k] > t[k] for ts in per_layer for c in ts for t in c for k in ("F", "B"))
    if m <= cap + p or host_bound:
        est.timeline, ends, busy, tails, est.comm = play(m)
    else:  # every micro-batch past the ramp adds the same time to each rank: play two and extend the line
        est.timeline, ends1, busy1, tails, est.comm = play(cap)
        _, ends2, busy2, _, _ = play(cap + p)
        ends = [e1 + (e2 - e1) * (m - cap) / p for e1, e2 in zip(ends1, ends2)]
        busy = busy1 + (busy2 - busy1) * (m - cap) / p
    est.stage_ends = ends
    est.pipeline_time = max(ends)
    est.bubble = 1 - busy / (p * est.pipeline_time) if p > 1 else 0.0
    est.bubble_formula = pipeline_bubble(p, m, v) if dims.schedule != "zb_h1" else \
        pipeline_bubble(p, m, schedule="zb_h1")
    est.optimizer_time = [_optimizer_seconds(timer, layers, r, dims, ctx) for r in range(p)]
    est.step_time = max(ends[r] + tails[r] + est.optimizer_time[r] for r in range(p))
    critical = max(range(p), key=lambda r: ends[r] + tails[r] + est.optimizer_time[r])
    m_played = max(played)
    est.breakdown = breakdown(est, timer, layers, played[m_played], m_played, tails, critical, ctx,
                              per_layer[critical])
    if est.comm.rank == critical:
        expose_as_breakdown(est.comm, est.breakdown, dims.zero_stage == 3 and ctx.stack.fsdp_prefetch)
    tokens = batch * seq_len
    G = dims.world_size
    est.tokens_per_s_per_gpu = tokens / est.step_time / G
    peak = cluster.peak_flops
    est.mfu = model.model_flops_per_token(seq_len) * tokens / (est.step_time * G * peak)
    est.hfu = _executed_flops(layers, dims) / (est.step_time * G * peak)
    est.problems = problems + _soft_problems(est, cluster, dims)
    return est


def steady_cap(p, v=1):
    """Micro-batches played in full before the step is extended along a line: a multiple
    of p (as the interleaved schedule needs) past the warm-up of every rank."""
    return (v + 1) * p


@lru_cache(maxsize=256)
def _schedule(name, p, m, v):
    return schedule(name, p, m, v)


@lru_cache(maxsize=256)
def _waits(name, p, m, v):
    """What each action of the schedule waits for (:func:`emulator.parallel.pipeline.simulator.waits_of`)."""
    return simulator.waits_of(_schedule(name, p, m, v))


def _stage(p, r, c):
    return stage_of(p, r, c)


def _optimizer_seconds(timer, layers, r, dims, ctx):
    """Seconds of rank r's optimizer update (one kernel over what it updates, as the
    data-parallel strategies charge it:
    :meth:`emulator.parallel.data_parallel.strategy.DataParallelStrategy.charge_update`)."""
    n = sum(updated_elements(x, shard_groups(dims), dims.zero_stage) for c in range(dims.v) for x in layers[c][r])
    kernels = elementwise.optimizer_update(ctx.stack, n, ctx.precision, ctx.array)
    return timer.ops(kernels, r)


def _executed_flops(layers, dims):
    """FLOPs every rank's kernels compute in one step (recomputation included)."""
    per_stage_ranks = dims.dp * dims.cp * dims.tp
    total = 0.0
    for c in range(dims.v):
        for r in range(dims.pp):
            for x in layers[c][r]:
                f = ops_flops(x.ops["F"]) + ops_flops(x.ops["B"]) + ops_flops(x.ops["W"])
                if dims.recompute == "full":
                    f += ops_flops(x.ops.get("F0", x.ops["F"]))
                total += f
    return total * dims.micro_batches * per_stage_ranks


def _soft_problems(est, cluster, dims):
    placed = placement_problems(cluster, dims)
    out = [p for p in placed if not p.startswith("slow:")]
    if est.memory_peak > cluster.hbm_bytes:
        out.append(f"does not fit: pipeline stage {est.worst_stage} needs {est.memory_peak / 1e9:.1f} GB, HBM has "
                   f"{cluster.hbm_bytes / 1e9:.0f} GB ({(est.memory_peak - cluster.hbm_bytes) / 1e9:.1f} GB over)")
    return out + [p for p in placed if p.startswith("slow:")]
