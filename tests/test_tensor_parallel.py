"""Column- then row-parallel linear layers (Megatron's MLP) against the single-device layers."""

import numpy as np
import pytest

from emulator import ConfigError, World, nn
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
