"""The planner beside published training runs, and beside the emulator at full size.

    python -m benchmarks.planner              # every published row: predicted beside published
    python -m benchmarks.planner --emulator   # also Llama 3 405B's mesh run shape-only (about a minute)

1. Each row of Narayanan et al. 2021 Table 1 (A100), the Megatron-LM README's H100 table
   and Llama 3 405B's Table 4 (:mod:`emulator.planner.published`, which cites them):
   the published axes, the settings the source does not state searched (the fastest that
   fits), teraFLOP/s per GPU counted as the source counts them, beside the published
   figure. The device model is the emulator's, calibrated from kernel figures only; the
   target is 15%; a row outside it is marked, with where its predicted step goes (``WHY``).
2. ``--emulator``: Llama 3 405B's pretraining plan on 16,384 H100s, the planner's
   prediction beside the emulator's own run of it (shape-only, dp and tp folded).
"""

import argparse
import time

from emulator.planner.published import RUNS, TARGET, predict, why_off

WHY = {
    "fast": "the published step is longer than the model accounts for: the planner charges every kernel the "
            "source's stack runs (its declaration per module), the host's launches, each collective with what "
            "hides it, and the schedule's bubble, and the gap is outside all of them. Per row, as shares of the "
            "predicted step: where that step goes, and the gap (published step over predicted, less one)",
    "slow": "the model's step is longer than the source's: per row, as shares of the predicted step, where it "
            "goes (the exposed collectives and the bubble are what the source may hide better), and the gap",
}


def published_table():
    print(f"{'source':10s} {'model':22s} {'GPUs':>6s} {'TP':>3s} {'PP':>3s} {'CP':>3s} {'DP':>4s} "
          f"{'published':>9s} {'predicted':>9s} {'error':>7s}  {'stack':14s} planner's plan (unstated settings searched)")
    within, reasons, errors = 0, {}, []
    for run in RUNS:
        est, tf = predict(run)
        err = tf / run.tflops_per_gpu - 1
        errors.append(abs(err))
        reason, shares = why_off(est, run.tflops_per_gpu, tf)
        within += not reason
        if reason:
            reasons.setdefault(reason, []).append((run.model, shares))
        d = est.dims
        plan = f"{d.schedule}{f' v={d.v}' if d.v > 1 else ''}, ZeRO-{d.zero_stage}, recompute {d.recompute}" + \
            ("" if est.fits else f"; does not fit ({est.memory_peak / 1e9:.0f} GB)")
        print(f"{run.source.split(',')[0].split(' (')[0][:10]:10s} {run.model:22s} {run.gpus:6,d} {run.tp:3d} "
              f"{run.pp:3d} {run.cp:3d} {run.dp:4d} {run.tflops_per_gpu:9.1f} {tf:9.1f} {err:+7.1%}"
              f"{' *' if reason else '  '} {run.stack:14s} {plan}")
    errors.sort()
    median = (errors[(len(errors) - 1) // 2] + errors[len(errors) // 2]) / 2
    print(f"\n{within} of {len(RUNS)} rows within {TARGET:.0%}, median error {median:.1%} (teraFLOP/s per GPU, "
          "each source's own FLOP count; the stack each row names is the one it is timed with).")
    print("Rows marked * differ by more, for these reasons:")
    for reason, rows in reasons.items():
        print(f"  - {', '.join(model for model, _ in rows)}: {WHY[reason]}")
        for model, shares in rows:
            parts = ", ".join(f"{k} {v:.0%}" for k, v in shares.items() if k != "gap" and v >= 0.005)
            print(f"      {model:20s} {parts}; gap {shares['gap']:+.0%}")
    print("\nSources:")
    for source in sorted({r.source for r in RUNS}):
        print(f"  {source}")
    return within


def llama_on_the_emulator():
    from emulator.parallel import ParallelDims
    from emulator.planner import cluster_preset, model_preset, run_plan

    model = model_preset("llama3-405b").replace(positions="learned", max_seq=8192)
    dims = ParallelDims(dp=128, tp=8, pp=16, zero_stage=1, sequence_parallel=True, micro_batches=16,
                        recompute="selective")
    t0 = time.perf_counter()
    pr = run_plan(model, cluster_preset("h100", nodes=2048), dims, 8192, 16 * 2**20, fold=("dp", "tp"))
    print(f"\nLlama 3 405B, {dims} on 16,384 H100s, shape-only with dp and tp folded "
          f"({time.perf_counter() - t0:.0f} s wall):")
    print(pr.table())


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--emulator", action="store_true", help="also run Llama 3 405B's mesh on the emulator")
    args = parser.parse_args()
    published_table()
    if args.emulator:
        llama_on_the_emulator()
