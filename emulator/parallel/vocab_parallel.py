"""Vocabulary parallelism; it lives in :mod:`emulator.parallel.tensor_parallel.vocab`."""

from .tensor_parallel.vocab import (vocab_parallel_cross_entropy, vocab_parallel_embedding,
                                    vocab_parallel_embedding_backward, vocab_parallel_lookup, vocab_range)

__all__ = ["vocab_range", "vocab_parallel_lookup", "vocab_parallel_embedding", "vocab_parallel_embedding_backward",
           "vocab_parallel_cross_entropy"]
