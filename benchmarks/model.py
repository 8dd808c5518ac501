"""One forward+backward of a small GPT: this NumPy code beside the same model in torch (CPU).

    python -m benchmarks.model

Model: d_model 128, 4 layers, 4 heads, d_ff 512, seq 64, batch 8, vocab 256, float32.
Both are timed in this run, in alternating blocks, best of 21 calls each; the ratio is numpy / torch. Goal: <= 3.
"""

import time

import numpy as np
import torch

from emulator import nn
from emulator.nn import torch_reference as R

V, D, H, FF, L, S, B = 256, 128, 4, 512, 4, 64, 8


def best_of_blocks(fns, rounds=3, repeat=7):
    """Best time of each function over ``rounds`` of blocks of ``repeat`` calls, the blocks
    alternating, so that a slow spell of the machine hits all of them alike while each
    library's thread pool runs undisturbed within its block."""
    best = [float("inf")] * len(fns)
    for _ in range(rounds):
        for i, fn in enumerate(fns):
            fn()  # warm up after the other library ran
            for _ in range(repeat):
                t = time.perf_counter()
                fn()
                best[i] = min(best[i], time.perf_counter() - t)
    return best


def main():
    gpt = nn.GPT(V, D, H, FF, L, max_seq=S)
    params = gpt.init(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x, y = rng.integers(0, V, (B, S)), rng.integers(0, V, (B, S))

    def numpy_step():
        logits, cache = gpt.forward(params, x)
        _, lc = nn.cross_entropy(logits, y)
        gpt.backward(params, cache, nn.cross_entropy_backward(lc))

    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tx, ty = torch.tensor(x), torch.tensor(y)

    def torch_step():
        for v in tp.values():
            v.grad = None
        loss = torch.nn.functional.cross_entropy(R.gpt(tp, tx, L, H).reshape(-1, V), ty.reshape(-1))
        loss.backward()

    t_np, t_torch = best_of_blocks([numpy_step, torch_step])
    print(f"GPT d{D} L{L} h{H} seq{S} batch{B}, float32, forward+backward, torch threads={torch.get_num_threads()}")
    print(f"numpy {t_np * 1e3:.1f} ms   torch {t_torch * 1e3:.1f} ms   numpy/torch {t_np / t_torch:.2f} (goal <= 3)")


if __name__ == "__main__":
    main()
