"""The alpha-beta cost of collectives, in closed form, and nccl-tests' bandwidth figures.

These are the same numbers the emulator's clock produces for a collective that starts with
every rank ready (a test checks they agree), written as formulas a student can read:

* ring all-reduce:   2(n-1) steps of S/n bytes -> 2(n-1) alpha + 2(n-1)/n * S / beta
* ring reduce-scatter or all-gather: (n-1) steps -> (n-1) alpha + (n-1)/n * S / beta
* tree all-reduce:   2 ceil(log2 n) steps of S bytes -> 2 ceil(log2 n) (alpha + S / beta)

``S`` is the per-rank buffer (for all-gather: the gathered result), and a ring's slowest
link sets beta: if the ring leaves a node, every step waits for the inter-node link.

nccl-tests reports ``algbw = S / t`` and ``busbw = algbw * factor`` with factor 2(n-1)/n for
all-reduce and (n-1)/n for reduce-scatter and all-gather, so that busbw is comparable to
the link's bandwidth whatever n is.
"""

import math

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "broadcast": lambda n: 1.0,
}


def _check(nbytes, n):
    if n < 1 or nbytes < 0:
        raise ValueError(f"need n >= 1 ranks and nbytes >= 0, got n={n}, nbytes={nbytes}")


def ring_link(topology, n):
    """The link that sets a ring's pace: intra-node if all n ranks share a node."""
    return topology.intra if n <= topology.gpus_per_node else topology.inter


def collective_time(op, nbytes, n, topology, algorithm="ring"):
    """Seconds for one collective of ``nbytes`` per rank on ranks 0..n-1 of ``topology``."""
    _check(nbytes, n)
    if n == 1:
        return 0.0
    if algorithm == "ring":
        link = ring_link(topology, n)
        steps = 2 * (n - 1) if op == "all_reduce" else n - 1
        return steps * link.alpha + BUS_FACTOR[op](n) * nbytes / link.beta
    if algorithm == "tree" and op == "all_reduce":
        link = ring_link(topology, n)
        levels = math.ceil(math.log2(n))
        return 2 * levels * (link.alpha + nbytes / link.beta)
    raise ValueError(f"no closed form here for {algorithm} {op}; run it on a World and read world.stats()")


def algbw(nbytes, seconds):
    """Algorithm bandwidth as nccl-tests defines it: bytes per rank over time."""
    return nbytes / seconds


def busbw(op, nbytes, n, seconds):
    """Bus bandwidth as nccl-tests defines it: algbw times the op's factor."""
    return algbw(nbytes, seconds) * BUS_FACTOR[op](n)


def crossover_bytes(n, link):
    """Message size where a ring all-reduce's latency term equals its bandwidth term:
    2(n-1) alpha = 2(n-1)/n S / beta  ->  S = n alpha beta."""
    return n * link.alpha * link.beta
