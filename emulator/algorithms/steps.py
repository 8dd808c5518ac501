"""What a communication step sends: the record every algorithm yields."""

from dataclasses import dataclass

import numpy as np


@dataclass
class Messages:
    """The messages of one communication step, all sent at once.

    ``chunks`` is either a 1-D int array (message i carries chunk ``chunks[i]``) or a 2-D
    bool mask (message i carries the chunks where ``chunks[i]`` is True). ``reduce`` says
    whether the receiver combines what arrives with what it holds, or overwrites.
    ``channel`` is the NCCL channel of each message (None: all on channel 0).
    ``exclusive``: no rank sends or receives two messages in this step (which lets the
    clock time it message by message).
    """

    phase: str
    src: np.ndarray
    dst: np.ndarray
    chunks: np.ndarray
    nbytes: np.ndarray
    reduce: bool
    channel: np.ndarray = None
    exclusive: bool = False

    def channels(self):
        return np.zeros(len(self.src), dtype=np.int64) if self.channel is None else self.channel

    def chunk_mask(self, n_chunks):
        if self.chunks.ndim == 2:
            return self.chunks
        mask = np.zeros((len(self.src), n_chunks), dtype=bool)
        mask[np.arange(len(self.src)), self.chunks] = True
        return mask
