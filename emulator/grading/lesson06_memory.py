"""Exercise 6.2's model of a pipeline stage's memory, and the mistakes its hints name: each
mistake is the model computed the wrong way, so a wrong answer that matches one is told
which."""


KINDS = ("params", "grads", "optimizer", "activations", "buffers")


# the mistakes Exercise 6.2's hints name: {name: (kind, what to say)}
MEMORY_MISTAKES = {
    "params unsharded": ("params", "ZeRO-3 shards the parameters too: each rank holds 1/n of them between uses"),
    "params sharded": ("params", "only ZeRO-3 shards the parameters; below it every rank holds all of its stage's"),
    "experts over dp x cp": (None, "experts are reduced, and so sharded, over dp x cp / ep ranks, not dp x cp: "
                                   "the ep ranks of a group hold different experts"),
    "grads bf16": ("grads", "gradients are fp32, 4 bytes per element (Megatron's main_grad under --bf16), not "
                            "the weights' 2"),
    "grads sharded": ("grads", "below ZeRO-2 every rank keeps all of its gradients (ZeRO-1 shards only the "
                               "optimizer state)"),
    "grads unsharded": ("grads", "ZeRO-2 and ZeRO-3 shard the gradients too: 1/n of them per rank"),
    "optimizer unsharded": ("optimizer", "ZeRO-1, 2 and 3 keep 12 bytes of Adam's state per element of their "
                                         "1/n slice"),
    "p in flight": ("activations", "under 1F1B stage r holds min(p - r, m) micro-batches, not p on every stage"),
    "m in flight": ("activations", "m micro-batches in flight is GPipe's count; 1F1B holds min(p - r, m) on stage "
                                   "r"),
}


def memory_model(layers, dims, rank, mistake=None):
    """{kind: bytes} of Exercise 6.2's model, or of one of :data:`MEMORY_MISTAKES`."""
    n = {"dense": dims.dp * dims.cp,
         "experts": dims.dp * dims.cp // (1 if mistake == "experts over dp x cp" else dims.ep)}
    z = dims.zero_stage
    p_sharded = {"params unsharded": False, "params sharded": True}.get(mistake, z == 3)
    g_sharded = {"grads unsharded": False, "grads sharded": True}.get(mistake, z >= 2)
    o_sharded = z >= 1 and mistake != "optimizer unsharded"
    out = dict.fromkeys(KINDS, 0)
    for layer in layers:
        for group, elems in layer["params"].items():
            mine = -(-elems // n[group])
            out["params"] += 2 * (mine if p_sharded else elems)
            out["grads"] += (2 if mistake == "grads bf16" else 4) * (mine if g_sharded else elems)
            out["optimizer"] += 12 * (mine if o_sharded else elems)
    in_flight = {"p in flight": dims.pp, "m in flight": dims.micro_batches}.get(mistake, dims.pp - rank)
    out["activations"] = min(in_flight, dims.micro_batches) * sum(layer["kept"] for layer in layers)
    return out


def within_one_percent(a, b):
    return abs(a - b) <= 0.01 * b + 1


def memory_hint(kind, got, layers, dims, rank):
    """What the answer's ``kind`` matches, among the named mistakes (empty if none)."""
    right = memory_model(layers, dims, rank)[kind]
    said = []
    for mistake, (of, say) in MEMORY_MISTAKES.items():
        wrong = memory_model(layers, dims, rank, mistake)[kind]
        if of in (None, kind) and not within_one_percent(wrong, right) and within_one_percent(got, wrong):
            said.append(say)
    if said:  # some mistakes give the same number on a plan: name each
        return "; " + "; or ".join(said)
    return {"params": "; bf16 weights, 2 bytes per element, 1/n of them only under ZeRO-3",
            "grads": "; fp32 gradients, 4 bytes per element, 1/n of them under ZeRO-2 and 3",
            "optimizer": "; 12 bytes per element Adam updates: 1/n of them under ZeRO-1, 2 and 3",
            "activations": "; count the micro-batches in flight on this stage"}[kind]
