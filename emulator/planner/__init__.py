"""The mesh planner: evaluate a parallel plan, search every plan, run one on the emulator.

::

    from emulator.parallel import ParallelDims
    from emulator.planner import evaluate, search, model_preset, cluster_preset, ModelSpec
    m = model_preset("llama3-405b")
    c = cluster_preset("h100", nodes=2048)
    e = evaluate(m, c, ParallelDims(dp=128, tp=8, pp=16, ...), seq_len=8192, global_batch_tokens=16 * 2**20)
    e.memory_bytes, e.step_time, e.tokens_per_s_per_gpu, e.mfu, e.hfu, e.bubble, e.comm, e.valid, e.problems
    ranked = search(m, c, seq_len=8192, global_batch_tokens=16 * 2**20, top=10)

Modules: ``models`` (:class:`ModelSpec`, published presets), ``hf_config`` (a Hugging
Face ``config.json`` as a :class:`ModelSpec`: :func:`model_from_hf_config`), ``cluster``
(:class:`Cluster`, presets), ``layers`` (what one rank's layers hold and do), ``memory`` (each rank's peak,
by kind), ``timer`` (a stage's declared work timed on its ranks), ``collective_times`` (a collective's
closed-form seconds), ``timing`` (layer passes, the pipeline, the data-parallel tail), ``comm`` (the
table per axis), ``evaluate``, ``ranking`` (:func:`search`), ``exhaustive`` (:func:`exhaustive_search`: every
setting, proven bounds; exact and slow), ``run`` (a plan on the emulator, predicted
beside measured), ``published`` (published runs, with sources). ``pfs-planner --help``
(or ``python -m emulator.planner --help``) is the command line.
"""

from .cluster import Cluster, cluster_preset
from .evaluate import Estimate, evaluate
from .models import ModelSpec, model_preset
from .hf_config import model_from_hf_config
from .layers import inventory
from .ranking import Rejected, enumerate_plans, search
from .exhaustive import exhaustive_search
from .run import PlanRun, run_plan
from .tradeoff import mesh_tradeoff

__all__ = ["evaluate", "search", "exhaustive_search", "model_preset", "cluster_preset", "ModelSpec", "Cluster",
           "Estimate", "Rejected", "enumerate_plans", "run_plan", "PlanRun", "inventory", "mesh_tradeoff", "model_from_hf_config"]
