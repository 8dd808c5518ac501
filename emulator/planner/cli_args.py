"""What the planner's command line accepts, each refused in one line that says why: sizes
with K, M or G (powers of 2), positive counts, ``name=value`` pairs built into a
:class:`ModelSpec` or :class:`ParallelDims` (naming any field it does not have or needs),
a model by preset name, Hugging Face ``config.json`` or shape."""

import argparse
import math
import os
import sys
from dataclasses import MISSING, fields

from ..errors import ConfigError
from ..parallel.dims import ParallelDims
from .hf_config import model_from_hf_config
from .models import ModelSpec, model_preset


SUFFIX = {"K": 2**10, "M": 2**20, "G": 2**30}


def size(text):
    """``16M`` -> 16 x 2**20; a plain integer as it is; anything else an error that says so."""
    t = str(text).strip().upper()
    try:
        value = float(t[:-1]) * SUFFIX[t[-1]] if t and t[-1] in SUFFIX else int(t)
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (a whole number, or one with K, M or G: 16M)")
    return int(value)


def positive_size(text):
    n = size(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return n


def positive_int(text):
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: must be at least 1")
    return n


def count_or_all(text):
    try:
        n = int(text)
    except ValueError:
        n = None
    if n is None or n < -1:
        raise argparse.ArgumentTypeError(f"{text!r}: a count of at least 0, or -1 for all")
    return n


def _value(text):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def pairs(text, what):
    out = {}
    for item in text.split(","):
        if "=" not in item:
            raise ConfigError(f"--{what}: expected name=value pairs separated by commas, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = _value(v.strip())
    return out


def built(cls, text, what):
    """`cls(**pairs)` from a --what flag's text, naming any field `cls` does not have or needs."""
    kw = pairs(text, what)
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(kw) - set(known))
    if unknown:
        raise ConfigError(f"--{what}: unknown field(s) {unknown}; {cls.__name__} takes {sorted(known)}")
    needed = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in needed if k not in kw]
    if missing:
        raise ConfigError(f"--{what}: missing {', '.join(missing)}; a {cls.__name__} needs {', '.join(needed)}")
    return cls(**kw)


def model_of(text):
    """A preset name, a path to a Hugging Face config.json, or name=value pairs."""
    if text.strip().lower().endswith(".json"):
        try:
            return model_from_hf_config(text.strip())
        except ConfigError as exc:
            raise ConfigError(f"--model {exc}") from None
    return model_preset(text) if "=" not in text else built(ModelSpec, text, "model")


def dims_of(text):
    return built(ParallelDims, text, "dims")


class Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line (and exit status 2) rather than the usage first."""

    def error(self, message):
        self.exit(2, f"{self.prog}: {message} (see --help)\n")


def program():
    """The name a person typed: ``pfs-planner`` or ``python -m emulator.planner``."""
    name = os.path.basename(sys.argv[0] if sys.argv and sys.argv[0] else "")
    return name if name.startswith("pfs-planner") else "python -m emulator.planner"
