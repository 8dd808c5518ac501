"""Lesson 03 on real hardware: a 1F1B pipeline by hand over point-to-point calls, against
one process and against torch.distributed.pipelining.

    torchrun --standalone --nproc-per-node P -m gpu_labs.03_pipeline

P ranks are P pipeline stages of the course GPT (the emulator's parameters, 2P blocks):

* by hand (``gpu_labs/torch_parallel/pipeline.py``): the schedule comes from
  ``emulator.parallel.pipeline.schedule("1f1b", P, m)``; each rank runs its program
  (``pipeline.program``): its actions, each step followed by one ``batch_isend_irecv``
  of what it sends and receives then, each batch waited for before the action that reads
  it, as the lesson's executor does. Loss and every gradient must equal one process running the whole model (exits
  non-zero naming the rank and tensor otherwise). Its calls go to
  ``--out``/03_pipeline.calls.json (the format of ``emulator.records.calls``); a test checks they
  are the calls the emulator's executor makes.
* with ``torch.distributed.pipelining``: a ``PipelineStage`` per rank under
  ``ScheduleGPipe`` and ``Schedule1F1B``, and two stages per rank under
  ``ScheduleInterleaved1F1B``; each must agree with the single process too, and the
  point-to-point calls each makes in a step (recorded at the dispatcher) must be those
  the emulator's executor makes for the same schedule.

Every check compares every gradient: a stage that produced none, or a rank whose
gradients are missing, fails the lab.

Last, the bubble: the hand-written 1F1B is timed action by action (CUDA events on GPUs,
read after the step, so the timing never stalls the host) over ``--steps`` steps. Each
step sits between two all-reduces of one number, which end together on every rank, so
every rank's step time is measured from the same instant to the same instant without
comparing clocks; the cost of the closing all-reduce, timed alone, is taken off. The
median step's idle share is printed beside the emulator run with the same measured
stage times, and beside the formula (p-1)/(m+p-1). NCCL on GPUs, gloo on the CPU
(``--backend`` overrides); ``--dtype bfloat16`` runs the stages in bf16.
"""

if not __package__:  # started by its path: its imports are relative to the gpu_labs package
    raise SystemExit(f"start {__file__.rsplit('/', 1)[-1]} as a module, from the course's folder: "
                     f"torchrun --standalone --nproc-per-node 4 -m gpu_labs.{__file__.rsplit('/', 1)[-1][:-3]}")

import inspect
import os
import statistics

import numpy as np
import torch
import torch.distributed as dist

from .call_trace import Recorder, Recording
from .checks import expect_match, expect_same_calls, gather_calls
from .common import (TORCH_VERSION, add_dtype_option, base_parser, dtype_name, fail, fail_everywhere, finish, header, init, lab_dtype,
                    reference_dtype, say, timed)
from .torch_parallel.pipeline import Clock, Executor, GPTStage, loss_fn

from emulator import Topology, World, nn
from emulator.accounting import pipeline_bubble
from emulator.nn import torch_reference as R
from emulator.parallel import pipeline as pp
from emulator.records.calls import Call

V, D, H, FF, S = 32, 32, 4, 64, 16
TORCH_SCHEDULES = {"gpipe": ("ScheduleGPipe", "gpipe", 1), "1f1b": ("Schedule1F1B", "1f1b", 1),
                   "interleaved": ("ScheduleInterleaved1F1B", "interleaved_1f1b", 2)}


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--micro-batches", type=int, default=0, help="m (default 2P)")
    ap.add_argument("--steps", type=int, default=5, help="timed steps of the hand-written 1F1B (the median is kept)")
    ap.add_argument("--width", type=int, default=0, help="d_model of the timed model (default 32 on CPU, 1024 on "
                                                         "GPU, with sequences of 1024)")
    ap.add_argument("--self-test-fault", choices=["drop-gradient", "wrong-gradient", "drop-call"],
                    help="damage one piece of the hand-written 1F1B's result on the last rank, to prove a check "
                         "catches it")
    return ap.parse_args()


def model_and_data(p, m, d, seq):
    model = nn.GPT(vocab=V, d_model=d, n_heads=H, d_ff=2 * d, n_layers=2 * p, max_seq=seq, dtype=np.float64)
    params = model.init(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x = rng.integers(0, V, (2 * m, seq))
    return model, params, x, np.roll(x, -1, axis=1)


def reference(params, x, y, n_layers, device, dtype):
    """Loss and gradients of the whole model in one process."""
    p = {k: torch.tensor(v, device=device, dtype=dtype, requires_grad=True) for k, v in params.items()}
    loss = loss_fn(R.gpt(p, torch.tensor(x, device=device), n_layers, H), torch.tensor(y, device=device))
    loss.backward()
    return loss.item(), {k: v.grad.detach() for k, v in p.items()}


def check_run(name, rank, p, chunks, ref, losses, ref_loss, tol):
    """Every gradient this rank holds against one process; every rank together must hold
    every gradient of the model; the last rank's mean loss against one process's."""
    got = {k: g for c in chunks.values() for k, g in c.grads().items()}
    want = {k: ref[k] for k in got}
    expect_match(f"{name}: the gradients", got, want, tol, rank)
    held = [None] * p
    dist.all_gather_object(held, sorted(got))
    missing = sorted(set(ref) - {k for keys in held for k in keys})
    fail_everywhere(f"{name}: no rank holds the gradient of {', '.join(missing[:4])}", bool(missing))
    if rank == p - 1:
        if not losses:
            fail(f"{name}: the last stage produced no loss")
        if abs(float(np.mean(losses)) - ref_loss) > tol * max(1.0, abs(ref_loss)):
            fail(f"{name}: the loss {np.mean(losses):.6f} on the last stage differs from one process's {ref_loss:.6f}")


def chunks_of(model, params, p, v, rank, device, dtype):
    runs = pp.split_layers(model, p * v)
    return {c: GPTStage(params, runs[c * p + rank], H, device, dtype) for c in range(v)}


def emulator_calls(kind, p, m, v, item):
    """The point-to-point calls of the emulator's executor running the schedule ``kind``
    on the lab's model and batch, with the lab's element size."""
    model, params, x, y = model_and_data(p, m, D, S)
    world = World(p)
    pp.run(world, nn.GPT(vocab=V, d_model=D, n_heads=H, d_ff=2 * D, n_layers=2 * p, max_seq=S, dtype=np.float32),
           {k: a.astype(np.float32) for k, a in params.items()}, pp.schedule(kind, p, m, v=v), x, y)
    return [[Call(c.op, c.group, c.nbytes // 4 * item, c.peer) for c in per_rank] for per_rank in world.calls]


def torch_pipelining(kind, p, m, rank, device, dtype):
    """torch's own schedule ``kind`` on the lab's model: one step to warm up (torch may
    exchange shapes first), then a recorded step. Returns (chunks, losses or None, this
    rank's calls in the recorded step)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    v = TORCH_SCHEDULES[kind][2]
    model, params, x, y = model_and_data(p, m, D, S)
    chunks = chunks_of(model, params, p, v, rank, device, dtype)
    xt, yt = torch.tensor(x, device=device), torch.tensor(y, device=device)
    micro = len(x) // m
    if inspect.signature(PipelineStage.__init__).parameters["input_args"].default is inspect.Parameter.empty:
        # torch 2.4 wants every stage's input and output shapes up front (later releases find them)
        def shapes_of(s):
            inp = xt[:micro] if s == 0 else torch.zeros(micro, S, D, device=device, dtype=dtype)
            out = torch.zeros(micro, S, V if s == p * v - 1 else D, device=device, dtype=dtype, requires_grad=True)
            return {"input_args": (inp,), "output_args": (out,)}
    else:
        def shapes_of(s):
            return {}
    stages = [PipelineStage(chunks[c], c * p + rank, p * v, device, **shapes_of(c * p + rank)) for c in range(v)]
    # torch 2.4 and 2.5 sum the micro-batches' losses' gradients, later releases divide by m
    # unless told not to (scale_grads): the loss is divided here, the same on every release
    cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved": ScheduleInterleaved1F1B}[kind]
    scale = {"scale_grads": False} if "scale_grads" in inspect.signature(cls.__init__).parameters else {}
    schedule = cls(stages if kind == "interleaved" else stages[0], m, loss_fn=lambda o, t: loss_fn(o, t) / m, **scale)

    def step():
        for c in chunks.values():
            c.zero_grad(set_to_none=True)
        losses = []
        if rank == 0:
            schedule.step(xt, target=yt if p == 1 else None, losses=losses)
        elif rank == p - 1:
            schedule.step(target=yt, losses=losses)
        else:
            schedule.step()
        return losses

    step()
    with Recording() as rec:
        losses = step()
    return chunks, ([m * float(l.detach()) for l in losses] if losses else None), rec.calls


def same_messages(mine, theirs):
    """Point-to-point calls compared as each rank's set of messages (torch posts a step's
    sends and receives in its own order)."""
    key = lambda c: (c.op, c.peer, c.nbytes)  # noqa: E731
    return [sorted(per_rank, key=key) for per_rank in mine], [sorted(per_rank, key=key) for per_rank in theirs]


def measure_bubble(args, p, m, rank, device, dtype, schedule):
    """The hand-written 1F1B timed action by action on a larger model (module docstring)."""
    width = args.width or (1024 if device.type == "cuda" else D)
    seq = 1024 if device.type == "cuda" else S
    big, big_params, bx, by = model_and_data(p, m, width, seq)
    chunks = chunks_of(big, big_params, p, 1, rank, device, dtype)
    bxt, byt = list(torch.tensor(bx, device=device).chunk(m)), list(torch.tensor(by, device=device).chunk(m))
    one = torch.zeros(1, device=device)
    closing = timed(lambda: dist.all_reduce(one), device, iters=20)  # the bracket's own cost
    steps = []
    for i in range(args.steps + 1):  # the first step warms up
        ex = Executor(chunks, p, rank, Recorder(), (len(bx) // m, seq, width), device, dtype)
        dist.all_reduce(one)
        clock = Clock(device)
        ex.step(pp.program(schedule)[rank], bxt, byt, clock=clock)
        dist.all_reduce(one)
        end = clock.mark()
        for c in chunks.values():
            c.zero_grad(set_to_none=True)
        *events, (_, _, t_end) = clock.resolve(ex.events + [("end", end, end)])
        if i:
            steps.append((events, t_end - closing))
    every = [None] * p
    dist.all_gather_object(every, steps)
    if rank != 0:
        return
    bubbles = [1 - sum(e - s for evs, _ in per_step for _, s, e in evs) / sum(span for _, span in per_step)
               for per_step in zip(*every)]
    k = bubbles.index(statistics.median_low(bubbles))
    at = [every[r][k] for r in range(p)]
    t_f = float(np.mean([e - s for evs, _ in at for kind, s, e in evs if kind == "F"]))
    t_b = float(np.mean([e - s for evs, _ in at for kind, s, e in evs if kind == "B"]))
    # the emulator plays the same schedule with these stage times (the small model: only the times matter)
    model, params, x, y = model_and_data(p, m, D, S)
    run = pp.run(World(p, topology=Topology.free_network()), model, params, schedule, x, y,
                 costs=(t_f, t_b / 2, t_b / 2))
    print(f"bubble of 1F1B by hand (d={width}, s={seq}, median of {len(bubbles)} steps, mean F {t_f * 1e3:.2f} ms, "
          f"B {t_b * 1e3:.2f} ms): measured {bubbles[k]:.1%} | emulator with these stage times {run.bubble:.1%} | "
          f"formula (p-1)/(m+p-1) {pipeline_bubble(p, m):.1%} (what the measurement has more of is the time the "
          f"messages and their synchronisation take)", flush=True)


def main():
    args = parse()
    rank, p, device = init(args.backend, args.timeout)
    dtype, tol = lab_dtype(args.dtype, device)
    m = args.micro_batches or 2 * p
    model, params, x, y = model_and_data(p, m, D, S)
    ref_loss, ref = reference(params, x, y, model.n_layers, device, reference_dtype(dtype))
    item = torch.empty((), dtype=dtype).element_size()
    say(f"# {p} ranks, {header(device)}, {dtype}; GPT with {model.n_layers} blocks (d={D}), {m} micro-batches of "
        f"{len(x) // m} sequences of {S}; tolerance {tol:g} (relative to each reference's largest value)")
    dist.barrier()  # NCCL: every rank's communicator exists before the first point-to-point call

    # 1. by hand: the emulator's 1F1B schedule, batch_isend_irecv as the lesson's executor
    rec = Recorder()
    chunks = chunks_of(model, params, p, 1, rank, device, dtype)
    micro_x = list(torch.tensor(x, device=device).chunk(m))
    micro_y = list(torch.tensor(y, device=device).chunk(m))
    schedule = pp.schedule("1f1b", p, m)
    ex = Executor(chunks, p, rank, rec, (len(x) // m, S, D), device, dtype)
    losses = [float(v) for v in ex.step(pp.program(schedule)[rank], micro_x, micro_y).values()]
    if rank == p - 1 and args.self_test_fault == "drop-gradient":  # a stage whose weight never got a gradient
        next(iter(chunks[0].weights.values())).grad = None
    if rank == p - 1 and args.self_test_fault == "wrong-gradient":
        with torch.no_grad():
            next(iter(chunks[0].weights.values())).grad.add_(1.0)
    if rank == p - 1 and args.self_test_fault == "drop-call" and rec.calls:
        rec.calls.pop()
    check_run("1F1B by hand", rank, p, chunks, ref, losses, ref_loss, tol)
    say(f"{'1F1B by hand':>30s}: loss and all {len(ref)} gradients match one process")
    say(expect_same_calls(f"{'1F1B by hand':>30s}", gather_calls(rec), emulator_calls("1f1b", p, m, 1, item)))
    rec.save(os.path.join(args.out, "03_pipeline.calls.json"), lab="03_pipeline", world_size=p,
             micro_batches=m, dtype=dtype_name(dtype))

    # 2. torch.distributed.pipelining, its calls recorded at the dispatcher
    for kind, (name, emu_kind, v) in TORCH_SCHEDULES.items():
        if v > 1 and p == 1:
            say(f"{name:>30s}: not run (one rank has nothing to interleave)")
            continue
        if kind != "gpipe" and dist.get_backend() == "gloo" and TORCH_VERSION < (2, 5):
            say(f"{name:>30s}: not run: torch {torch.__version__}'s 1F1B schedules hang on gloo "
                f"(pytorch/pytorch#132644); they run on NCCL, and on gloo with a later torch")
            continue
        chunks_t, tl, calls_t = torch_pipelining(kind, p, m, rank, device, dtype)
        check_run(f"pipelining {kind}", rank, p, chunks_t, ref, tl if rank == p - 1 else None, ref_loss, tol)
        every = [None] * p
        dist.all_gather_object(every, [c.as_list() for c in calls_t])
        mine, theirs = same_messages([[Call(*c) for c in r] for r in every], emulator_calls(emu_kind, p, m, v, item))
        say(f"{name:>30s}: loss and all {len(ref)} gradients match one process")
        say(expect_same_calls(f"{name:>30s}", mine, theirs, "each rank's as a set (torch posts them in its own order)"))

    # 3. the bubble, measured from per-action timestamps, beside the emulator and the formula
    measure_bubble(args, p, m, rank, device, dtype, schedule)
    say("OK: 1F1B by hand and torch.distributed.pipelining match one process, call for call; calls written to "
        + args.out)
    finish()


if __name__ == "__main__":
    main()
