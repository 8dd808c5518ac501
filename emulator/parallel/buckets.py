"""Moved: gradient buckets live in :mod:`emulator.parallel.data_parallel.buckets`."""

from .data_parallel.buckets import bucket_layers, bucket_limit
