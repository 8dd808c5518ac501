"""What every GPU lab shares: start torch.distributed, time things, report, fail clearly.

NCCL when every local rank has a GPU of its own, gloo otherwise (override with
--backend); the choice is made once, from the number of local ranks, so all ranks agree.
Under torchrun the rendezvous comes from the environment; run directly with python, a
lab is a world of one on a free port. Written for torch 2.13, which the course pins
(``reduce_scatter_single`` and ``all_gather_single`` are its names for the single-tensor
collectives; older releases call them ``reduce_scatter_tensor`` and
``all_gather_into_tensor``).
"""

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:  # so that labs can import the emulator's cost model and models
    sys.path.insert(0, ROOT)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_parser(doc):
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    ap.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                    help="nccl on GPUs, gloo on CPU (default: auto)")
    ap.add_argument("--out", default=os.path.join(ROOT, "artifacts", "gpu_labs"),
                    help="folder for the lab's call trace (JSON, the format of emulator.records.calls)")
    return ap


def add_dtype_option(ap):
    """``--dtype auto|float64|float32``: float64 on a CPU (exact checks), float32 on GPUs."""
    ap.add_argument("--dtype", choices=["auto", "float64", "float32"], default="auto",
                    help="float64 on CPU (exact checks), float32 on GPU (default auto)")


def lab_dtype(name, device):
    """(torch dtype, tolerance of the lab's checks) for ``--dtype name`` on ``device``."""
    dtype = {"auto": torch.float32 if device.type == "cuda" else torch.float64,
             "float64": torch.float64, "float32": torch.float32}[name]
    return dtype, (1e-9 if dtype == torch.float64 else 2e-4)


def init(backend="auto"):
    """Start the process group; returns (rank, world size, device)."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    local = int(os.environ["LOCAL_RANK"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    enough = gpus >= local_size  # the same answer on every rank of a node
    if backend == "auto":
        backend = "nccl" if enough else "gloo"
    if backend == "nccl" and not enough:
        fail(f"--backend nccl needs a GPU per rank: {local_size} ranks on this node, {gpus} GPU(s). "
             f"NCCL refuses two ranks on one GPU: use fewer ranks per node, or --backend gloo.")
    device = torch.device(f"cuda:{local}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return dist.get_rank(), dist.get_world_size(), device


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn, device, iters, warmup=5):
    """Seconds per call of ``fn()``, as nccl-tests measures: ``iters`` calls back to back
    after a barrier, timed as a whole (CUDA events on a GPU, so launch and synchronisation
    are not counted once per call), divided by ``iters``; the slowest rank's figure."""
    for _ in range(warmup):
        fn()
    dist.barrier()
    sync(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        seconds = start.elapsed_time(end) / 1e3 / iters
    else:
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        seconds = (time.perf_counter() - t) / iters
    worst = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst)


def say(*args):
    if dist.get_rank() == 0:
        print(*args, flush=True)


def fail(message):
    """Report and stop at once. The process group is aborted, not shut down politely, so
    ranks on other nodes that wait in a collective fail now instead of sitting out NCCL's
    watchdog timeout (torchrun then stops the rest)."""
    rank = dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")
    print(f"FAILED on rank {rank}: {message}", file=sys.stderr, flush=True)
    if dist.is_initialized():
        try:
            dist.distributed_c10d._abort_process_group()
        except Exception:  # noqa: BLE001 -- aborting is best effort; the exit below is what matters
            pass
    os._exit(1)


def finish():
    dist.barrier()
    dist.destroy_process_group()
