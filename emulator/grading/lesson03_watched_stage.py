"""What Exercise 3.2's check hands a student's loop: each stage watched, so that every
action must run on what the neighbouring stage's action sent, and what a failure of the
loop most likely means."""

import numpy as np

from .common import CheckFailed, one_handle_hint


class WatchedStage:
    """The stage a student's loop gets, checking what each action is given: the
    micro-batch's tokens on the first stage, and elsewhere exactly what the neighbouring
    stage's action sent (``sent``, shared by the ranks: (kind, micro-batch, virtual stage)
    -> the output that action sent)."""

    def __init__(self, stage, label, sent):
        self._stage, self._label, self._sent = stage, label, sent

    def __getattr__(self, name):
        return getattr(self._stage, name)

    def _where(self, action):
        st = self._stage
        return (f"{self._label}: rank {st.rank} ran {action} (chunk {action.chunk}, virtual stage "
                f"{st.virtual_stage(action.chunk)} of {st.p * st.v})")

    def _check_received(self, action, x):
        """``x`` must be what the action's source sent: the receive's buffer, after its wait."""
        s = self._stage.virtual_stage(action.chunk)
        source = s - 1 if action.kind == "F" else s + 1
        what = "activations" if action.kind == "F" else "output gradient"
        if x is None:
            raise CheckFailed(f"{self._where(action)} on nothing; it runs on the {what} that virtual stage {source} "
                              f"sends (stage.source(a) says which rank)")
        sent = self._sent.get((action.kind, action.microbatch, source))
        if sent is None or np.shape(x) != np.shape(sent) or not np.array_equal(x, sent):
            raise CheckFailed(
                f"{self._where(action)} on data that is not the {what} {action.kind}{action.microbatch} of virtual "
                f"stage {source} sent. The received data is in the buffer you gave P2POp(comm.irecv, buffer, peer), "
                f"and only once the batch that brings it has been waited for: wait on its handle before the action "
                f"reads the buffer (batch_isend_irecv returns one handle for the whole batch; its wait() returns "
                f"True, not the data)")

    def forward(self, action, x, y=None):
        st = self._stage
        first = st.is_first(action.chunk)
        tokens = x is not None and np.issubdtype(np.asarray(x).dtype, np.integer)
        if first and not tokens:
            raise CheckFailed(f"{self._where(action)} on {'nothing' if x is None else 'received activations'}; the "
                              f"first stage reads the micro-batch's tokens, micro_x[{action.microbatch}] "
                              f"(stage.is_first(a.chunk) says which stage that is)")
        if not first and tokens:
            raise CheckFailed(f"{self._where(action)} on the micro-batch's tokens; only the first stage reads them, "
                              f"every other stage runs on the activations it received. With interleaving rank 0 also "
                              f"holds later stages: test stage.is_first(a.chunk), not the rank")
        if not first:
            self._check_received(action, x)
        out = st.forward(action, x, y)
        if not st.is_last(action.chunk):
            self._sent[("F", action.microbatch, st.virtual_stage(action.chunk))] = np.array(out, copy=True)
        return out

    def backward(self, action, dy=None, scale=1.0):
        st = self._stage
        if not st.is_last(action.chunk):
            self._check_received(action, dy)
        out = st.backward(action, dy, scale=scale)
        if not st.is_first(action.chunk):
            self._sent[("B", action.microbatch, st.virtual_stage(action.chunk))] = np.array(out, copy=True)
        return out


def watching(loop, label):
    sent = {}

    def watched(comm, stage, steps, micro_x, micro_y):
        return loop(comm, WatchedStage(stage, label, sent), steps, micro_x, micro_y)

    return watched


def loop_hint(exc):
    """What a failure of the loop most likely means."""
    text = str(exc)
    if "issued separately" in text:
        return ("\nSeparately issued isend/irecv between two neighbours run in issue order on NCCL (one stream per "
                "pair of ranks), so each rank's send waits in front of the receive that would let the other's "
                "finish, and a cluster hangs the same way. Post each step's sends and receives together, in one "
                "comm.batch_isend_irecv([...]).")
    if "waits in batch_isend_irecv" in text:
        return ("\nEach step of the program is one batch: its sends and its receives together, posted after the "
                "step's actions, in the program's order. Batches split another way (sends apart from receives, or a "
                "receive moved to another step) leave two neighbours each waiting for a batch the other posts later.")
    return one_handle_hint(exc)
