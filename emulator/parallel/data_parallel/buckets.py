"""Gradient buckets: the layers of a rank, in backward order, cut where a bucket reaches its
size (the rule of :class:`emulator.machine.stack.Bucket`). DDP cuts between tensors; the
planner counts whole layers, which allocate at the same moments (a bucket's storage comes
with the first gradient of the first layer in it)."""


def bucket_limit(stack, group_size, pp_rank, itemsize):
    """Bytes at which the stack closes a bucket (None: one bucket for everything), and the
    first bucket's (torch DDP's smaller first one)."""
    b = stack.bucket
    if stack.grad_overlap == "after_flush" or (b.first_stage_only and pp_rank > 0):
        return float("inf"), None
    per = itemsize if b.unit == "params" else 1  # Megatron's rule counts parameters
    return b.size(group_size) * per, b.first


def bucket_layers(nbytes, limit, first=None):
    """Indices into ``nbytes`` (each layer's gradient bytes, in backward order) grouped into
    buckets: a bucket closes once it holds at least ``limit`` bytes (the first ``first``)."""
    out, current, size, cap = [], [], 0, first if first is not None else limit
    for i, n in enumerate(nbytes):
        current.append(i)
        size += n
        if cap is not None and size >= cap:
            out.append(current)
            current, size, cap = [], 0, limit
    if current:
        out.append(current)
    return out
