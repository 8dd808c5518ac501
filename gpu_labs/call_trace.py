"""The calls a lab makes on ``torch.distributed``, recorded as the emulator records them.

Two ways to record, one format (``Call(op, group, nbytes, peer)`` of
:mod:`emulator.records.calls`: torch's op name, the group's mesh axis name or
``"world"``, the bytes of the tensor passed in, the global peer rank of a point-to-point
call):

* :class:`Recorder`: the hand-written pieces call collectives and point-to-point
  operations through it; it forwards them to ``torch.distributed`` and keeps each call.
* :class:`Recording`: a context manager for code that is not ours (DTensor,
  ``torch.distributed.pipelining``). It watches the dispatcher, where every collective of
  ``torch.distributed`` (``c10d`` ops) and of DTensor (functional collectives) passes, and
  records what goes by.

``save`` gathers every rank's list and writes one JSON file, which a test compares with
the emulator running the lesson's algorithm. The Recorder also counts the bytes each
rank sends with a ring algorithm (the collective's size times nccl-tests' bus factor,
:data:`emulator.cost.BUS_FACTOR`), for the lab's table.
"""

import os

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from .common import all_gather_into_tensor, reduce_scatter_tensor
from emulator.cost import BUS_FACTOR
from emulator.records.calls import Call, save


def _nbytes(t):
    return t.numel() * t.element_size()


class Recorder:
    """``groups`` maps a mesh axis name to its process group (from ``init_device_mesh``:
    ``{"dp": mesh.get_group("dp")}``); calls without a group are on ``"world"``."""

    def __init__(self, groups=None):
        self.calls = []
        self.sent = 0.0
        self._names = {id(g): name for name, g in (groups or {}).items()}
        self._sizes = {id(g): dist.get_world_size(g) for g in (groups or {}).values()}

    def _record(self, op, t, group, peer=None, size_bytes=None):
        name = "world" if group is None else self._names[id(group)]
        self.calls.append(Call(op, name, _nbytes(t), peer))
        n = dist.get_world_size() if group is None else self._sizes[id(group)]
        if op in BUS_FACTOR:
            self.sent += BUS_FACTOR[op](n) * (size_bytes if size_bytes is not None else _nbytes(t))
        elif op == "send":
            self.sent += _nbytes(t)

    # ----------------------------------------------------------------- collectives
    def all_reduce(self, t, group=None, async_op=False):
        self._record("all_reduce", t, group)
        return dist.all_reduce(t, group=group, async_op=async_op)

    def reduce_scatter(self, out, t, group=None, async_op=False):
        """``out`` gets this rank's slice of the sum of every rank's ``t``."""
        self._record("reduce_scatter", t, group)
        return reduce_scatter_tensor(out, t, group=group, async_op=async_op)

    def all_gather(self, out, t, group=None, async_op=False):
        """``out`` gets every rank's ``t``, concatenated in rank order (nccl-tests' size:
        the gathered ``out``)."""
        self._record("all_gather", t, group, size_bytes=_nbytes(out))
        return all_gather_into_tensor(out, t, group=group, async_op=async_op)

    def all_to_all_single(self, out, t, output_split_sizes=None, input_split_sizes=None, group=None,
                          async_op=False):
        """Rows of ``t`` split by ``input_split_sizes`` to every rank; ``out`` gets theirs."""
        self._record("all_to_all_single", t, group)
        return dist.all_to_all_single(out, t, output_split_sizes, input_split_sizes, group=group, async_op=async_op)

    # ----------------------------------------------------------------- point to point
    def batch_isend_irecv(self, ops, group=None):
        """``ops``: a list of ``("send", tensor, peer)`` / ``("recv", tensor, peer)`` with
        global peer ranks, posted together (``dist.batch_isend_irecv``); returns the works."""
        p2p = []
        for kind, t, peer in ops:
            self._record(kind, t, group, peer)
            p2p.append(dist.P2POp(dist.isend if kind == "send" else dist.irecv, t, peer, group))
        return dist.batch_isend_irecv(p2p)

    # ----------------------------------------------------------------- output
    def save(self, path, **meta):
        """Gather every rank's calls on rank 0 and write them as JSON (rank 0 returns the
        path, the others None)."""
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, [c.as_list() for c in self.calls])
        if dist.get_rank() != 0:
            return None
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        return save(path, [[Call(*c) for c in per_rank] for per_rank in every], **meta)


# c10d ops (what torch.distributed's functions dispatch) and functional collectives (what
# DTensor dispatches): torch's op name, and where the tensor passed in sits in the args.
_C10D = {"allreduce_": "all_reduce", "_allgather_base_": "all_gather", "_reduce_scatter_base_": "reduce_scatter",
         "alltoall_base_": "all_to_all_single", "broadcast_": "broadcast", "send": "send", "recv_": "recv"}
_FUNCTIONAL = {"all_reduce": "all_reduce", "all_gather_into_tensor": "all_gather",
               "reduce_scatter_tensor": "reduce_scatter", "all_to_all_single": "all_to_all_single"}


class Recording(TorchDispatchMode):
    """``with Recording(groups) as rec:`` records, in ``rec.calls``, every collective and
    point-to-point call made inside the block, whoever makes it (DTensor's redistributions,
    torch's pipeline schedules), in backward too. ``groups`` maps mesh axis names to
    process groups, as for :class:`Recorder`."""

    def __init__(self, groups=None):
        super().__init__()
        self.calls = []
        self._axes = {tuple(dist.get_process_group_ranks(g)): name for name, g in (groups or {}).items()}
        self._world = tuple(range(dist.get_world_size()))

    def _name(self, pg):
        ranks = tuple(dist.get_process_group_ranks(pg))
        return self._axes.get(ranks, "world" if ranks == self._world else str(sorted(ranks)))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, op = func.namespace, func._schema.name.split("::")[-1]
        if namespace == "c10d" and op in _C10D:
            pg = dist.ProcessGroup.unbox(next(a for a in args if isinstance(a, torch.ScriptObject)))
            if op in ("_allgather_base_", "_reduce_scatter_base_", "alltoall_base_"):
                t = args[1]  # (output, input, ...)
            else:
                t = args[0][0]  # a list of tensors first
            peer = dist.get_global_rank(pg, args[2]) if op in ("send", "recv_") else None
            self.calls.append(Call(_C10D[op], self._name(pg), _nbytes(t), peer))
        elif namespace == "_c10d_functional" and op in _FUNCTIONAL:
            pg = dist.distributed_c10d._resolve_process_group([a for a in args if isinstance(a, str)][-1])  # the group name comes last
            self.calls.append(Call(_FUNCTIONAL[op], self._name(pg), _nbytes(args[0])))
        return func(*args, **(kwargs or {}))
