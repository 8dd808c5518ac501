"""Closed-form seconds of a collective on a group laid out alike on every node it spans (as
mesh groups are): a ring collective from its per-port loads (thousands of ranks cost what
eight do), an all-to-all as its busiest port, ring attention step by step. Each agrees with
the engine (:mod:`emulator.cost`); each is cached by its group and topology.
"""

from functools import lru_cache

import numpy as np

from ..cost import RING_STEPS, all_to_all_time, collective_time


@lru_cache(maxsize=8192)
def collective_seconds(op, nbytes, ranks, topology):
    """:func:`ring_collective_time`, cached (a plan asks for the same few many times)."""
    return ring_collective_time(op, nbytes, ranks, topology)


def ring_collective_time(op, nbytes, ranks, topology):
    """:func:`emulator.cost.ring_time` for a group laid out alike on every node it spans
    (the same GPUs of each node, as mesh groups are), from its per-port loads in closed
    form instead of ring by ring: thousands of ranks cost what eight do. Any other group
    goes to :func:`emulator.cost.collective_time`."""
    loads = _ring_loads(ranks, topology) if op in RING_STEPS else None
    if loads is None:
        return collective_time(op, nbytes, list(ranks), topology)
    n, c = len(ranks), topology.channels
    piece = nbytes / (n * c)
    return RING_STEPS[op](n) * max(link.alpha + count * piece / link.beta for link, count in loads)


@lru_cache(maxsize=4096)
def _ring_loads(ranks, topology):
    """(link, pieces per step) of every port a ring collective over ``ranks`` uses, or None
    for a group laid out unevenly over its nodes."""
    n, c, g = len(ranks), topology.channels, topology.gpus_per_node
    by_node = {}
    for r in sorted(ranks):
        by_node.setdefault(r // g, []).append(r % g)
    layouts = {tuple(v) for v in by_node.values()}
    if n == 1 or len(layouts) != 1:
        return None
    local = layouts.pop()
    k, nodes = len(local), len(by_node)
    nvl, nic = topology.nvlink, topology.nic
    if nodes == 1:  # every channel's ring passes through every member's NVLink
        return ((nvl, c),)
    d = min(c, k)  # rings rotated to leave each node from a different member
    exits, enters = [0] * k, [0] * k
    for j in range(d):
        channels = (j + 1) * c // d - j * c // d
        exits[(j - 1) % k] += channels
        enters[j % k] += channels
    per_nic = g // topology.nics_per_node
    nic_out, nic_in = {}, {}
    for i, pos in enumerate(local):
        nic_out[pos // per_nic] = nic_out.get(pos // per_nic, 0) + exits[i]
        nic_in[pos // per_nic] = nic_in.get(pos // per_nic, 0) + enters[i]
    loads = {(nic, x) for x in list(nic_out.values()) + list(nic_in.values()) if x}
    loads |= {(nvl, c - x) for x in exits + enters if c - x}
    return tuple(loads)


@lru_cache(maxsize=2048)
def all_to_all_seconds(piece, ranks, topology):
    """Every send and receive in flight at once, as NCCL groups them: the busiest port's
    time (:func:`emulator.cost.all_to_all_time`), ``piece`` bytes between every pair."""
    n = len(ranks)
    return all_to_all_time(np.full((n, n), float(piece)), ranks, topology)


@lru_cache(maxsize=2048)
def ring_attention_seconds(ring, ranks, topology):
    """Ring attention (a :class:`~emulator.machine.ring_work.RingAttention`): each step
    computes one K/V block while the next travels; backward then sends the block's dK/dV
    on (:mod:`emulator.parallel.context_parallel.ring`). The first step waits for nothing
    it did not send, the last sends nothing on; the steps between are summed over their
    distinct shapes (:meth:`~emulator.machine.ring_work.RingAttention.grouped`)."""
    n = len(ranks)
    crosses = len({r // topology.gpus_per_node for r in ranks}) > 1
    hop = (topology.nic if crosses else topology.nvlink).time(ring.kv_bytes)
    back = 0.0 if ring.forward else hop
    device = topology.device

    def compute(kernels):
        return sum(device.time(k) for k in kernels)

    first = max(compute(ring.kernels(0)), hop if n > 1 else 0.0) + back
    if n == 1:
        return first
    last = len(ring.blocks) - 1
    between = sum(count * (max(compute(kernels), hop) + back) for kernels, count in ring.grouped(1, last))
    return first + between + compute(ring.kernels(last)) + back
