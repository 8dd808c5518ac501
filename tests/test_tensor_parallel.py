"""Column- then row-parallel linear layers (Megatron's MLP) against the single-device layers;
the blocks' regions (TPRegions) are the same operators; the old module paths name the
package's objects."""

import numpy as np
import pytest

from emulator import ConfigError, World, nn
from emulator.parallel import sequence_parallel, tp_attention, tp_block, tp_mlp, tp_regions, vocab_parallel
from emulator.parallel import tensor_parallel as TP
from emulator.parallel.tensor_parallel import attention, block, block_work, linear, mlp, overlap, regions, \
    regions_work, vocab
from emulator.parallel.tensor_parallel import (ColumnParallelLinear, RowParallelLinear, copy_to_tp_region,
                                               copy_to_tp_region_backward, reduce_from_tp_region_backward)

D, FF = 8, 12


@pytest.mark.parametrize("t", [1, 2, 4])
def test_megatron_mlp_equals_the_dense_one(t):
    mlp = nn.MLP(D, FF, dtype=np.float64)
    full = mlp.init(np.random.default_rng(0))
    full["fc2.b"] += 0.5  # a bias that would show if added t times
    x = np.random.default_rng(1).standard_normal((2, 3, D))
    y_ref, cache = mlp.forward(full, x)
    dy = np.random.default_rng(2).standard_normal(y_ref.shape)
    dx_ref, g_ref = mlp.backward(full, cache, dy)

    def prog(comm):
        fc1 = ColumnParallelLinear(comm, D, FF, dtype=np.float64)
        fc2 = RowParallelLinear(comm, FF, D, dtype=np.float64)
        p1, p2 = fc1.shard(nn.sub(full, "fc1")), fc2.shard(nn.sub(full, "fc2"))
        h, c1 = fc1.forward(p1, copy_to_tp_region(comm, x))
        a, ca = nn.GELU().forward({}, h)
        y, c2 = fc2.forward(p2, a)
        dy_local = reduce_from_tp_region_backward(comm, dy)
        da = fc2.backward_input(p2, c2, dy_local)
        dh = nn.GELU().backward_input({}, ca, da)
        dx = copy_to_tp_region_backward(comm, fc1.backward_input(p1, c1, dh))
        return y, dx, fc1.backward_weight(p1, c1, dh), fc2.backward_weight(p2, c2, dy_local), fc1.cols, fc2.rows

    w = World(t)
    for y, dx, g1, g2, cols, rows in w.run(prog):
        assert np.allclose(y, y_ref) and np.allclose(dx, dx_ref)
        assert np.allclose(g1["w"], g_ref["fc1.w"][:, cols]) and np.allclose(g1["b"], g_ref["fc1.b"][cols])
        assert np.allclose(g2["w"], g_ref["fc2.w"][rows]) and np.allclose(g2["b"], g_ref["fc2.b"])
    if t > 1:  # one all-reduce in forward (g), one in backward (f), of b*s*d elements each
        assert [c.op for c in w.calls[0]] == ["all_reduce", "all_reduce"]
        assert all(c.nbytes == x.nbytes for c in w.calls[0])


def test_split_must_divide():
    with pytest.raises(ConfigError, match="divisible by the tensor-parallel size \\(4\\)"):
        World(4).run(lambda c: ColumnParallelLinear(c, D, 6))


@pytest.mark.parametrize("t", [1, 2, 3])
@pytest.mark.parametrize("sp", [False, True])
def test_the_blocks_regions_are_the_lessons_operators(t, sp):
    """TPRegions' four operators give what f, g and sequence parallelism's all-gather and
    reduce-scatter give, with the same calls (a group of one sends nothing)."""
    rng = np.random.default_rng(t)
    x = [rng.standard_normal((2, 3 * t, 4)) for _ in range(t)]  # each rank's whole-sequence tensor
    part = [rng.standard_normal((2, 3, 4)) for _ in range(t)]  # each rank's slice of the sequence

    def lesson(comm):
        r = comm.rank
        if sp:
            return (regions.gather_from_sequence_parallel_region(comm, part[r]),
                    regions.gather_from_sequence_parallel_region_backward(comm, x[r]),
                    regions.reduce_scatter_to_sequence_parallel_region(comm, x[r]),
                    regions.reduce_scatter_to_sequence_parallel_region_backward(comm, part[r]))
        return (copy_to_tp_region(comm, x[r]), copy_to_tp_region_backward(comm, x[r]),
                regions.reduce_from_tp_region(comm, x[r]), reduce_from_tp_region_backward(comm, x[r]))

    def blocks(comm):
        r, tpr = comm.rank, regions.TPRegions(comm, sp)
        inp = part[r] if sp else x[r]
        return (tpr.gather(inp), tpr.gather_back(x[r]), tpr.reduce(x[r]),
                tpr.reduce_back(inp, async_op=True).wait())

    w1, w2 = World(t), World(t)
    for a, b in zip(w1.run(lesson), w2.run(blocks)):
        for u, v in zip(a, b):
            np.testing.assert_array_equal(u, v)
    if t > 1:
        assert w1.calls == w2.calls and len(w1.calls[0]) == (4 if sp else 2)


def test_the_old_module_paths_name_the_packages_objects():
    assert TP.ColumnParallelLinear is linear.ColumnParallelLinear and TP.copy_to_tp_region is regions.copy_to_tp_region
    assert sequence_parallel.all_gather_dim is regions.all_gather_dim
    assert sequence_parallel.reduce_scatter_dim is regions.reduce_scatter_dim
    assert sequence_parallel.gather_from_sequence_parallel_region is regions.gather_from_sequence_parallel_region
    assert tp_regions.TPRegions is regions.TPRegions and tp_regions.TERegions is overlap.TERegions
    assert tp_regions.all_reduce_together is regions.all_reduce_together
    assert tp_regions.ColumnThenRow is linear.ColumnThenRow and tp_regions.wgrad is regions_work.wgrad
    assert tp_regions.PIPELINE_SPLITS == regions_work.PIPELINE_SPLITS
    assert tp_mlp.ParallelMLP is mlp.ParallelMLP and tp_mlp.mlp_work is mlp.mlp_work
    assert tp_attention.ParallelAttention is attention.ParallelAttention
    assert tp_block.TensorParallelBlock is block.TensorParallelBlock and tp_block.cached_terms is block.cached_terms
    assert tp_block.block_work is block_work.block_work and tp_block.declared_block is block_work.declared_block
    assert vocab_parallel.vocab_parallel_cross_entropy is vocab.vocab_parallel_cross_entropy
