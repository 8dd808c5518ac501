"""Sequence parallelism's regions under Megatron-LM's names, each with its backward the
other collective (megatron/core/tensor_parallel/mappings.py)."""

import numpy as np
import pytest

from emulator import World
from emulator.parallel import sequence_parallel as SP


@pytest.mark.parametrize("t", [1, 2, 3, 4])
def test_regions_gather_and_reduce_scatter_along_the_sequence(t):
    rng = np.random.default_rng(t)
    slices = [rng.standard_normal((2, 3, 5)) for _ in range(t)]  # each rank's (b, s/t, h)
    partial = [rng.standard_normal((2, 3 * t, 5)) for _ in range(t)]  # each rank's partial (b, s, h)

    def prog(comm):
        r = comm.rank
        return (SP.gather_from_sequence_parallel_region(comm, slices[r]),
                SP.gather_from_sequence_parallel_region_backward(comm, partial[r]),
                SP.reduce_scatter_to_sequence_parallel_region(comm, partial[r]),
                SP.reduce_scatter_to_sequence_parallel_region_backward(comm, slices[r]))

    world = World(t)
    out = world.run(prog)
    whole, total = np.concatenate(slices, axis=1), np.sum(partial, axis=0)
    for r, (gathered, grad, scattered, grad_back) in enumerate(out):
        mine = slice(3 * r, 3 * (r + 1))
        np.testing.assert_allclose(gathered, whole)
        np.testing.assert_allclose(grad, total[:, mine])  # the all-gather's backward: reduce-scatter
        np.testing.assert_allclose(scattered, total[:, mine])
        np.testing.assert_allclose(grad_back, whole)  # the reduce-scatter's backward: all-gather
    if t > 1:
        assert [c.op for c in world.calls[0]] == ["all_gather", "reduce_scatter", "reduce_scatter", "all_gather"]
