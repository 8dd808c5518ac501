"""Checks that lesson notebooks call after each exercise.

A check runs the student's code on random cases against a reference and either prints
one line saying what passed, or raises :class:`CheckFailed` saying what differs. The
checks live here, not in the notebooks, so every lesson grades the same way."""

from .common import CheckFailed, check_close, passed

__all__ = ["CheckFailed", "check_close", "passed"]
