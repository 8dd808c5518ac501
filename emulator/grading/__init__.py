"""Checks that lesson notebooks call after each exercise.

A check runs the student's code on random cases against a reference and either prints
one line saying what passed, or raises :class:`CheckFailed` saying what differs; an
exercise not yet attempted says so (:mod:`.progress`). The checks live here, not in the
notebooks, so every lesson grades the same way. Every check of the lesson modules
(``lessonNN``) reports its outcome to :mod:`.progress`, whose :func:`summary` closes each
lesson: they are wrapped here, once, when the package is imported.
"""

import importlib
import pkgutil
import re

from . import progress
from .common import CheckFailed, check_close, passed
from .progress import NotAllPassed, summary

# a lesson's module is ``lessonNN``; the modules it draws on (``lesson04_ring``) are not wrapped
LESSON_MODULES = sorted(m.name for m in pkgutil.iter_modules(__path__) if re.fullmatch(r"lesson\d+", m.name))
for _name in LESSON_MODULES:
    progress.watch(importlib.import_module(f"{__name__}.{_name}"))

__all__ = ["CheckFailed", "NotAllPassed", "check_close", "passed", "summary"]
