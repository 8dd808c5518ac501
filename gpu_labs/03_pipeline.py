"""Lesson 03 on real hardware: a 1F1B pipeline by hand over point-to-point calls, against
one process and against torch.distributed.pipelining.

    torchrun --standalone --nproc-per-node P gpu_labs/03_pipeline.py

P ranks are P pipeline stages of the course GPT (the emulator's parameters, 2P blocks):

* by hand (``gpu_labs/torch_parallel/pipeline.py``): the schedule comes from
  ``emulator.parallel.pipeline.schedule("1f1b", P, m)``; each rank walks its actions,
  receiving, computing and sending with ``batch_isend_irecv``, as the lesson's executor
  does. Loss and every gradient must equal one process running the whole model (exits
  non-zero naming the rank and tensor otherwise). Its calls go to
  ``--out``/03_pipeline.calls.json (the format of ``emulator.records.calls``); a test checks they
  are the calls the emulator's executor makes.
* with ``torch.distributed.pipelining``: a ``PipelineStage`` per rank under
  ``ScheduleGPipe`` and ``Schedule1F1B``, and two stages per rank under
  ``ScheduleInterleaved1F1B``; each must agree with the single process too.

Last, the bubble: the hand-written 1F1B is timed action by action (CUDA events on GPUs)
over a few steps; the idle share of the step is printed beside the emulator run with the
same measured stage times, and beside the formula (p-1)/(m+p-1). NCCL on GPUs, gloo on
the CPU (``--backend`` overrides).
"""

import os

import numpy as np
import torch
import torch.distributed as dist

from common import add_dtype_option, base_parser, fail, finish, init, lab_dtype, say
from torch_parallel.pipeline import Executor, GPTStage, loss_fn
from trace import Recorder

from emulator import Topology, World, nn
from emulator.accounting import pipeline_bubble
from emulator.nn import torch_reference as R
from emulator.parallel import pipeline as pp

V, D, H, FF, S = 32, 32, 4, 64, 16


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--micro-batches", type=int, default=0, help="m (default 2P)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps of the hand-written 1F1B")
    ap.add_argument("--width", type=int, default=0, help="d_model of the timed model (default 32 on CPU, 1024 on "
                                                         "GPU, with sequences of 1024)")
    return ap.parse_args()


def model_and_data(p, m, d, seq, dtype):
    model = nn.GPT(vocab=V, d_model=d, n_heads=H, d_ff=2 * d, n_layers=2 * p, max_seq=seq, dtype=dtype)
    params = model.init(np.random.default_rng(0))
    rng = np.random.default_rng(1)
    x = rng.integers(0, V, (2 * m, seq))
    return model, params, x, np.roll(x, -1, axis=1)


def reference(params, x, y, n_layers, device, dtype):
    """Loss and gradients of the whole model in one process."""
    p = {k: torch.tensor(v, device=device, dtype=dtype, requires_grad=True) for k, v in params.items()}
    loss = loss_fn(R.gpt(p, torch.tensor(x, device=device), n_layers, H), torch.tensor(y, device=device))
    loss.backward()
    return loss.item(), {k: v.grad.cpu().numpy() for k, v in p.items()}


def compare(name, rank, grads, ref, losses, ref_loss, tol):
    for k, g in grads.items():
        err = float(np.abs(g - ref[k]).max())
        if err > tol * max(1.0, float(np.abs(ref[k]).max())):
            fail(f"{name}: the gradient of {k} on rank {rank} differs from one process by {err:.3g}")
    if losses is not None and abs(float(np.mean(losses)) - ref_loss) > tol:
        fail(f"{name}: the loss {np.mean(losses):.6f} on the last stage differs from one process's {ref_loss:.6f}")


def chunks_of(model, params, p, v, rank, device, dtype):
    runs = pp.split_layers(model, p * v)
    return {c: GPTStage(params, runs[c * p + rank], H, device, dtype) for c in range(v)}


def torch_pipelining(kind, model, params, p, m, rank, x, y, device, dtype):
    """One step of torch's own schedule ``kind``; returns (this rank's gradients, losses or None)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    v = 2 if kind == "interleaved" else 1
    chunks = chunks_of(model, params, p, v, rank, device, dtype)
    stages = [PipelineStage(chunks[c], c * p + rank, p * v, device) for c in range(v)]
    if kind == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn=loss_fn)
    else:
        schedule = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[kind](stages[0], m, loss_fn=loss_fn)
    losses = []
    xt, yt = torch.tensor(x, device=device), torch.tensor(y, device=device)
    if rank == 0:
        schedule.step(xt, target=yt if p == 1 else None, losses=losses)
    elif rank == p - 1:
        schedule.step(target=yt, losses=losses)
    else:
        schedule.step()
    grads = {k: g for c in chunks.values() for k, g in c.grads().items()}
    return grads, ([float(l.detach()) for l in losses] if losses else None)


def main():
    args = parse()
    rank, p, device = init(args.backend)
    dtype, tol = lab_dtype(args.dtype, device)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    m = args.micro_batches or 2 * p
    model, params, x, y = model_and_data(p, m, D, S, np_dtype)
    ref_loss, ref = reference(params, x, y, model.n_layers, device, dtype)
    say(f"# {p} ranks, backend {dist.get_backend()}, {dtype}; GPT with {model.n_layers} blocks (d={D}), "
        f"{m} micro-batches of {len(x) // m} sequences of {S}; tolerance {tol:g}")
    dist.barrier()  # NCCL: every rank's communicator exists before the first point-to-point call

    # 1. by hand: the emulator's 1F1B schedule, batch_isend_irecv as the lesson's executor
    rec = Recorder()
    chunks = chunks_of(model, params, p, 1, rank, device, dtype)
    micro_x = list(torch.tensor(x, device=device).chunk(m))
    micro_y = list(torch.tensor(y, device=device).chunk(m))
    schedule = pp.schedule("1f1b", p, m)
    ex = Executor(chunks, p, rank, rec, (len(x) // m, S, D), device, dtype)
    losses = ex.step(schedule[rank], micro_x, micro_y)
    compare("1F1B by hand", rank, chunks[0].grads(), ref, list(losses.values()) if rank == p - 1 else None,
            ref_loss, tol)
    say(f"{'1F1B by hand':>30s}: loss and every gradient match one process")
    rec.save(os.path.join(args.out, "03_pipeline.calls.json"), lab="03_pipeline", world_size=p,
             micro_batches=m, dtype=str(dtype).removeprefix("torch."))

    # 2. torch.distributed.pipelining
    for kind in ("gpipe", "1f1b", "interleaved"):
        if kind == "interleaved" and p == 1:
            continue
        grads, tl = torch_pipelining(kind, model, params, p, m, rank, x, y, device, dtype)
        compare(f"pipelining {kind}", rank, grads, ref, tl if rank == p - 1 else None, ref_loss, tol)
        name = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B", "interleaved": "ScheduleInterleaved1F1B"}[kind]
        say(f"{name:>30s}: loss and every gradient match one process")

    # 3. the bubble, measured from per-action timestamps, beside the emulator and the formula
    width = args.width or (1024 if device.type == "cuda" else D)
    seq = 1024 if device.type == "cuda" else S
    big, big_params, bx, by = model_and_data(p, m, width, seq, np_dtype)
    chunks = chunks_of(big, big_params, p, 1, rank, device, dtype)
    bxt, byt = list(torch.tensor(bx, device=device).chunk(m)), list(torch.tensor(by, device=device).chunk(m))
    for _ in range(args.steps + 1):  # the first step warms up; the last one is reported
        dist.barrier()
        ex = Executor(chunks, p, rank, Recorder(), (len(bx) // m, seq, width), device, dtype)
        ex.step(schedule[rank], bxt, byt)
        for c in chunks.values():
            c.zero_grad(set_to_none=True)
        events = ex.events
    every = [None] * p
    dist.all_gather_object(every, events)
    if rank == 0:
        span = max(e for evs in every for _, _, e in evs) - min(s for evs in every for _, s, _ in evs)
        busy = sum(e - s for evs in every for _, s, e in evs)
        t_f = np.mean([e - s for evs in every for k, s, e in evs if k == "F"])
        t_b = np.mean([e - s for evs in every for k, s, e in evs if k == "B"])
        # the emulator plays the same schedule with these stage times (the small model: only the times matter)
        run = pp.run(World(p, topology=Topology.free_network()), model, params, schedule, x, y,
                     costs=(t_f, t_b / 2, t_b / 2))
        print(f"bubble of 1F1B by hand (d={width}, s={seq}, mean F {t_f * 1e3:.2f} ms, B {t_b * 1e3:.2f} ms): "
              f"measured {1 - busy / (p * span):.1%} | emulator with these stage times {run.bubble:.1%} | "
              f"formula (p-1)/(m+p-1) {pipeline_bubble(p, m):.1%} (what the measurement has more of is the time the "
              f"messages and their synchronisation take)", flush=True)
    say("OK: 1F1B by hand and torch.distributed.pipelining match one process; calls written to " + args.out)
    finish()


if __name__ == "__main__":
    main()
