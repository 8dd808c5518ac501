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
