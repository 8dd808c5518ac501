"""Where a rank's step went in an emulator run: its timeline split into the categories
the planner predicts (:mod:`emulator.planner.breakdown`): GEMMs, attention, the memory-bound
kernels, the host's launch and dispatch, the optimizer, each axis's collectives that nothing
hid, and the pipeline's bubble."""

from ..mesh import DATA_PARALLEL

ORDER = ("GEMMs", "attention", "memory-bound kernels", "launch and dispatch", "optimizer", "tp", "cp", "ep", "dp",
         "bubble")
KERNELS = {"gemm": "GEMMs", "attention": "attention", "memory": "memory-bound kernels"}


def measured(world, rank):
    """{category: seconds} of ``rank``'s timeline in an emulator run: its compute by the
    kind of the declared kernels charged under each name, its waits by what it waited for."""
    out = dict.fromkeys(ORDER, 0.0)
    groups = {"tp": "tp", "cp": "cp", "ep": "ep", "dp": "dp", **dict.fromkeys(DATA_PARALLEL, "dp")}
    end = world.clock.final()[rank]
    for e in world.timeline().events:
        if e.rank != rank or e.stream != "compute" or e.end > end + 1e-15:
            continue
        t = e.end - e.start
        if e.kind == "compute":
            if e.name.startswith("optimizer"):
                out["optimizer"] += t
            elif e.name.startswith("compute slowed"):
                out["dp"] += t
            else:
                out[KERNELS.get(world.kinds.get(e.name), "GEMMs")] += t
        elif e.kind == "idle":
            if e.name == "wait the host":
                out["launch and dispatch"] += t
            elif e.group in groups:
                out[groups[e.group]] += t
            elif e.name not in ("finished", "failed"):
                out["bubble"] += t
    return out
