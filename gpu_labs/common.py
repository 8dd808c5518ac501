"""What every GPU lab shares: start torch.distributed, time things, report, fail clearly.

The backend: NCCL when every rank on this node has a GPU of its own; gloo on the CPU when
the node has no GPU; and a refusal, not a silent fall-back to the CPU, when the node has
GPUs but fewer than ranks (``--backend gloo`` runs there on purpose). The choice depends
only on the node's rank and GPU counts, so all ranks of a node agree. Under torchrun the
rendezvous comes from the environment; run directly with python, a lab is a world of one
on a free port.

Failing fast: a lab that finds a wrong result calls :func:`fail`, which aborts this
process's communicators and exits. Ranks of the same node are then stopped by torchrun;
ranks on other nodes are stopped by NCCL's watchdog, whose timeout the labs shorten to
``--timeout`` seconds (see ``gpu_labs/README.md``, "When a rank fails").

Runs on torch 2.4 and later: only names present in torch 2.4 are used (a test keeps it
so), and the few pieces torch has since moved (DTensor, FSDP2) are imported from either
place.
"""

import argparse
import datetime
import os
import platform
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

# Where a lab writes what it records, relative to the folder it runs in (the course's own
# folder when run as documented): the same place whether gpu_labs is this checkout or an
# installed copy.
ARTIFACTS = os.path.join("artifacts", "gpu_labs")

# Largest error allowed, relative to the reference's largest magnitude (or absolute when
# that is below 1), per dtype. float64 checks the algorithm exactly up to summation order;
# float32 allows for its 24-bit mantissa over a few layers; bfloat16 (8-bit mantissa,
# unit round-off 2**-9 = 0.002) allows a few dozen of those, since results pass through
# several bf16 roundings. tests/test_gpu_labs.py and tests/test_gpu_lab_options.py run every
# lab in every dtype and show that a wrong result exceeds them.
TOLERANCE = {torch.float64: 1e-9, torch.float32: 2e-4, torch.bfloat16: 5e-2}

TORCH_VERSION = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])

# The single-tensor reduce-scatter and all-gather: ``reduce_scatter_tensor`` and
# ``all_gather_into_tensor`` in every release from 2.4 on; torch 2.13 renames them
# ``reduce_scatter_single`` and ``all_gather_single`` (same arguments) and warns on the old
# names, so the new one is used where it exists.
reduce_scatter_tensor = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
all_gather_into_tensor = getattr(dist, "all_gather_single", dist.all_gather_into_tensor)

# ProcessGroupNCCL's error handling mode 3 (SkipCleanUp): on a timeout or an NCCL error its
# watchdog thread rethrows, which takes the process down (torch's default since 2.2; set
# here so that a cluster image that turned it off still fails fast).
NCCL_ERROR_HANDLING = "3"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_parser(doc):
    ap = argparse.ArgumentParser(description=doc.strip().splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=doc)
    ap.add_argument("--backend", choices=["auto", "nccl", "gloo"], default="auto",
                    help="nccl on GPUs, gloo on CPU (default: auto, which refuses a node with fewer GPUs than ranks)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="seconds a collective may wait for the other ranks before the run is torn down "
                         "(torch's default is 10 minutes for NCCL, 30 for gloo)")
    ap.add_argument("--out", default=ARTIFACTS,
                    help="folder for the lab's call trace (JSON, the format of emulator.records.calls; "
                         "default: %(default)s under the current folder)")
    return ap


def add_dtype_option(ap):
    """``--dtype auto|float64|float32|bfloat16``: float64 on a CPU (exact checks), float32 on GPUs."""
    ap.add_argument("--dtype", choices=["auto", "float64", "float32", "bfloat16"], default="auto",
                    help="float64 on CPU (exact checks), float32 on GPU (default auto); bfloat16 as training runs, "
                         "checked against a float64 reference with a looser tolerance")


def lab_dtype(name, device):
    """(torch dtype, tolerance of the lab's checks) for ``--dtype name`` on ``device``."""
    dtype = {"auto": torch.float32 if device.type == "cuda" else torch.float64, "float64": torch.float64,
             "float32": torch.float32, "bfloat16": torch.bfloat16}[name]
    return dtype, TOLERANCE[dtype]


def reference_dtype(dtype):
    """The dtype a lab's single-process reference runs in: the lab's own, except that a
    bfloat16 run is checked against float64 (comparing two bf16 runs would measure the
    reference's rounding as much as the lab's)."""
    return torch.float64 if dtype == torch.bfloat16 else dtype


def dtype_name(dtype):
    return str(dtype).removeprefix("torch.")


def choose_backend(requested, local_ranks, gpus):
    """(backend, reason) for ``requested`` in {auto, nccl, gloo} with ``local_ranks`` ranks
    and ``gpus`` GPUs on this node; raises ValueError with what to do when it cannot run."""
    if requested == "gloo":
        return "gloo", "--backend gloo" + (f" (the node's {gpus} GPU(s) stay unused)" if gpus else "")
    if gpus >= local_ranks:
        return "nccl", f"a GPU for each of the node's {local_ranks} rank(s)"
    if gpus == 0:
        if requested == "nccl":
            raise ValueError("--backend nccl needs GPUs and this node has none: use --backend gloo (or auto)")
        return "gloo", "no GPU on this node"
    raise ValueError(f"{local_ranks} ranks on this node but {gpus} GPU(s): NCCL needs a GPU per rank and refuses two "
                     f"ranks on one GPU. Start at most {gpus} rank(s) per node (--nproc-per-node {gpus}), or pass "
                     f"--backend gloo to run every rank on the CPU on purpose.")


def init(backend="auto", timeout=60.0):
    """Start the process group; returns (rank, world size, device). ``timeout`` (seconds)
    bounds how long any collective waits for the other ranks."""
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = NCCL_ERROR_HANDLING  # read when the NCCL group is made
    local = int(os.environ["LOCAL_RANK"])
    local_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    try:
        backend, why = choose_backend(backend, local_size, gpus)
    except ValueError as exc:
        fail(str(exc))
    device = torch.device(f"cuda:{local}") if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    init.reason = why
    return dist.get_rank(), dist.get_world_size(), device


def device_name(device):
    """What ran: the GPU's own name (``torch.cuda.get_device_name``), or the CPU."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"CPU ({platform.processor() or platform.machine()})"


def header(device):
    """The line every lab starts with after its ``#``: backend, why, and what ran."""
    return (f"backend {dist.get_backend()} ({getattr(init, 'reason', '')}), device {device_name(device)}, "
            f"torch {torch.__version__}")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Stopwatch:
    """Elapsed seconds between ``start()`` and ``stop()``: CUDA events on a GPU (the time
    the stream took, launch overhead excluded), wall time on a CPU."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def start(self):
        if self.cuda:
            self.t0 = torch.cuda.Event(enable_timing=True)
            self.t0.record()
        else:
            self.t0 = time.perf_counter()

    def stop(self):
        if self.cuda:
            t1 = torch.cuda.Event(enable_timing=True)
            t1.record()
            t1.synchronize()
            return self.t0.elapsed_time(t1) / 1e3
        return time.perf_counter() - self.t0


def timed(fn, device, iters, warmup=5, repeats=5, group=None):
    """Seconds per call of ``fn()``, measured as nccl-tests and benchmark tools do:
    ``warmup`` calls first (communicator set-up, allocator, caches), then ``repeats``
    batches of ``iters`` calls back to back, each batch timed as a whole after a barrier
    (so launch and synchronisation are not counted once per call); the median batch,
    divided by ``iters``; the slowest rank's figure."""
    for _ in range(warmup):
        fn()
    watch, batches = Stopwatch(device), []
    for _ in range(repeats):
        dist.barrier(group=group)
        sync(device)
        watch.start()
        for _ in range(iters):
            fn()
        batches.append(watch.stop() / iters)
    worst = torch.tensor(statistics.median(batches), dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX, group=group)
    return float(worst)


def say(*args):
    if dist.get_rank() == 0:
        print(*args, flush=True)


def fail(message):
    """Report and stop at once. This process's communicators are aborted rather than shut
    down politely: a polite shutdown would wait for collectives that the other ranks,
    still running, may never complete. The other ranks of this node are then stopped by
    torchrun; ranks on other nodes fail in their next collective, when NCCL's watchdog
    sees the connection drop or the ``--timeout`` pass (gpu_labs/README.md)."""
    rank = dist.get_rank() if dist.is_initialized() else os.environ.get("RANK", "?")
    print(f"FAILED on rank {rank}: {message}", file=sys.stderr, flush=True)
    if dist.is_initialized():
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        try:
            if abort is not None:
                abort()
        except Exception:  # noqa: BLE001 -- aborting is best effort; the exit below is what matters
            pass
    sys.stdout.flush()
    os._exit(1)


def fail_everywhere(message, bad):
    """Stop every rank when ``bad`` is true on the same ranks' agreed view (all ranks pass
    the same ``bad``): rank 0 says why, the others exit quietly."""
    if not bad:
        return
    if dist.get_rank() == 0:
        fail(message)
    sys.stdout.flush()
    os._exit(1)


def finish():
    """End the run cleanly: a last barrier, the process groups destroyed while every
    worker thread is idle, and the process ended without the interpreter's shutdown.

    Why not simply return: gloo (and NCCL's watchdog) run collectives on C++ threads that
    keep a reference to each call's tensors for a moment after the call has completed and
    the Python side has moved on. When such a thread drops the last reference to a
    tensor that owns a Python object, it must take the GIL; if the interpreter is already
    shutting down, Python ends that thread with ``pthread_exit``, whose unwinding through
    a ``noexcept`` C++ frame calls ``std::terminate`` ("terminate called without an
    active exception", SIGABRT) after the lab has printed OK. ``os._exit`` after the
    groups are destroyed ends the process without a shutdown for any thread to meet."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
