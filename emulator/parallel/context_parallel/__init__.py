"""Context parallelism: the sequence split over a group of ranks.

* :mod:`.layout`: ``split_sequence`` / ``gather_sequence`` (contiguous or zigzag);
* :mod:`.online_softmax`: attention one block of keys at a time;
* :mod:`.ring`: ``ring_attention`` and ``ring_attention_backward`` (K/V around a ring);
* :mod:`.ulysses`: the all-to-all between sequence shards and head shards (DeepSpeed
  Ulysses), which ``ulysses_attention`` and the block's Ulysses core both run;
* :mod:`.alternatives`: K/V all-gathered (Llama 3's long-context stage) and Ulysses.
"""

from .alternatives import all_gather_attention, ulysses_attention
from .layout import LAYOUTS, chunks_of, gather_sequence, positions, split_sequence
from .online_softmax import OnlineSoftmax, blockwise_attention
from .ring import blocks, ring_attention, ring_attention_backward, ring_plan
from .ulysses import to_head_shards, to_sequence_shards

__all__ = ["all_gather_attention", "ulysses_attention", "LAYOUTS", "chunks_of", "gather_sequence", "positions",
           "split_sequence", "OnlineSoftmax", "blockwise_attention", "blocks", "ring_attention",
           "ring_attention_backward", "ring_plan", "to_head_shards", "to_sequence_shards"]
