"""Lesson 03's Exercise 3.2 check (a stage's loop over the schedule's batches of
point-to-point calls) rejects plausible wrong loops, naming the ranks and the handle, and
accepts other correct ones."""

import numpy as np
import pytest

from emulator import P2POp
from emulator.grading import CheckFailed
from emulator.grading import lesson03 as g
from emulator.parallel import pipeline as pp
from emulator.parallel.pipeline import blocking_loop


# ----------------------------------------------------------------- Exercise 3.2
def _compute(stage, a, inbound, micro_x, micro_y, scale=True, first_by_rank=False):
    first = stage.rank == 0 if first_by_rank else stage.is_first(a.chunk)
    if a.kind == "F":
        return stage.forward(a, micro_x[a.microbatch] if first else inbound, micro_y[a.microbatch])
    if a.kind == "B":
        return stage.backward(a, inbound, scale=1 / len(micro_x) if scale else 1.0)
    stage.backward_weight(a)
    return None


def loop_variant(free=True, scale=True, frees_at_end=False, first_by_rank=False, eager=False, wait=True,
                 split="no", per_op_handles=False):
    """The program's loop, with one thing changed. ``eager``: wait for each batch right
    after posting it (as torch's pipeline runtime does: also right); ``wait=False``: read a
    receive's buffer without waiting for its batch; ``split``: post a step's sends and
    receives in two batches ("sends first" or "receives first"); ``per_op_handles``: one
    handle per operation read from the batch's list, as if it held one per op."""
    def loop(comm, stage, steps, micro_x, micro_y):
        shape, dtype = stage.boundary(micro_x[0])
        arriving, works, done = {}, [], []
        for step in steps:
            out = {}
            for a in step.actions:
                inbound = None
                if a in arriving:
                    buffer, batch, i = arriving.pop(a)
                    if per_op_handles:  # the handle of its receive, as if there were one per op
                        batch[i].wait()
                    elif wait:
                        for work in batch:
                            work.wait()
                    inbound = buffer
                out[a] = _compute(stage, a, inbound, micro_x, micro_y, scale, first_by_rank)
                if stage.finishes_backward(a):
                    done.append(a)
                    if free and not frees_at_end:
                        stage.free(a)
            buffers = {a: np.empty(shape, dtype) for a in step.receives}
            sends = [P2POp(comm.isend, out[a], stage.destination(a)[0]) for a in step.sends]
            recvs = [P2POp(comm.irecv, buffers[a], stage.source(a)[0]) for a in step.receives]
            groups = [sends + recvs] if split == "no" else [sends, recvs] if split == "sends first" else [recvs, sends]
            for ops in groups:
                if not ops:
                    continue
                batch = comm.batch_isend_irecv(ops)
                works += batch
                if eager:
                    for work in batch:
                        work.wait()
                if ops is not sends:
                    at = len(ops) - len(recvs)
                    arriving.update({a: (buffers[a], batch, at + i) for i, a in enumerate(step.receives)})
        if wait:
            for work in works:
                work.wait()
        if frees_at_end:
            for a in done:
                stage.free(a)
        return stage.losses

    return loop


def unbatched_loop(comm, stage, steps, micro_x, micro_y):
    """The program's sends and receives issued one by one (isend, irecv): between two
    neighbours they run in issue order (one NCCL stream per pair), so under 1F1B each
    one's send waits in front of the receive that would let the other's complete: a hang
    on a cluster."""
    shape, dtype = stage.boundary(micro_x[0])
    arriving, works = {}, []
    for step in steps:
        out = {}
        for a in step.actions:
            inbound = None
            if a in arriving:
                buffer, work = arriving.pop(a)
                work.wait()
                inbound = buffer
            out[a] = _compute(stage, a, inbound, micro_x, micro_y)
            if stage.finishes_backward(a):
                stage.free(a)
        works += [comm.isend(out[a], stage.destination(a)[0]) for a in step.sends]
        for a in step.receives:
            buffer = np.empty(shape, dtype)
            arriving[a] = (buffer, comm.irecv(buffer, stage.source(a)[0]))
    for w in works:
        w.wait()
    return stage.losses


def next_action_loop(comm, stage, steps, micro_x, micro_y):
    """The pairing a rank can make alone (the previous key): each receive in one batch with
    the sends of the action before it, waited for whole. Right for GPipe, 1F1B and ZB-H1;
    under interleaved 1F1B with m = 2p two neighbours wait for each other's later batch."""
    actions = [a for step in steps for a in step.actions]
    shape, dtype = stage.boundary(micro_x[0])
    pending, works = [], []
    for a in actions:
        src = stage.source(a)
        buffer = np.empty(shape, dtype) if src else None
        ops = pending + ([P2POp(comm.irecv, buffer, src[0])] if src else [])
        batch = comm.batch_isend_irecv(ops) if ops else []
        works += batch
        for work in batch if src else ():
            work.wait()
        out = _compute(stage, a, buffer, micro_x, micro_y)
        if stage.finishes_backward(a):
            stage.free(a)
        dst = stage.destination(a)
        pending = [P2POp(comm.isend, out, dst[0])] if dst else []
    works += comm.batch_isend_irecv(pending) if pending else []
    for w in works:
        w.wait()
    return stage.losses


def test_stage_loop_check(capsys):
    g.check_stage_loop(loop_variant(eager=True))  # each batch waited for at once, as torch's runtime: also right
    assert "PASSED Exercise 3.2" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="still holds"):
        g.check_stage_loop(loop_variant(free=False))
    with pytest.raises(CheckFailed, match="at its peak"):
        g.check_stage_loop(loop_variant(frees_at_end=True))
    with pytest.raises(CheckFailed, match="gradient of"):
        g.check_stage_loop(loop_variant(scale=False))  # the sum over micro-batches, not the mean


def test_stage_loop_check_accepts_the_key():
    g.check_stage_loop(loop_variant())


def test_stage_loop_check_rejects_reading_a_buffer_before_its_batch_is_waited_for():
    with pytest.raises(CheckFailed, match=r"gpipe p=2 m=3: rank \d ran [FB]0 \(chunk 0, virtual stage \d of 2\) on "
                                          r"data that is not the (activations|output gradient) [FB]0 of virtual stage "
                                          r"\d sent(.|\n)*only once the batch that brings it has been waited for"):
        g.check_stage_loop(loop_variant(wait=False))


def test_stage_loop_check_names_the_one_handle_of_a_batch():
    """Reading the batch's list as one handle per operation, as before on the emulator:
    on NCCL there is one."""
    with pytest.raises(CheckFailed, match=r"IndexError(.|\n)*returns a list holding one handle for the whole batch"):
        g.check_stage_loop(loop_variant(per_op_handles=True))


@pytest.mark.parametrize("split", ["sends first", "receives first"])
def test_stage_loop_check_rejects_sends_and_receives_in_separate_batches(split):
    """Two neighbours that exchange in the same step each wait, in their first batch,
    for what the other posts in its second: a hang on NCCL."""
    with pytest.raises(CheckFailed) as err:
        g.check_stage_loop(loop_variant(split=split))
    text = str(err.value)
    assert "1f1b p=4 m=8: the loop failed on the emulator" in text and "deadlock" in text
    assert "waits in batch_isend_irecv" in text and "Each step of the program is one batch" in text


def test_stage_loop_check_rejects_separately_issued_sends_and_receives_naming_the_ranks():
    with pytest.raises(CheckFailed) as err:
        g.check_stage_loop(unbatched_loop)
    text = str(err.value)
    assert "1f1b p=4 m=8: the loop failed" in text
    assert "rank 2 waits in recv(src=3) #1 on group world: it was issued separately after its own send(dst=3)" in text
    assert "one comm.batch_isend_irecv" in text


def test_pairing_each_receive_with_the_previous_sends_hangs_interleaving():
    with pytest.raises(CheckFailed, match=r"interleaved_1f1b p=2 m=4 v=2: the loop failed(.|\n)*waits in "
                                          r"batch_isend_irecv(.|\n)*Each step of the program is one batch"):
        g.check_stage_loop(next_action_loop)


def test_stage_loop_check_names_the_first_stage_when_the_loop_tests_the_rank():
    """rank == 0 is the first stage only without interleaving: rank 0's chunk 1 is stage p."""
    with pytest.raises(CheckFailed, match=r"interleaved_1f1b p=2 m=4 v=2: rank 0 ran F0.1 \(chunk 1, virtual stage 2 "
                                          r"of 4\) on the micro-batch's tokens(.|\n)*stage.is_first\(a.chunk\), "
                                          r"not the rank"):
        g.check_stage_loop(loop_variant(first_by_rank=True))


def test_stage_loop_check_reports_a_deadlock_and_refuses_the_library():
    with pytest.raises(CheckFailed, match=r"1f1b p=4 m=8: the loop failed(.|\n)*deadlock(.|\n)*its next action"):
        g.check_stage_loop(blocking_loop)  # right for GPipe, deadlocks under 1F1B
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_stage_loop(pp.run_actions)
