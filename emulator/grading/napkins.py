"""Napkin answers graded as functions: called with the problem's own numbers and with others,
so a hard-coded number fails."""

from .common import check_close, expect
from .refuse import refusing


def variants(name, fn, cases, model, unit, labels, library=(), rel=0.02):
    """A napkin answer called with the problem's own numbers (its defaults) and with the
    other ``cases``; each of its numbers compared with ``model(**case)``. The library's
    ``library`` functions refuse while it runs. Returns the model's answer to the first."""
    for i, case in enumerate(cases):
        with refusing(name, *library):
            got = fn() if i == 0 else fn(**case)
        want = model(**case)
        expect(isinstance(got, tuple) and len(got) == len(want), f"{name}: return {len(want)} numbers: "
                                                                 f"{', '.join(labels)}")
        args = ", ".join(f"{k}={v:g}" for k, v in case.items())
        for label, g, w in zip(labels, got, want):
            check_close(f"{name} ({label}, {args})", g, w, rel=rel, unit=unit, quiet=True)
    return model(**cases[0])
