"""Lab 06's calls beside the emulator's run of the same plan, axis by axis.

:func:`emulator_calls` runs the plan on the emulator (``run_on_mesh``) and names its
groups as the lab's mesh does; :func:`compare` sets one rank's calls beside them and says
what must agree (the pipeline's transfers, the data axis's gradient bytes) and what is
wrong; :func:`tensor_axis_note` says why the tensor axis differs by design.
"""

from collections import Counter

from emulator.parallel import run_on_mesh
from emulator.records.calls import Call


def emulator_calls(gpt, params, batch, dims, optimizer):
    """Every rank's calls in the emulator's run of ``dims`` on the same model (``gpt``,
    an ``emulator.nn.GPT``, with ``params``), batch and optimizer."""
    run = run_on_mesh(gpt, params, [batch], dims, optimizer)
    axis = {"dp,cp": "dp"}  # without context parallelism, dense gradients reduce over the dp group itself
    return [[Call(c.op, axis.get(c.group, c.group), c.nbytes, c.peer) for c in per_rank] for per_rank in
            run.world.calls]


def by_axis(calls):
    """{(axis, op): [calls, bytes]} of one rank's calls."""
    out = {}
    for c in calls:
        row = out.setdefault((c.group, c.op), [0, 0])
        row[0] += 1
        row[1] += c.nbytes
    return out


def compare(lab, emu, item, units, blocks, m):
    """Axis by axis, one rank's calls beside the emulator's (its bytes scaled to the lab's
    dtype). Returns (lines to print, what is wrong):

    * ``pp``: the pipeline's sends and receives must be the emulator's, call for call;
    * ``dp``: FSDP2 reduce-scatters each of its ``units`` (a unit per block, and one for
      the rest: the embedding, the output layer) once per step, its gradients accumulated
      unsharded over the ``m`` micro-batches; the emulator's ZeRO-3 reduce-scatters each
      layer every micro-batch (it keeps no full gradient). A step's gradients must be the
      emulator's bytes over ``m``, within 10% (each pads its shards its own way). Without a
      pipeline FSDP2 gathers each unit before forward and each block again before backward
      (the root stays gathered in between): ``units + blocks`` all-gathers; under torch's
      pipeline it keeps a unit gathered across micro-batches once its backward has run, so
      fewer than the emulator, which gathers before every pass;
    * ``tp``: printed, not compared (the two differ by design: :func:`tensor_axis_note`)."""
    mine, theirs = by_axis(lab), {k: [v[0], v[1] * item // 8] for k, v in by_axis(emu).items()}
    lines, bad = [], []
    for key in sorted(set(mine) | set(theirs)):
        a, b = mine.get(key, [0, 0]), theirs.get(key, [0, 0])
        lines.append(f"  {key[0]:6s} {key[1]:15s} lab {a[0]:4d} calls {a[1]:>10,d} B | emulator {b[0]:4d} calls "
                     f"{b[1]:>10,d} B")
    p2p_lab = sorted((c.op, c.nbytes, -1 if c.peer is None else c.peer) for c in lab if c.group == "pp")
    p2p_emu = sorted((c.op, c.nbytes * item // 8, -1 if c.peer is None else c.peer) for c in emu if c.group == "pp")
    if p2p_lab != p2p_emu:
        bad.append(f"the pipeline's sends and receives are not the emulator's: lab {len(p2p_lab)} "
                   f"({sum(x[1] for x in p2p_lab)} B), emulator {len(p2p_emu)} ({sum(x[1] for x in p2p_emu)} B)")
    if not units:
        return lines, bad
    ag, rs = mine.get(("dp", "all_gather"), [0, 0]), mine.get(("dp", "reduce_scatter"), [0, 0])
    emu_ag, emu_rs = theirs.get(("dp", "all_gather"), [0, 0]), theirs.get(("dp", "reduce_scatter"), [0, 0])
    if rs[0] != units:
        bad.append(f"FSDP2 should reduce-scatter each of its {units} units once per step; it made {rs[0]} "
                   f"reduce-scatters on dp")
    if abs(rs[1] - emu_rs[1] / m) > 0.1 * emu_rs[1] / m:
        bad.append(f"a step's gradients reduce-scattered on dp are {rs[1]} B, the emulator's {emu_rs[1] / m:.0f} B "
                   f"per micro-batch")
    if (m == 1 and ag[0] != units + blocks) or (m > 1 and not units <= ag[0] <= emu_ag[0]):
        bad.append(f"FSDP2 made {ag[0]} all-gathers on dp; expected {units + blocks} (its {units} units before "
                   f"forward, its {blocks} blocks before backward)" if m == 1 else
                   f"FSDP2 made {ag[0]} all-gathers on dp; expected at least its {units} units and at most the "
                   f"emulator's {emu_ag[0]}")
    return lines, bad


def tensor_axis_note(lab, emu):
    """A line on rank 0's tensor-axis calls, the lab's beside the emulator's, and why they differ."""
    tp_lab = Counter(c.op for c in lab if c.group == "tp")
    tp_emu = Counter(c.op for c in emu if c.group == "tp")
    return (f"tp: the lab makes {tp_lab['all_gather']} all-gathers and {tp_lab['reduce_scatter']} reduce-scatters, "
            f"the emulator {tp_emu['all_gather']} and {tp_emu['reduce_scatter']}: DTensor's autograd keeps each "
            f"gathered input for the weight gradient where the emulator, as Megatron, gathers it again; the "
            f"emulator's embedding and output layer are split by vocabulary over tp, the lab's whole on every tp rank")
