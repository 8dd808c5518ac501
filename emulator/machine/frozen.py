"""A frozen dataclass's hash, computed once: the machine's descriptions (a device with its
measured rates, a topology, a software stack) key the clock's caches, and hashing their
tables again on every lookup costs more than the lookup saves."""

import os
from dataclasses import fields


def hash_once(self):
    """The hash the dataclass would compute (its compared fields), kept on the instance for
    this process (a copy unpickled in another process, whose strings hash otherwise,
    computes its own)."""
    pid, h = self.__dict__.get("_hash", (None, None))
    if pid != os.getpid():
        h = hash(tuple(getattr(self, f.name) for f in fields(self) if (f.compare if f.hash is None else f.hash)))
        self.__dict__["_hash"] = (os.getpid(), h)
    return h


class computed_once:
    """A property computed on first use and kept in the instance's ``__dict__``, which a
    frozen dataclass allows (``functools.cached_property`` without its lock, which in
    Python 3.11 costs more than the planner's hot paths spend on the value)."""

    def __init__(self, func):
        self.func, self.name, self.__doc__ = func, func.__name__, func.__doc__

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner=None):
        if obj is None:
            return self
        value = obj.__dict__[self.name] = self.func(obj)
        return value
