"""The two searches on a cluster (default: 16,384 H100s, Llama 3 405B's shape, 8,192-token
sequences, 16M tokens a step): the default :func:`emulator.planner.search` (the settings a
person tries first, screened in closed form) as the baseline, and
:func:`emulator.planner.exhaustive.exhaustive_search` (every setting, pruned by proven
bounds): its ranking (:func:`~emulator.planner.exhaustive.candidates`), its full
evaluations, its time as a ratio of the baseline's, and how much faster its first plan is.
First, the default search ranking every plan and fully evaluating the best 20, against
its target of 2 s.

    python -m benchmarks.search_speed            # 16,384 GPUs (minutes)
    python -m benchmarks.search_speed --nodes 8 --model llama3-70b --seq 4096 --batch-tokens 2097152  # 64 GPUs
"""

import argparse
import time

from emulator.planner import cluster_preset, exhaustive, model_preset, search
from emulator.planner.precision_of import plan_context


def main(nodes=2048, seq=8192, tokens=16 * 2**20, model_name="llama3-405b"):
    model, cluster = model_preset(model_name), cluster_preset("h100", nodes=nodes)
    t0 = time.perf_counter()
    search(model, cluster, seq, tokens, top=20, full_evaluations=20)
    twenty = time.perf_counter() - t0
    print(f"search ranking every plan, the best 20 evaluated in full: {twenty:.2f} s (target 2 s: "
          f"{'met' if twenty <= 2 else 'missed'})")
    t0 = time.perf_counter()
    (_, fast), = search(model, cluster, seq, tokens, top=1)
    base_s = time.perf_counter() - t0
    print(f"{cluster.gpus:,} GPUs, {model_name}: search (baseline) {base_s:.2f} s, first step {fast.step_time:.3f} s")
    t0 = time.perf_counter()
    cands = exhaustive.candidates(model.with_seq(seq), cluster, seq, tokens, plan_context(), [])
    rank_s = time.perf_counter() - t0
    print(f"  exhaustive ranking: {len(cands):,} settings that may fit, {rank_s:.2f} s ({rank_s / base_s:.0f}x)")
    real, calls = exhaustive.evaluate, []

    def counted(*a, **k):
        t = time.perf_counter()
        out = real(*a, **k)
        calls.append(time.perf_counter() - t)
        return out

    exhaustive.evaluate = counted
    try:
        t0 = time.perf_counter()
        (dims, best), = exhaustive.exhaustive_search(model, cluster, seq, tokens, top=1)
        total = time.perf_counter() - t0
    finally:
        exhaustive.evaluate = real
    print(f"  exhaustive_search: {total:.2f} s in all ({total / base_s:.0f}x the baseline), {len(calls)} full "
          f"evaluations ({sum(calls):.2f} s); first {dims}, step {best.step_time:.3f} s "
          f"({fast.step_time / best.step_time - 1:+.1%} faster than the baseline's first)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2048, help="nodes of 8 H100s")
    ap.add_argument("--model", default="llama3-405b")
    ap.add_argument("--seq", type=int, default=8192)
    ap.add_argument("--batch-tokens", type=int, default=16 * 2**20)
    a = ap.parse_args()
    main(a.nodes, a.seq, a.batch_tokens, a.model)
