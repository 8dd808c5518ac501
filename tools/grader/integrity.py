"""What a submission must not change while it is graded: the functions the checks run.

``Baseline(prefixes)`` records, before the first cell, every module whose name is one of
``prefixes`` or below one (the course's library, NumPy, the modules the results channel
uses, ``builtins``): which module ``sys.modules`` holds under each name, and every
function, class and module each one holds, with each function's code, defaults and the
functions its closure holds (how a check's wrapper holds the check), and the methods of
the course's own classes. ``changes()`` lists what differs now, in words:
``emulator.grading.lesson00.check_ring_reduce_scatter: its code was replaced``.

A module first imported later is recorded when first seen. Data (numbers, arrays, dicts)
is not compared: lessons change the library's settings and caches as they run. While a
check runs, ``emulator.grading.refuse`` swaps the library's solutions itself and restores
them before the check ends; the comparison is made when no check is running.

Standard library only: the kernel loads this file by its path.
"""

import builtins
import sys
import types

FUNCTION_PARTS = ("__code__", "__defaults__", "__kwdefaults__")
SKIP_BUILTINS = {"input", "raw_input", "getpass", "exit", "quit", "help", "copyright", "credits", "license",
                 "display", "get_ipython", "_", "__", "___"}  # rebound by IPython around each cell


def _watched(value):
    return isinstance(value, (types.ModuleType, type)) or callable(value)


def _closure_functions(fn):
    return tuple(c.cell_contents for c in fn.__closure__ or () if _has(c) and callable(c.cell_contents))


def _has(cell):
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def _parts(fn, depth=2):
    """What a function is made of, for comparison by identity: its code and defaults, and
    the functions its closure holds with theirs (a check's wrapper holds the check)."""
    parts = tuple(getattr(fn, part, None) for part in FUNCTION_PARTS)
    for inner in _closure_functions(fn):
        parts += (inner,)
        if depth and isinstance(inner, types.FunctionType):
            parts += _parts(inner, depth - 1)
    return parts


CHANGED = {"__code__": "its code was replaced", "__defaults__": "its defaults were changed",
           "__kwdefaults__": "its keyword defaults were changed",
           None: "the function it wraps, or that function's code, was replaced"}


def _describe(where, old_parts, new_parts):
    for index, (old, new) in enumerate(zip(old_parts, new_parts)):
        if old is not new:
            part = FUNCTION_PARTS[index] if index < len(FUNCTION_PARTS) else None
            return f"{where}: {CHANGED[part]}"
    return f"{where}: what it wraps changed"


class Baseline:
    def __init__(self, prefixes, own=("emulator",)):
        self.prefixes, self.own = tuple(prefixes), tuple(own)
        self.modules, self.entries = {}, {}
        self.refresh()

    def _matches(self, name, prefixes):
        return any(name == p or name.startswith(p + ".") for p in prefixes)

    def refresh(self):
        """Record the modules not seen before."""
        for name, module in list(sys.modules.items()):
            if name not in self.modules and isinstance(module, types.ModuleType) and self._matches(name, self.prefixes):
                self.modules[name] = module
                self._record(name, module)

    def _record(self, name, module):
        own = self._matches(name, self.own)
        for attr, value in list(vars(module).items()):
            if module is builtins and attr in SKIP_BUILTINS or not _watched(value):
                continue
            self.entries[(name, attr)] = (value, _parts(value) if isinstance(value, types.FunctionType) else ())
            if own and isinstance(value, type) and getattr(value, "__module__", "") == name:
                for method, fn in list(vars(value).items()):
                    if isinstance(fn, types.FunctionType):
                        self.entries[(f"{name}.{attr}", method)] = (fn, _parts(fn))

    def changes(self):
        """What differs from the baseline, one line each (empty: nothing)."""
        found = []
        for name, module in self.modules.items():
            if sys.modules.get(name) is not module:
                found.append(f"sys.modules[{name!r}]: the module was replaced or removed")
        for (owner, attr), (value, parts) in self.entries.items():
            holder = self.modules.get(owner)
            if holder is None:  # a class's method: its class is recorded under its module
                module_name, _, cls_name = owner.rpartition(".")
                holder = getattr(self.modules.get(module_name), cls_name, None)
            where = f"{owner}.{attr}"
            now = getattr(holder, "__dict__", {}).get(attr, _MISSING) if holder is not None else _MISSING
            if now is not value:
                found.append(f"{where}: {'removed' if now is _MISSING else 'replaced'}")
            elif parts:
                current = _parts(now)
                if len(current) != len(parts) or any(a is not b for a, b in zip(current, parts)):
                    found.append(_describe(where, parts, current))
        self.refresh()
        return found


_MISSING = object()
