"""The tokens an MoE layer treats as one group: capacity and the load-balancing loss are
statistics of a group, wherever its tokens sit.

On one device a group is one micro-batch: an expert takes at most ``capacity`` of the
group's assignments, first come (in the group's token order, each token's choices in
order) first served, and Switch's loss counts the group's assignments. Spread over ranks
(context parallelism cuts the sequence; lesson 05 spreads a batch over the ep group), the
same decisions need two numbers per expert from the other ranks: how many of its
assignments come *before* each of this rank's runs of tokens, and the group's totals.

A :class:`TokenGroup` is a comm over the ranks holding the group's tokens and this rank's
tokens as ``runs``: ``(key, length)`` in local order, the keys ordering every rank's runs
into the group's order (a cp rank's run of positions ``start..start+n`` of batch row ``b``
has key ``b * s + start``). One all-gather of (keys, per-run expert counts, router
probability sums) gives every rank what it needs, so each rank drops its own assignments
*before* dispatching them, as production systems do (no row is sent to be dropped).
"""

import numpy as np

from ...errors import ConfigError
from ...arrays.shape_only import is_shape_only
from ..context_parallel.layout import chunks_of


class TokenGroup:
    def __init__(self, comm, runs):
        self.comm, self.runs = comm, [(int(k), int(n)) for k, n in runs]

    @classmethod
    def local(cls, comm, n_tokens):
        """A group of this rank's tokens alone (``comm`` is not used to talk)."""
        return cls(None, [(0, n_tokens)])

    @classmethod
    def rank_order(cls, comm, n_tokens):
        """The ranks' tokens one after the other, in rank order (a batch split over ranks)."""
        return cls(comm, [(comm.rank, n_tokens)])

    @classmethod
    def sequence(cls, cp, batch, s_local, layout):
        """A context-parallel rank's tokens: ``batch`` rows of its ``s_local`` positions in
        ``layout``; the group's order is (row, position)."""
        total = s_local * cp.size
        return cls(cp, [(b * total + start, n) for b in range(batch) for start, n in
                        chunks_of(cp.rank, cp.size, s_local, layout)])

    @property
    def n_local(self):
        return sum(n for _, n in self.runs)

    def statistics(self, expert_ids, top_k, n_experts, probs):
        """For this rank's assignments ``expert_ids`` (token-major, ``top_k`` per token) and
        router probabilities ``probs`` (tokens, n_experts): (for each of my assignments, how
        many of the group's assignments to its expert come before it; the group's tokens;
        its assignments per expert; its router probability sums per expert)."""
        flat = np.asarray(expert_ids).ravel()
        if len(flat) != self.n_local * top_k:
            raise ConfigError(f"TokenGroup: {len(flat) // top_k} tokens routed, the group's runs say {self.n_local}")
        bounds = np.cumsum([0] + [n * top_k for _, n in self.runs])
        per_run = np.stack([np.bincount(flat[a:b], minlength=n_experts) for a, b in zip(bounds, bounds[1:])])
        keys = np.array([k for k, _ in self.runs], dtype=np.float64)
        p_sum, tokens = probs.sum(0), self.n_local
        if is_shape_only(p_sum):  # no values: the sums only matter to the auxiliary loss's value
            p_sum = np.zeros(n_experts)
        if self.comm is not None and self.comm.size > 1:  # every rank's runs, counts and sums
            mine = np.concatenate([keys, per_run.ravel(), p_sum, [self.n_local]]).astype(np.float64)
            table = self.comm.all_gather(mine[None])
            r = len(self.runs)
            keys = table[:, :r].ravel()
            all_runs = table[:, r:r + r * n_experts].reshape(-1, n_experts)
            p_sum, tokens = table[:, r + r * n_experts:-1].sum(0), int(table[:, -1].sum())
            mine_at = self.comm.rank * r
        else:
            all_runs, mine_at = per_run, 0
        order = np.argsort(keys, kind="stable")
        before = np.empty_like(all_runs)
        before[order] = np.cumsum(all_runs[order], axis=0) - all_runs[order]
        place = np.empty(len(flat), dtype=np.int64)
        for j, (a, b) in enumerate(zip(bounds, bounds[1:])):
            seg = flat[a:b]
            seen = np.cumsum(seg[:, None] == np.arange(n_experts)[None, :], axis=0)[np.arange(len(seg)), seg] - 1
            place[a:b] = before[mine_at + j, seg] + seen
        return place, tokens, all_runs.sum(0), p_sum
