"""The channel from a notebook's checks to the grader: signed lines in a file the grader reads.

Each line is a JSON object (``run``, ``seq``, ``kind`` and what the kind says), a tab, and
its HMAC-SHA256 under a key made for that run alone. The key reaches the kernel in a file
it deletes before any cell runs, never in the notebook, the environment or the command
line; the grader accepts a line only with the right run, the next sequence number and a
valid signature. So nothing a notebook prints is read as a result, and a line written by
anything that does not hold the key (a cell writing into the file, a process left behind
by an earlier submission) is caught as a forgery.

The key lives in the kernel's memory while the notebook runs: code that digs it out of the
interpreter can sign what it likes. What this stops is printing, wrapping and patching;
what stops a determined student is a container (see README, "Grading a class").

Standard library only: the kernel loads this file by its path, before the course's library.
"""

import hashlib
import hmac
import json
import os

KINDS = ("hello", "armed", "start", "end", "tamper", "final")


def signature(key, body):
    return hmac.new(key, body.encode(), hashlib.sha256).hexdigest()


class Writer:
    """The kernel's end: ``send(kind, **fields)`` appends one signed line, in one write."""

    def __init__(self, key, fd, run):
        self._key, self._fd, self._run, self._seq = key, fd, run, 0
        self._dumps, self._write, self._sign = json.dumps, os.write, signature  # bound now, before any cell

    def send(self, kind, **fields):
        self._seq += 1
        body = self._dumps(dict(fields, run=self._run, seq=self._seq, kind=kind), sort_keys=True)
        self._write(self._fd, (body + "\t" + self._sign(self._key, body) + "\n").encode())


class Reader:
    """The grader's end: ``read()`` returns the lines added since the last call, checked,
    and adds what is wrong with any of them to ``problems``."""

    def __init__(self, path, key, run):
        self.path, self._key, self._run = path, key, run
        self._offset, self._seq, self.problems = 0, 0, []

    def read(self, final=False):
        """The messages completed since the last call; ``final``: the kernel has ended, so
        a line without its end is a problem too (one cut by a dying kernel is not)."""
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError as exc:
            self.problems.append(f"the results file could not be read: {exc}")
            return []
        end = data.rfind(b"\n") + 1
        self._offset += end
        messages = []
        for raw in data[:end].splitlines():
            message = self._check(raw)
            if message is not None:
                messages.append(message)
        return messages

    def _check(self, raw):
        line = raw.decode("utf-8", "replace")
        body, _, mac = line.rpartition("\t")
        if not body or not hmac.compare_digest(signature(self._key, body), mac):
            self.problems.append(f"a result line not signed by the grader's checks: {line[:120]!r}")
            return None
        message = json.loads(body)
        if message.get("run") != self._run or message.get("kind") not in KINDS:
            self.problems.append(f"a result line of another run or kind: {line[:120]!r}")
            return None
        if message.get("seq") != self._seq + 1:
            self.problems.append(f"results out of order: number {message.get('seq')} after {self._seq}")
        self._seq = message.get("seq", self._seq)
        return message
