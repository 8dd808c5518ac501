"""Torch pieces the GPU labs share: data parallelism written by hand (``data_parallel``),
the same algorithms as ``emulator.parallel`` on ``torch.distributed``."""
