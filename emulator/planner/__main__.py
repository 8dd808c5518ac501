"""The planner from a shell.

    python -m emulator.planner --gpus 16384 --gpus-per-node 8 --model llama3-405b --seq 8192 --batch-tokens 16M
    python -m emulator.planner ... --dims dp=128,tp=8,pp=16,zero_stage=1,sequence_parallel=true,micro_batches=16
    python -m emulator.planner ... --dims ... --run        # run that plan on the emulator, predicted beside measured
    python -m emulator.planner ... --json                  # the same as JSON, for scripts

Without ``--dims`` it prints the ranked plans and every rejected one with its reason. A
model is a preset name (``--list-models``) or a shape:
``--model n_layers=8,d_model=256,n_heads=8,d_ff=1024,vocab=2048[,n_kv_heads=..,mlp=swiglu,n_experts=..,top_k=..]``.
Sizes take K, M, G (powers of 2: 16M = 16 x 2**20).
"""

import argparse
import json
import sys
from collections import Counter
from dataclasses import fields

from ..errors import ConfigError
from ..parallel.dims import ParallelDims
from . import cluster_preset, evaluate, model_preset, run_plan, search
from .models import PRESETS, ModelSpec

SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30}


def size(text):
    """``16M`` -> 16 x 2**20; a plain integer as it is."""
    t = str(text).strip().upper()
    try:
        return int(float(t[:-1]) * SUFFIX[t[-1]]) if t and t[-1] in SUFFIX else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (an integer, or with K, M or G: 16M)") from None


def _value(text):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def pairs(text, what):
    out = {}
    for item in text.split(","):
        if "=" not in item:
            raise ConfigError(f"--{what}: expected name=value pairs separated by commas, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = _value(v.strip())
    return out


def built(cls, text, what):
    """`cls(**pairs)` from a --what flag's text, naming any field `cls` does not have."""
    kw = pairs(text, what)
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(kw) - known)
    if unknown:
        raise ConfigError(f"--{what}: unknown field(s) {unknown}; {cls.__name__} takes {sorted(known)}")
    return cls(**kw)


def model_of(text):
    return model_preset(text) if "=" not in text else built(ModelSpec, text, "model")


def dims_of(text):
    return built(ParallelDims, text, "dims")


def parser():
    p = argparse.ArgumentParser(prog="python -m emulator.planner", description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--gpus", type=size, help="GPUs in all (a multiple of --gpus-per-node)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--cluster", default="h100", help="h100, h200 or a100 nodes (default h100)")
    p.add_argument("--model", help="a preset name or n_layers=..,d_model=..,n_heads=..,d_ff=..,vocab=..")
    p.add_argument("--seq", type=size, help="sequence length in tokens")
    p.add_argument("--batch-tokens", type=size, help="global batch in tokens per step (16M = 16 x 2**20)")
    p.add_argument("--dims", help="evaluate one plan: dp=..,tp=..,pp=..[,cp=..,ep=..,zero_stage=..,...]")
    p.add_argument("--run", action="store_true", help="with --dims: run the plan on the emulator (shape-only)")
    p.add_argument("--top", type=int, default=10, help="plans to rank (default 10)")
    p.add_argument("--rejected", type=int, default=20, help="rejected plans to list (default 20; -1: all)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--list-models", action="store_true", help="list the model presets and exit")
    return p


def main(argv=None):
    args = parser().parse_args(argv)
    if args.list_models:
        for name, m in sorted(PRESETS.items()):
            print(f"{name:24s} {m.params() / 1e9:8.1f}B  {m.source}")
        return 0
    missing = [f"--{k.replace('_', '-')}" for k in ("gpus", "model", "seq", "batch_tokens") if getattr(args, k) is None]
    if missing:
        print(f"python -m emulator.planner: missing {', '.join(missing)} (see --help)", file=sys.stderr)
        return 2
    try:
        if args.gpus % args.gpus_per_node:
            raise ConfigError(f"--gpus ({args.gpus}) must be a multiple of --gpus-per-node ({args.gpus_per_node})")
        cluster = cluster_preset(args.cluster, nodes=args.gpus // args.gpus_per_node, gpus_per_node=args.gpus_per_node)
        model = model_of(args.model)
        if args.dims:
            return _one(model, cluster, dims_of(args.dims), args)
        if args.run:
            raise ConfigError("--run needs --dims (the plan to run)")
        return _search(model, cluster, args)
    except ConfigError as exc:
        print(f"python -m emulator.planner: {exc}", file=sys.stderr)
        return 2


def _one(model, cluster, dims, args):
    if args.run:
        fold = ("dp", "tp") if dims.world_size > 64 else ()
        pr = run_plan(model, cluster, dims, args.seq, args.batch_tokens, fold=fold)
        if args.json:
            print(json.dumps({"estimate": pr.estimate.as_dict(), "comparison": list(pr.table()),
                              "wall_seconds": pr.wall_seconds}, indent=1))
        else:
            print(pr.estimate.summary())
            print(f"\nran on the emulator in {pr.wall_seconds:.1f} s{' (dp and tp folded)' if fold else ''}:")
            print(pr.table())
        return 0
    est = evaluate(model, cluster, dims, args.seq, args.batch_tokens)
    if args.json:
        print(json.dumps(est.as_dict(), indent=1))
    else:
        print(est.summary())
        if est.comm is not None:
            print(est.comm)
    return 0 if est.valid else 1


def _search(model, cluster, args):
    rejected = []
    ranked = search(model, cluster, args.seq, args.batch_tokens, top=args.top, rejected=rejected)
    if args.json:
        print(json.dumps({"ranked": [e.as_dict() for _, e in ranked],
                          "rejected": [{"dp": r.dp, "tp": r.tp, "pp": r.pp, "cp": r.cp, "ep": r.ep, "reason": r.reason}
                                       for r in rejected]}, indent=1))
        return 0 if ranked else 1
    print(f"{model.name or 'model'} ({model.params() / 1e9:.1f}B parameters) on {cluster.describe()}")
    print(f"sequence {args.seq}, {args.batch_tokens:,} tokens per step\n")
    if ranked:
        print(f"{'#':>2s}  {'tokens/s/GPU':>12s} {'MFU':>6s} {'step s':>8s} {'memory GB':>9s} {'bubble':>7s}  plan")
        for i, (dims, e) in enumerate(ranked, 1):
            print(f"{i:2d}  {e.tokens_per_s_per_gpu:12,.0f} {e.mfu:6.1%} {e.step_time:8.3f} {e.memory_peak / 1e9:9.1f} "
                  f"{e.bubble:7.1%}  {dims}")
    else:
        print("no plan fits")
    reasons = Counter(r.reason for r in rejected)
    print(f"\n{len(rejected)} rejected plans, {len(reasons)} distinct reasons"
          + (":" if args.rejected else ""))
    shown = rejected if args.rejected < 0 else rejected[:args.rejected]
    for r in shown:
        print(f"  {r}")
    if len(shown) < len(rejected):
        print(f"  ... {len(rejected) - len(shown)} more (--rejected -1 lists all)")
    return 0 if ranked else 1


if __name__ == "__main__":
    sys.exit(main())
