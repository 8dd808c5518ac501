"""What ``run_on_mesh`` returns (:class:`MeshRun`): the parameters and losses, the world
with everything the run left behind, and a rank's step, its breakdown and a summary table."""

from dataclasses import dataclass, field

from ..records.breakdown import measured
from ..records.table import Table


@dataclass
class MeshRun:
    """What ``run_on_mesh`` returns: the full ``params`` after the steps, the ``losses``
    per step (the mean cross-entropy), the ``world`` (trace, timeline, ledgers), the
    ``dims``, and each rank's layers (``stages``); ``start_step``: the steps trained
    before (from the checkpoint it resumed from), ``seeds``: the job's random draw of
    each step, ``checkpoints``: the folders of the complete saves it made."""

    params: dict
    losses: list
    world: object
    dims: object
    stages: list
    start_step: int = 0
    seeds: list = field(default_factory=list)
    checkpoints: list = field(default_factory=list)

    def ranks(self):
        """The ranks that ran (every rank, or the representatives of a folded run)."""
        return list(self.world.live)

    def step_time(self):
        """Simulated seconds of the run: when its last rank's last stream is done."""
        final = self.world.clock.final()
        return max(final[r] for r in self.ranks())

    def breakdown(self, rank=None):
        """Where ``rank``'s step went (default: the rank that finished last), by the
        categories of :func:`emulator.records.breakdown.measured`."""
        final = self.world.clock.final()
        rank = max(self.ranks(), key=lambda r: final[r]) if rank is None else rank
        return measured(self.world, rank)

    def summary(self, ranks=None):
        """Per rank that ran: its coordinates and layers, when it finished, its peak
        memory by kind, and the bytes it sent per group and link."""
        stats, final, rows = self.world.stats(), self.world.clock.final(), []
        for r in ranks if ranks is not None else self.ranks():
            led = self.world.memory[r]
            row = {"rank": r, **{a: i for a, i in self.world.mesh.coords(r).items()},
                   "layers": _span(self.stages[r]), "finished s": round(final[r], 6), "peak": led.peak,
                   **{f"peak {k}": v for k, v in led.peak_breakdown.items() if v}}
            for (group, link), sent in sorted(stats.bytes_sent_by_group.items()):
                if sent[r]:
                    row[f"{group} {link}"] = sent[r]
            rows.append(row)
        return Table(rows, byte_columns=[k for k in rows[0] if k == "peak" or k.startswith("peak ") or
                                         k.endswith(("nvlink", "nic"))])


def _span(layers):
    if not layers:
        return ""
    blocks = [int(n.split(".")[1]) for n in layers if n.startswith("blocks.")]
    ends = [n for n in layers if not n.startswith("blocks.")]
    text = f"blocks {min(blocks)}-{max(blocks)}" if blocks else ""
    return " + ".join([e for e in ends if e == "embed"] + ([text] if text else []) + [e for e in ends if e == "head"])
