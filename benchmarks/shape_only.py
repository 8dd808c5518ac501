"""Shape-only runs at full scale.

    python -m benchmarks.shape_only            # Llama 3 405B's pretraining mesh, and the per-call overhead
    python -m benchmarks.shape_only --quick    # the per-call overhead only

1. Llama 3 405B (126 layers, d_model 16384, 128 heads and 8 K/V heads, SwiGLU d_ff
   53248, vocabulary 128256; Meta's llama-models sku_list) on its published pretraining
   mesh, TP 8 x CP 1 x PP 16 x DP 128 on 16,384 H100s (Llama 3 paper, section 3.3.2, table
   4), sequence 8192, 16M tokens per step, with sequence parallelism, selective
   recomputation, ZeRO-1 and 16 micro-batches of one sequence per replica, shape-only,
   ``dp`` and ``tp`` folded: wall time, and what each pipeline stage's representative
   reports (timeline end, peak memory by kind, bytes per group and link).
2. The engine's cost per collective call, shape-only beside the data engine (the same
   8-rank all-reduce loop, both measured in this run): the ratio is what running without
   data saves on the engine itself.
"""

import argparse
import time

import numpy as np
from ml_dtypes import bfloat16

from emulator import World, nn
from emulator.arrays.shape_only import ShapeArray
from emulator.parallel import ParallelDims, run_on_mesh, shape_only_batches

LLAMA3_405B = dict(vocab=128256, d_model=16384, n_heads=128, d_ff=53248, n_layers=126, max_seq=8192,
                   n_kv_heads=8, mlp="swiglu")


def llama3_405b():
    model = nn.GPT(**LLAMA3_405B, dtype=bfloat16)
    dims = ParallelDims(dp=128, tp=8, pp=16, sequence_parallel=True, zero_stage=1, micro_batches=16,
                        recompute="selective")
    t0 = time.perf_counter()
    run = run_on_mesh(model, None, shape_only_batches(1, 2048, 8192), dims, nn.AdamW(mixed_precision=True),
                      shape_only=True)
    wall = time.perf_counter() - t0
    print(f"Llama 3 405B, {dims}, {dims.world_size:,} GPUs: {len(run.ranks())} ranks run (dp and tp folded), "
          f"shape-only in {wall:.1f} s wall (target: under 120 s)")
    print(f"simulated step: {run.step_time():.2f} s on ideal H100s (peak FLOP/s)")
    print(run.summary())
    return wall


def per_call(calls=300, n=8):
    """Microseconds per 8-element all-reduce on ``n`` ranks, data and shape-only."""
    out = {}
    for name, x in (("data", np.ones(8, np.float32)), ("shape-only", ShapeArray((8,), np.float32))):
        best = float("inf")
        for _ in range(5):
            world = World(n)
            t0 = time.perf_counter()
            world.run(lambda comm: [comm.all_reduce(x) for _ in range(calls)])
            best = min(best, (time.perf_counter() - t0) / calls)
        out[name] = best * 1e6
    print(f"per-call overhead, all_reduce of 8 elements on {n} ranks (best of 5 x {calls} calls): "
          f"data {out['data']:.0f} us, shape-only {out['shape-only']:.0f} us, "
          f"ratio {out['shape-only'] / out['data']:.2f}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the per-call overhead only")
    args = parser.parse_args()
    per_call()
    if not args.quick:
        llama3_405b()
