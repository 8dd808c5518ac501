"""Per-rank pipeline loops the tests share."""


def blocking_loop(comm, stage, actions, micro_x, micro_y):
    """Receives with a blocking recv, sends with a blocking send right after computing:
    right for GPipe, deadlocks under 1F1B (neighbours send to each other at once)."""
    for a in actions:
        src = stage.source(a)
        inbound = comm.recv(src[0]) if src else None
        if a.kind == "F":
            out = stage.forward(a, micro_x[a.microbatch] if stage.is_first(a.chunk) else inbound,
                                micro_y[a.microbatch])
        else:
            out = stage.backward(a, inbound, 1 / len(micro_x))
            stage.free(a)
        dst = stage.destination(a)
        if dst:
            comm.send(out, dst[0])
    return stage.losses
