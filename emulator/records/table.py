"""A list of rows that prints as an aligned text table (small, deterministic outputs)."""


def human_bytes(n):
    n = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1000


class Table(list):
    """Rows (dicts with the same keys). ``repr`` is an aligned table; byte columns are
    shown in decimal units (1 GB = 1e9 bytes, as the course's formulas use)."""

    def __init__(self, rows, byte_columns=()):
        super().__init__(rows)
        self.byte_columns = set(byte_columns)

    def column(self, key):
        return [row[key] for row in self]

    def _cell(self, key, value):
        if key in self.byte_columns:
            return human_bytes(value)
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value)

    def __repr__(self):
        if not self:
            return "(empty table)"
        keys = list(self[0])
        cells = [[self._cell(k, row[k]) for k in keys] for row in self]
        widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
        lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
        lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
        return "\n".join(lines)

    __str__ = __repr__
