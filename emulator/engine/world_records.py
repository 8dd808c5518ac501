"""What a run of a :class:`~emulator.engine.world.World` leaves to read: its messages
(``trace``), bytes and times per rank (``stats``), every stream's events (``timeline``,
``save_chrome_trace``) and the memory each rank held (``memory_report``)."""

from ..records.table import Table
from ..records.timeline import Event, Timeline
from ..records.trace import stats_from


class Records:
    """The records half of :class:`~emulator.engine.world.World`."""

    @property
    def trace(self):
        """Every message of the last run (a list of :class:`~emulator.records.trace.TraceRecord`)."""
        batches = self.clock.batches
        if self._trace_cache is None or self._trace_cache[0] != len(batches):
            self._trace_cache = (len(batches), [rec for b in batches for rec in b.records()])
        return self._trace_cache[1]

    def stats(self):
        """Bytes sent and received per rank (in all and by link), totals by op, simulated
        time per rank."""
        return stats_from(self.clock.batches, self.size, self.clock.final())

    def timeline(self):
        """Per-rank events on every stream (compute, comm, idle), simulated time."""
        final = self.clock.final()
        live = set(self.live)
        end = max((final[r] for r in self.live), default=0.0)
        events = [Event(*e) for e in self.clock.events if e[0] in live]
        for r in self.live:
            if self.clock.compute[r] < end:
                events.append(Event(r, "compute", "idle", "failed" if r in self.dead else "finished",
                                    self.clock.compute[r], end))
        return Timeline(events, self.size)

    def save_chrome_trace(self, path):
        return self.timeline().save_chrome_trace(path)

    def memory_report(self):
        """Per-rank current and peak bytes, in total and by kind."""
        rows = [led.summary() for led in self.memory]
        return Table(rows, byte_columns=[k for k in rows[0] if k != "rank"])
