"""All-reduce speed: the emulator against the NumPy floor and torch.distributed (gloo).

    python -m benchmarks.collectives            # full table (a few minutes)
    python -m benchmarks.collectives --quick    # sizes up to 1e5, no gloo

For world sizes 2, 4, 8 and 1e3..1e7 float32 elements per rank, in one run:

* ``global``: ``collectives.ring_all_reduce(bufs)`` (the global view)
* ``spmd``:   ``World(n).run(lambda comm: comm.all_reduce(x))`` per call (the SPMD view)
* ``floor``:  the least any emulator must do: sum the stacked buffers, write the result
  to every rank
* ``gloo``:   ``torch.distributed.all_reduce`` with n processes on loopback, this machine

Each is the best of several repeats. Ratios are against numbers measured in the same run.
``channels`` is how many NCCL-style channels the emulator ran (the topology's 8, fewer
when a chunk has fewer elements than that). Targets: spmd/floor <= 3 at 1e7 elements on 8
ranks; per-call overhead (spmd, 8 elements, 8 ranks) under 200 us; a small all-reduce on
1024 ranks (128 nodes) under 2 s, the first call included; spmd faster than gloo at every
size.
"""

import argparse
import os
import socket
import sys
import time

import numpy as np

from emulator import World
from emulator.algorithms import global_view as C


def best_of(fn, repeat, number=1):
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t) / number)
    return best


def numpy_floor(stacked):
    out = np.empty_like(stacked)
    out[:] = stacked.sum(axis=0)
    return out


def spmd_time(n, elems, calls, world=None):
    x = [np.random.default_rng(r).standard_normal(elems).astype(np.float32) for r in range(n)]
    world = world or World(n)

    def prog(comm):
        for _ in range(calls):
            comm.all_reduce(x[comm.rank])

    return lambda: world.run(prog)


def channels_used(n, elems):
    world = World(n)
    spmd_time(n, elems, 1, world)()
    return int(world.clock.batches[-1].channel.max()) + 1


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_worker(rank, n, port, sizes, repeat, queue):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    times = {}
    for elems in sizes:
        x = torch.ones(elems)
        dist.all_reduce(x)  # warm-up
        best = float("inf")
        for _ in range(repeat):
            dist.barrier()
            t = time.perf_counter()
            dist.all_reduce(x)
            best = min(best, time.perf_counter() - t)
        times[elems] = best
    if rank == 0:
        queue.put(times)
    dist.barrier()
    dist.destroy_process_group()


def gloo_times(n, sizes, repeat):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    port = _free_port()
    procs = [ctx.Process(target=_gloo_worker, args=(r, n, port, sizes, repeat, queue)) for r in range(n)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=600)
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"gloo workers failed: exit codes {[p.exitcode for p in procs]}")
    return queue.get()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="sizes up to 1e5 and no gloo")
    ap.add_argument("--no-gloo", action="store_true")
    args = ap.parse_args(argv)
    sizes = [10**k for k in range(3, 6 if args.quick else 8)]
    worlds = [2, 4, 8]
    print("# all_reduce of float32, best of repeats; ratios against the same run's numbers")
    print(f"{'ranks':>5} {'elements':>9} {'channels':>8} {'floor':>10} {'global':>10} {'spmd':>10} {'gloo':>10}"
          f" {'spmd/floor':>10} {'gloo/spmd':>9}")
    for n in worlds:
        gloo = {} if (args.quick or args.no_gloo) else gloo_times(n, sizes, repeat=3 if n < 8 else 2)
        for elems in sizes:
            repeat = 3 if elems >= 10**6 else 7
            bufs = [np.random.default_rng(r).standard_normal(elems).astype(np.float32) for r in range(n)]
            stacked = np.stack(bufs)
            t_floor = best_of(lambda: numpy_floor(stacked), repeat)
            t_global = best_of(lambda: C.ring_all_reduce(bufs), repeat)
            calls = 1 if elems >= 10**6 else 20
            t_spmd = best_of(spmd_time(n, elems, calls), repeat) / calls
            t_gloo = gloo.get(elems, float("nan"))
            print(f"{n:>5} {elems:>9.0e} {channels_used(n, elems):>8} {t_floor * 1e3:>8.3f}ms {t_global * 1e3:>8.3f}ms"
                  f" {t_spmd * 1e3:>8.3f}ms {t_gloo * 1e3:>8.3f}ms {t_spmd / t_floor:>10.2f} {t_gloo / t_spmd:>9.2f}")
            sys.stdout.flush()
    calls = 200
    overhead = best_of(spmd_time(8, 8, calls), 7) / calls
    print(f"\nper-call overhead, SPMD all_reduce of 8 elements on 8 ranks: {overhead * 1e6:.0f} us (target < 200 us)")
    big = World(1024)
    first = best_of(spmd_time(1024, 1024, 1, big), 1)  # cold: the ring's plan is built in this call
    warm = best_of(spmd_time(1024, 1024, 1, big), 3)
    print(f"all_reduce of 1024 float32 on 1024 ranks (128 nodes): first call {first:.2f} s, then {warm:.2f} s "
          f"(target < 2 s)")


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
