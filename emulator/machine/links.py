"""How messages share the machine's links: ports, the time of a step, port bookings.

Every GPU has an NVLink port (one direction out, one in) and sends across nodes through
its NIC, which has an out and an in port too (GPUs that share a NIC share its ports; see
:mod:`emulator.machine.topology`). A message takes the sender's out port and the receiver's in
port of the link it crosses.

The model, in two rules:

* **Within an operation** (a collective, or one point-to-point transfer), an algorithm
  proceeds in steps whose messages all start together; a step lasts until its slowest
  port is done. A port that carries several messages in one step (several channels, or a
  rank that sends to many) carries them one after the other: ``alpha + bytes / beta``
  for the total bytes through it.
* **Between operations**, a port is booked for the whole span of an operation that uses
  it. An operation starts only when every port it needs is free (taken in the order the
  engine charges them; earlier gaps are filled when they are long enough). So two groups
  that cross the same NIC at the same time take turns: together they take as long as
  their bytes need, as if they had shared its bandwidth, and the one charged first
  finishes first. Operations on different ports (a tp all-reduce on NVLink and a dp
  all-reduce on the NICs) overlap freely.
"""

from bisect import insort
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

STEP_BLOCK = 1 << 22  # (steps x ports) cells per bincount; larger patterns go block by block


def port_count(world_size, topology):
    n_nodes = -(-world_size // topology.gpus_per_node)
    return 2 * world_size + 2 * n_nodes * topology.nics_per_node


@lru_cache(maxsize=64)
def port_tables(world_size, topology):
    """Per global rank: its node, NVLink out/in ports and NIC out/in ports."""
    r = np.arange(world_size)
    g = topology.gpus_per_node
    node = r // g
    nic = node * topology.nics_per_node + (r % g) // (g // topology.nics_per_node)
    base = 2 * world_size
    return node, 2 * r, 2 * r + 1, base + 2 * nic, base + 2 * nic + 1


def ports_of(src, dst, world_size, topology):
    """(out port, in port, crosses nodes) of messages ``src -> dst`` (global rank arrays)."""
    node, nvl_out, nvl_in, nic_out, nic_in = port_tables(world_size, topology)
    nic = node[src] != node[dst]
    return np.where(nic, nic_out[src], nvl_out[src]), np.where(nic, nic_in[dst], nvl_in[dst]), nic


@dataclass
class Pattern:
    """The timing of one operation relative to its start: per message its step, global
    ranks, bytes, channel, whether it crosses nodes, start and end; the total; the ports
    it uses."""

    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    channel: np.ndarray
    nic: np.ndarray
    start: np.ndarray
    end: np.ndarray
    total: float
    ports: np.ndarray


def pattern_of(steps, ranks, world_size, topology):
    """Time the steps (:class:`~emulator.algorithms.steps.Messages`) of an operation on the group
    ``ranks`` (global ranks, indexed by group-local rank)."""
    g = np.asarray(ranks)
    lens = [len(m.src) for m in steps]
    step = np.repeat(np.arange(len(steps)), lens)
    src = g[np.concatenate([m.src for m in steps])]
    dst = g[np.concatenate([m.dst for m in steps])]
    nbytes = np.concatenate([m.nbytes for m in steps]).astype(np.int64)
    channel = np.concatenate([m.channels() for m in steps])
    out, into, nic = ports_of(src, dst, world_size, topology)
    used = np.zeros(port_count(world_size, topology), dtype=bool)
    used[out] = used[into] = True
    ports = np.flatnonzero(used)
    if all(m.exclusive for m in steps) and min(lens) > 0:
        # no port carries two messages in a step: a step lasts as long as its slowest message
        t = np.where(nic, topology.nic.alpha, topology.nvlink.alpha) + \
            nbytes / np.where(nic, topology.nic.beta, topology.nvlink.beta)
        step_time = np.maximum.reduceat(t, np.cumsum([0] + lens[:-1]))
    else:
        compact = np.cumsum(used) - 1  # port id -> index among the used ports
        step_time = _step_times(step, len(steps), compact[out], compact[into], nbytes, nic, len(ports), topology)
    ends = np.cumsum(step_time)
    starts = ends - step_time
    total = float(ends[-1]) if len(ends) else 0.0
    return Pattern(step, src, dst, nbytes, channel, nic, starts[step], ends[step], total, ports)


def _step_times(step, n_steps, out, into, nbytes, nic, n_ports, topology):
    """Per step, the time of its slowest port: alpha + bytes through it / beta."""
    alpha = np.array([topology.nvlink.alpha, topology.nic.alpha])
    beta = np.array([topology.nvlink.beta, topology.nic.beta])
    kind = np.zeros(n_ports, dtype=np.int64)
    kind[out[nic]] = kind[into[nic]] = 1  # a port is NVLink or NIC, never both
    times = np.empty(n_steps)
    block = max(1, STEP_BLOCK // max(n_ports, 1))
    bounds = np.searchsorted(step, np.arange(0, n_steps + block, block))
    for b, lo in enumerate(range(0, n_steps, block)):
        i, j = bounds[b], bounds[b + 1]
        k = min(block, n_steps - lo)
        t = np.zeros(k * n_ports)
        a, b_ = np.tile(alpha[kind], k), np.tile(beta[kind], k)
        for port in (out[i:j], into[i:j]):
            cell = (step[i:j] - lo) * n_ports + port
            load = np.bincount(cell, weights=nbytes[i:j], minlength=k * n_ports)
            hit = np.bincount(cell, minlength=k * n_ports) > 0
            t = np.maximum(t, np.where(hit, a + load / b_, 0.0))
        times[lo:lo + k] = t.reshape(k, n_ports).max(axis=1)
    return times


class PortBook:
    """When each port is busy: ``until[p]`` is the end of its last booking, ``spans[p]``
    the booked intervals (touching ones merged), sorted."""

    def __init__(self, n_ports):
        self.until = np.zeros(n_ports)
        self.spans = {}

    def place(self, ports, duration, t0):
        """The earliest ``t >= t0`` at which every port in ``ports`` is free for
        ``[t, t + duration)``."""
        if duration <= 0 or len(ports) == 0 or self.until[ports].max() <= t0:
            return t0
        t = t0
        moved = True
        while moved:
            moved = False
            for p in ports[self.until[ports] > t].tolist():
                for s, e in self.spans[p]:
                    if s < t + duration and e > t:
                        t, moved = e, True
        return t

    def book(self, ports, start, end):
        if end <= start or len(ports) == 0:
            return
        self.until[ports] = np.maximum(self.until[ports], end)  # ports are distinct
        spans_of = self.spans
        for p in ports.tolist():
            spans = spans_of.get(p)
            if spans is None:
                spans_of[p] = [(start, end)]
            elif spans[-1][1] == start:  # back to back on one stream: extend
                spans[-1] = (spans[-1][0], end)
            elif spans[-1][1] < start:
                spans.append((start, end))
            else:
                insort(spans, (start, end))
