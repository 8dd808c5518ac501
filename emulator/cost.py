"""The alpha-beta cost of collectives in closed form, and nccl-tests' bandwidth figures.

These are the times the emulator's clock gives a collective that starts with every rank
ready (a test checks they agree within 5% for many groups, strided ones included),
written as formulas a student can read. ``S`` is the collective's size as nccl-tests
counts it: the per-rank buffer for all_reduce and reduce_scatter, the gathered result for
all_gather.

**Ring** (all_reduce: 2(n-1) steps; reduce_scatter, all_gather: n-1 steps). With c
channels, every step each channel moves a piece of S/(n c) bytes from every rank to the
next in its ring, and a step lasts as long as its busiest port::

    T = steps * max over ports (alpha_link + pieces_through_port * S / (n c) / beta_link)

Inside one node every rank's NVLink-out carries all c pieces: T = steps (alpha + S/n/beta),
the textbook 2(n-1) alpha + 2(n-1)/n S/beta for all_reduce. Across nodes each channel
leaves a node through a different GPU's NIC (:meth:`Topology.rings`), so with c >= GPUs
per node the NICs share the crossing pieces and the bus bandwidth is about their sum.

**Tree** (binomial, unpipelined; see :mod:`emulator.algorithms.tree`): all_reduce is ceil(log2 n)
levels up and as many down, each moving the whole buffer: T = sum over levels of
(alpha + S / beta) on the slowest link of that level.

**All-to-all** (every send and receive posted at once, as NCCL groups them; see
:mod:`emulator.algorithms.all_to_all`): one step in which every port carries the bytes of
all its messages, so ``T = max over ports (alpha_link + bytes_through_port / beta_link)``.
``S`` is each rank's whole send buffer, ``S/n`` to every rank (nccl-tests'
``alltoall_perf`` size); :func:`all_to_all_time` takes any matrix of sizes. Across ``N``
nodes of ``g`` GPUs with a NIC each, a NIC carries ``g (N-1) S/n`` and sets the time for
large S: ``busbw = (n-1)/n S / T -> (n-1)/(g (N-1)) beta_nic``, which is about ``N/(N-1)``
NICs' worth (S. Jeaugey in NVIDIA/nccl-tests#130: 2x a NIC on two nodes, tending to 1x;
#267: an all-to-all cannot aggregate several NICs per GPU, and an NDR NIC reaches 48-49
GB/s). DeepEP's measured bottleneck bandwidths sit at the same links' limits: 43-58 GB/s
over RDMA with 50 GB/s CX7 NICs, 153-158 GB/s over H800 NVLink of about 160 GB/s
(deepseek-ai/DeepEP ``docs/legacy.md``, normal kernels). ``PUBLISHED_ALL_TO_ALL`` lists them;
tests hold the model to them.

nccl-tests reports ``algbw = S / t`` and ``busbw = algbw * factor`` with factor 2(n-1)/n
for all_reduce and (n-1)/n for reduce_scatter, all_gather and all_to_all, so that busbw
is comparable to a link's bandwidth whatever n is.
"""

import math

import numpy as np

from .errors import ConfigError
from .machine.links import port_count, ports_of
from .machine.topology import PUBLISHED_ALL_REDUCE_BUSBW, Topology
from .records.table import Table

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "all_to_all": lambda n: (n - 1) / n,
}

# Published all-to-all bandwidths the model is held to (tests/test_cost.py): (what, low GB/s,
# high GB/s, source). nccl-tests#130 adds the rule the busbw follows: about N/(N-1) NICs.
PUBLISHED_ALL_TO_ALL = (
    ("one NDR 400 Gb/s NIC, as NCCL reaches it", 46, 49, "NVIDIA/nccl-tests#290 (46-48), #267 (48-49)"),
    ("DeepEP internode dispatch/combine, RDMA bottleneck, EP16-64, CX7", 43, 58, "deepseek-ai/DeepEP docs/legacy.md"),
    ("DeepEP intranode dispatch/combine, NVLink bottleneck, EP8 on H800 (~160 GB/s)", 153, 158,
     "deepseek-ai/DeepEP docs/legacy.md"),
)
RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1, "all_gather": lambda n: n - 1}


def group(ranks):
    """A group's global ranks: a list as given, or an int n meaning ranks 0..n-1."""
    if isinstance(ranks, (int, np.integer)):
        if ranks < 1:
            raise ConfigError(f"need at least one rank, got n={ranks}")
        return tuple(range(int(ranks)))
    ranks = tuple(int(r) for r in ranks)
    if not ranks or len(set(ranks)) != len(ranks) or min(ranks) < 0:
        raise ConfigError(f"a group is a non-empty list of distinct ranks >= 0, got {list(ranks)}")
    return ranks


def _link(topology, nic):
    return topology.nic if nic else topology.nvlink


def ring_time(op, nbytes, ranks, topology, channels=None):
    """The ring formula above, for the group ``ranks`` (global ranks)."""
    n = len(ranks)
    c = topology.channels if channels is None else channels
    piece = nbytes / (n * c)
    world = max(ranks) + 1
    load = {}  # port -> (pieces through it per step, crosses nodes)
    for order, first, stop in topology.rings(ranks, c):
        g = np.asarray(ranks)[list(order)]
        out, into, nic = ports_of(g, np.roll(g, -1), world, topology)
        for port, crosses in zip(np.concatenate([out, into]), np.concatenate([nic, nic])):
            count, _ = load.get(int(port), (0, crosses))
            load[int(port)] = (count + stop - first, bool(crosses))
    step = max(_link(topology, nic).alpha + count * piece / _link(topology, nic).beta
               for count, nic in load.values())
    return RING_STEPS[op](n) * step


def tree_time(op, nbytes, ranks, topology, root=0):
    """Binomial tree: all_reduce (up then down from group rank 0) or broadcast (down from
    group rank ``root``); every level moves the whole buffer on its slowest link."""
    n = len(ranks)
    g = topology.gpus_per_node
    levels = range(max(0, math.ceil(math.log2(n))))

    def level_time(k):
        v = np.arange(0, n - (1 << k), 1 << (k + 1))  # parents at level k (relative to the root)
        src = np.asarray(ranks)[(v + root) % n]
        dst = np.asarray(ranks)[(v + (1 << k) + root) % n]
        crosses = (src // g != dst // g).any()
        return _link(topology, crosses).time(nbytes)

    down = sum(level_time(k) for k in levels)
    return 2 * down if op == "all_reduce" else down


def all_to_all_ports(sizes, ranks, topology):
    """Per port an all-to-all uses: (bytes through it, its link), for ``sizes[i][j]`` bytes
    from group rank i to group rank j on the group ``ranks`` (global ranks). A dict
    {port: (bytes, Link)}; the time is the largest ``link.time(bytes)``."""
    g = np.asarray(group(ranks))
    sizes = np.asarray(sizes, dtype=np.float64)
    n = len(g)
    if sizes.shape != (n, n):
        raise ConfigError(f"all_to_all sizes must be an ({n}, {n}) matrix of bytes, got shape {sizes.shape}")
    if (sizes < 0).any():
        raise ConfigError("all_to_all sizes must be >= 0 bytes")
    src, dst = np.nonzero(~np.eye(n, dtype=bool))
    world = int(g.max()) + 1
    out, into, nic = ports_of(g[src], g[dst], world, topology)
    nbytes = sizes[src, dst]
    load = np.zeros(port_count(world, topology))
    used = np.zeros(len(load), dtype=bool)
    on_nic = np.zeros(len(load), dtype=bool)
    for port in (out, into):
        np.add.at(load, port, nbytes)
        used[port] = True
        on_nic[port[nic]] = True
    return {int(p): (float(load[p]), _link(topology, bool(on_nic[p]))) for p in np.flatnonzero(used)}


def all_to_all_time(sizes, ranks, topology):
    """Seconds for an all-to-all with every message posted at once: the busiest port's
    ``alpha + bytes / beta`` (see the module docstring)."""
    ports = all_to_all_ports(sizes, ranks, topology)
    return max((link.time(b) for b, link in ports.values()), default=0.0)


def collective_time(op, nbytes, ranks, topology, algorithm="ring", channels=None):
    """Seconds for one collective of ``nbytes`` (S, as above) on the group ``ranks`` (a list
    of global ranks, or an int n for ranks 0..n-1) of ``topology``."""
    ranks = group(ranks)
    if nbytes < 0:
        raise ConfigError(f"nbytes must be >= 0, got {nbytes}")
    if len(ranks) == 1:
        return 0.0
    if algorithm == "ring" and op in RING_STEPS:
        return ring_time(op, nbytes, ranks, topology, channels)
    if algorithm == "tree" and op in ("all_reduce", "broadcast"):
        return tree_time(op, nbytes, ranks, topology)
    if op == "all_to_all":  # one schedule: every message at once
        n = len(ranks)
        return all_to_all_time(np.full((n, n), nbytes / n), ranks, topology)
    raise ConfigError(f"no closed form here for {algorithm} {op}; run it on a World and read world.stats()")


def p2p_time(nbytes, src, dst, topology):
    """One point-to-point message between global ranks ``src`` and ``dst``."""
    return topology.link(src, dst).time(nbytes)


def algbw(nbytes, seconds):
    """Algorithm bandwidth as nccl-tests defines it: bytes over time."""
    return nbytes / seconds


def busbw(op, nbytes, n, seconds):
    """Bus bandwidth as nccl-tests defines it: algbw times the op's factor."""
    return algbw(nbytes, seconds) * BUS_FACTOR[op](n)


def calibration_table(topology=None, nbytes=2**30):
    """The model's all_reduce bus bandwidth beside the published nccl-tests figures
    (:data:`emulator.machine.topology.PUBLISHED_ALL_REDUCE_BUSBW`), one row each."""
    topology = topology or Topology.h100()
    rows = []
    for nodes, (lo, hi), what, source in PUBLISHED_ALL_REDUCE_BUSBW:
        n = nodes * topology.gpus_per_node
        ring = "SHARP" not in what
        model = busbw("all_reduce", nbytes, n, collective_time("all_reduce", nbytes, n, topology)) / 1e9
        rows.append({"nodes": nodes, "measured": what, "published GB/s": f"{lo}" if lo == hi else f"{lo}-{hi}",
                     "model GB/s": f"{model:.0f}" if ring else "(ring only)", "source": source})
    return Table(rows)


def crossover_bytes(n, link):
    """Message size where a ring all-reduce's latency term equals its bandwidth term
    (one node, one link): 2(n-1) alpha = 2(n-1)/n S / beta  ->  S = n alpha beta."""
    return n * link.alpha * link.beta


def crossover_ring_tree(n, link):
    """Message size where a ring all-reduce and a binomial-tree all-reduce take equal time
    on one link (L = ceil(log2 n) levels):
    2(n-1) alpha + 2(n-1)/n S/beta = 2L (alpha + S/beta)  ->  S = (n-1-L) alpha beta / (L - (n-1)/n).
    Below it the tree's fewer steps win; above it the ring's smaller volume."""
    levels = math.ceil(math.log2(n))
    return (n - 1 - levels) * link.alpha * link.beta / (levels - (n - 1) / n)
