"""A recorder for collectives written by hand in the global view.

A global-view algorithm holds every rank's buffers in one list and proceeds in steps; in
each step every rank may send. ``net.exchange(messages)`` is one such step: it takes a
list of ``(src, dst, array)``, copies every payload first (all sends happen at once, so a
rank forwards what it held *before* the step), and returns the arrays in the same order.
It counts steps, messages and bytes per rank, which the lesson's checks compare with the
ring's identities.

``Network(n, tamper=(step, i))`` changes the i-th payload of that step in flight (adds
1000 to it): a check runs an algorithm twice, plain and tampered, to see that its result
really comes from the data it was delivered.
"""

import numpy as np

from ..errors import PeerError

MARK = 1000.0


class Network:
    def __init__(self, n, tamper=None):
        self.n = n
        self.steps = 0
        self.messages = []  # (step, src, dst, nbytes)
        self.bytes_sent = [0] * n
        self.bytes_received = [0] * n
        self.tamper = tamper
        self.tampered = False

    def exchange(self, messages):
        """One communication step: deliver every ``(src, dst, array)`` at once."""
        delivered = []
        for i, (src, dst, data) in enumerate(messages):
            for who, r in (("src", src), ("dst", dst)):
                if not (isinstance(r, (int, np.integer)) and 0 <= r < self.n):
                    raise PeerError(f"message {who}={r!r} is not a rank of this network (0..{self.n - 1})")
            if src == dst:
                raise PeerError(f"rank {src} sends to itself; a rank uses its own data without a message")
            arr = np.array(data, copy=True)
            if self.tamper == (self.steps, i) and arr.size:
                arr = arr + MARK
                self.tampered = True
            self.messages.append((self.steps, int(src), int(dst), arr.nbytes))
            self.bytes_sent[src] += arr.nbytes
            self.bytes_received[dst] += arr.nbytes
            delivered.append(arr)
        self.steps += 1
        return delivered
