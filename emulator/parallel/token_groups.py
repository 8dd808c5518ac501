"""Moved: :mod:`emulator.parallel.expert_parallel.token_groups` holds :class:`TokenGroup`."""

from .expert_parallel.token_groups import TokenGroup  # noqa: F401
