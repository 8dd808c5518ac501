"""The planner from a shell: ``pfs-planner`` (installed with the package), or ``python -m emulator.planner``.

    pfs-planner --gpus 16384 --gpus-per-node 8 --model llama3-405b --seq 8192 --batch-tokens 16M
    pfs-planner ... --dims dp=128,tp=8,pp=16,zero_stage=1,sequence_parallel=true,micro_batches=16
    pfs-planner ... --dims ... --run        # run that plan on the emulator, predicted beside measured
    pfs-planner ... --json                  # the same as JSON, for scripts (with the version)
    pfs-planner --model path/to/config.json ...   # a Hugging Face config.json

Without ``--dims`` it prints the ranked plans and every rejected one with its reason. A
model is a preset name (``--list-models``), a path to a Hugging Face ``config.json`` (a
value ending in ``.json``; see ``emulator/planner/hf_config.py`` for the keys read and what
is approximated), or a shape:
``--model n_layers=8,d_model=256,n_heads=8,d_ff=1024,vocab=2048[,n_kv_heads=..,mlp=swiglu,n_experts=..,top_k=..]``.
Sizes take K, M, G (powers of 2: 16M = 16 x 2**20). A value it cannot use is refused in
one line, with exit status 2; a plan that cannot run, or whose step would take more than
a day, exits 1.
"""

import argparse
import json
import os
import sys
from collections import Counter

from .._version import __version__
from ..errors import ConfigError
from ..machine.stack import stack_preset
from . import cluster_preset, evaluate, exhaustive_search, run_plan, search
from .cli_args import Parser, count_or_all, dims_of, model_of, positive_int, positive_size, program
from .cli_args import SUFFIX, built, pairs, size  # noqa: F401 -- importable from here too
from .models import PRESETS
from ..machine.work import table
from ..parallel.layer_shape import of_plan
from ..parallel.tensor_parallel.block_work import declared_block
from .precision_of import plan_context
from .timer import Timer

DAY = 86400.0  # seconds: a step longer than this is no training run
# The search enumerates every factorisation of the cluster and screens each: on 2 cores it
# ranks 131,072 GPUs in seconds (DeepSeek-V3, with every ep: about 11 s), 2**20 in up to a
# minute, and 2**30 (--gpus 1G) in many minutes (its divisors alone are found by trial).
# Past this it refuses; one plan (--dims) is evaluated at any size.
MAX_SEARCH_GPUS = 2**17


def parser(prog=None):
    p = Parser(prog=prog or program(), description=__doc__.splitlines()[0],
               formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    p.add_argument("--gpus", type=positive_size, help="GPUs in all (a multiple of --gpus-per-node)")
    p.add_argument("--gpus-per-node", type=positive_int, default=8)
    p.add_argument("--cluster", default="h100", help="h100, h200 or a100 nodes (default h100)")
    p.add_argument("--model", help="a preset name, a path to a Hugging Face config.json, or "
                                   "n_layers=..,d_model=..,n_heads=..,d_ff=..,vocab=..")
    p.add_argument("--seq", type=positive_size, help="sequence length in tokens")
    p.add_argument("--batch-tokens", type=positive_size,
                   help="global batch in tokens per step, a whole number of sequences (16M = 16 x 2**20)")
    p.add_argument("--dims", help="evaluate one plan: dp=..,tp=..,pp=..[,cp=..,ep=..,zero_stage=..,...]")
    p.add_argument("--run", action="store_true", help="with --dims: run the plan on the emulator (shape-only)")
    p.add_argument("--work", action="store_true",
                   help="with --dims: list one transformer block's kernels and collectives with their times")
    p.add_argument("--stack", default=None,
                   help="the software stack: megatron-core (default), megatron-2021, pytorch-eager, pytorch-compile")
    p.add_argument("--top", type=positive_int, default=10, help="plans to rank (default 10)")
    p.add_argument("--exhaustive", action="store_true",
                   help="search every setting (micro-batch sizes, schedules, v, ZeRO stages, recomputation), pruned "
                        "only by proven bounds: the best plan for certain, in seconds for a few nodes and minutes for "
                        "thousands of GPUs")
    p.add_argument("--rejected", type=count_or_all, default=20, help="rejected plans to list (default 20; -1: all)")
    p.add_argument("--json", action="store_true", help="print JSON (it carries the version)")
    p.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    return p


def main(argv=None):
    try:
        return _main(argv)
    except BrokenPipeError:  # `pfs-planner ... | head`: the reader has gone; not an error of ours
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _main(argv):
    p = parser()
    args = p.parse_args(argv)
    if args.list_models:
        for name, m in sorted(PRESETS.items()):
            print(f"{name:24s} {m.params() / 1e9:8.1f}B  {m.source}")
        return 0
    missing = [f"--{k.replace('_', '-')}" for k in ("gpus", "model", "seq", "batch_tokens") if getattr(args, k) is None]
    if missing:
        print(f"{p.prog}: missing {', '.join(missing)} (see --help)", file=sys.stderr)
        return 2
    try:
        _check(args)
        cluster = cluster_preset(args.cluster, nodes=args.gpus // args.gpus_per_node, gpus_per_node=args.gpus_per_node)
        model = model_of(args.model)
        args.stack = stack_preset(args.stack)  # an unknown name: one line naming the known ones
        if args.work and not args.dims:
            raise ConfigError("--work needs --dims (the plan whose block to list)")
        if args.dims and args.work:
            return _work(model, cluster, dims_of(args.dims), args)
        if args.dims:
            return _one(model, cluster, dims_of(args.dims), args)
        if args.run:
            raise ConfigError("--run needs --dims (the plan to run)")
        return _search(model, cluster, args)
    except ConfigError as exc:
        print(f"{p.prog}: {exc}", file=sys.stderr)
        return 2


def _check(args):
    """What the values say together, before any model or cluster is built."""
    if args.gpus % args.gpus_per_node:
        raise ConfigError(f"--gpus ({args.gpus:,}) must be a multiple of --gpus-per-node ({args.gpus_per_node})")
    if args.batch_tokens % args.seq:
        raise ConfigError(f"--batch-tokens ({args.batch_tokens:,}) must be a whole number of --seq ({args.seq:,}) "
                          f"token sequences, at least one")
    if not args.dims and args.gpus > MAX_SEARCH_GPUS:
        raise ConfigError(f"--gpus {args.gpus:,}: the search ranks clusters of up to {MAX_SEARCH_GPUS:,} GPUs (it "
                          f"tries every factorisation: a million GPUs takes up to a minute, more take longer); give "
                          f"one plan with --dims to evaluate it at this size")


def too_long(est):
    """A problem when the plan's step would take more than a day (else None)."""
    if est.step_time is None or est.step_time <= DAY:
        return None
    return (f"one step would take {est.step_time / DAY:,.1f} days ({est.step_time:.3g} s): "
            f"{est.global_batch_tokens:,} tokens per step is far more than {est.dims.world_size:,} GPUs train in a "
            f"day; lower --batch-tokens or add GPUs")


def _one(model, cluster, dims, args):
    if args.run:
        fold = ("dp", "tp") if dims.world_size > 64 else ()
        pr = run_plan(model, cluster, dims, args.seq, args.batch_tokens, fold=fold, stack=args.stack)
        if args.json:
            print(json.dumps({"version": __version__, "estimate": pr.estimate.as_dict(),
                              "comparison": list(pr.table()), "wall_seconds": pr.wall_seconds}, indent=1))
        else:
            print(pr.estimate.summary())
            print(f"\nran on the emulator in {pr.wall_seconds:.1f} s{' (dp and tp folded)' if fold else ''}:")
            print(pr.table())
        return 0
    est = evaluate(model, cluster, dims, args.seq, args.batch_tokens, stack=args.stack)
    problem = too_long(est)
    if problem:
        est.problems.append(problem)
    if args.json:
        print(json.dumps({"version": __version__, **est.as_dict()}, indent=1))
    else:
        print(est.summary())
        if est.comm is not None:
            print(est.comm)
    return 0 if est.valid else 1


def _work(model, cluster, dims, args):
    """One block's declared work on a rank of ``dims``, each item with its time on the cluster."""
    est = evaluate(model, cluster, dims, args.seq, args.batch_tokens, stack=args.stack)
    if est.step_time is None:
        raise ConfigError("the plan cannot run: " + "; ".join(est.problems))
    ctx = plan_context(args.stack)
    timer = Timer(cluster, dims, ctx.stack)
    work = declared_block(of_plan(model.with_seq(args.seq), dims, est.micro_batch, args.seq,
                                  ctx.stack.keep_gathered_input), ctx,
                          dims.cp - 1 if dims.cp > 1 else 0)
    print(f"{model.name or 'model'}, one block on a rank of {dims}, {est.micro_batch} sequence(s) per micro-batch, "
          f"as {ctx.stack.name} runs it ({ctx.precision.name}):")
    print(table(work, lambda x: timer.op(x, 0)))
    return 0


def _search(model, cluster, args):
    rejected = []
    how = exhaustive_search if args.exhaustive else search
    ranked = how(model, cluster, args.seq, args.batch_tokens, top=args.top, rejected=rejected, stack=args.stack)
    problems = [p for p in (too_long(e) for _, e in ranked[:1]) if p]  # the best plan's: every other is slower
    if args.json:
        print(json.dumps({"version": __version__, "ranked": [e.as_dict() for _, e in ranked], "problems": problems,
                          "rejected": [{"dp": r.dp, "tp": r.tp, "pp": r.pp, "cp": r.cp, "ep": r.ep, "reason": r.reason}
                                       for r in rejected]}, indent=1))
        return 0 if ranked and not problems else 1
    print(f"{model.name or 'model'} ({model.params() / 1e9:.1f}B parameters) on {cluster.describe()}")
    print(f"sequence {args.seq}, {args.batch_tokens:,} tokens per step\n")
    if ranked:
        print(f"{'#':>2s}  {'tokens/s/GPU':>12s} {'MFU':>6s} {'step s':>8s} {'memory GB':>9s} {'bubble':>7s}  plan")
        for i, (dims, e) in enumerate(ranked, 1):
            print(f"{i:2d}  {e.tokens_per_s_per_gpu:12,.0f} {e.mfu:6.1%} {e.step_time:8.3f} {e.memory_peak / 1e9:9.1f} "
                  f"{e.bubble:7.1%}  {dims}")
    else:
        print("no plan fits")
    for problem in problems:
        print(f"\nproblem: {problem}")
    reasons = Counter(r.reason for r in rejected)
    print(f"\n{len(rejected)} rejected plans, {len(reasons)} distinct reasons"
          + (":" if args.rejected else ""))
    shown = rejected if args.rejected < 0 else rejected[:args.rejected]
    for r in shown:
        print(f"  {r}")
    if len(shown) < len(rejected):
        print(f"  ... {len(rejected) - len(shown)} more (--rejected -1 lists all)")
    return 0 if ranked and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
