"""DDP by hand for any torch module: gradients averaged by bucketed all-reduces that start
while backward is still running (what ``torch.nn.parallel.DistributedDataParallel`` does,
in a page).

    model = DDP(module, bucket_size_mb=25)
    loss_fn(model(x), y).backward()
    model.finish_gradient_synchronization()   # wait for the last buckets
    optimizer.step()

* At construction rank 0's parameters and buffers are broadcast, so every rank starts equal.
* The parameters that require a gradient are laid, in reverse order of
  ``module.parameters()`` (the order backward tends to produce them), into buckets of
  about ``bucket_size_mb`` (None: one bucket per parameter). A parameter shared by two
  modules (tied weights) appears once in ``parameters()`` and is reduced once; a frozen
  one (``requires_grad=False``) is skipped.
* A hook on every parameter counts the gradients a bucket still waits for; the last one
  flattens the bucket and starts its all-reduce asynchronously.
* ``finish_gradient_synchronization`` waits for every bucket, divides by the group size
  and writes the averages back into ``.grad``.

Who frees a finished all-reduce matters. The backend runs each call on a thread of its
own (gloo's workers), which keeps a reference to the call's work object for a moment
after ``wait()`` has returned. A work records the thread-local state of the thread that
started it, and inside backward recent torch releases keep a Python object there (the
``contextvars`` context of the backward call); freeing such a work takes the GIL. Had the
Python side already let go, that worker thread would free the work; if the interpreter
is shutting down by then (a test harness that returns right after its teardown), Python
ends the thread with ``pthread_exit`` inside a C++ destructor and the process aborts
("terminate called without an active exception"). So the all-reduces are started with
that Python object set aside (:func:`_without_backward_python_state`), and a step's
buffers are let go only once the backend's thread has let go of them too
(:func:`_release`: the buffer's C++ use count is back to the Python object's own). Then
whichever thread frees a work, freeing it touches no Python object. The hooks hold the
object weakly, so it is freed as soon as its user drops it.
"""

import contextlib
import time
import weakref

import torch
import torch.distributed as dist


@contextlib.contextmanager
def _without_backward_python_state():
    """Inside backward, set aside the Python object that torch keeps in the thread-local
    state (``torch.autograd.graph._engine_run_backward`` stashes its ``contextvars``
    context under "context"), so that a collective started here records none: freeing
    its work on the backend's thread then never needs the GIL. Torch releases without
    the stash (2.4) have nothing to set aside."""
    c = torch._C
    stashed = getattr(c, "_is_key_in_tls", None) is not None and c._is_key_in_tls("context")
    if not stashed:
        yield
        return
    context = c._get_obj_in_tls("context")
    c._remove_obj_from_tls("context")
    try:
        yield
    finally:
        c._stash_obj_in_tls("context", context)


def _release(finished, limit=10.0):
    """Let go of a finished step's ``{bucket: (work, buffer)}``: drop the works, then hold
    each buffer until its C++ use count is 1 (only this Python object), which means the
    backend's thread has freed its work. No torch API signals that moment, so this polls,
    sleeping (and so releasing the GIL) between looks; it is over within microseconds
    unless that thread was descheduled, and gives up after ``limit`` seconds."""
    buffers = [flat for _, flat in finished.values()]
    finished.clear()
    deadline = time.monotonic() + limit
    for flat in buffers:
        while flat._use_count() > 1 and time.monotonic() < deadline:
            time.sleep(1e-4)


class DDP(torch.nn.Module):
    def __init__(self, module, bucket_size_mb=None, group=None):
        super().__init__()
        self.module, self.group = module, group
        self.size = dist.get_world_size(group)
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        params = [p for p in module.parameters() if p.requires_grad]
        self.buckets = self._buckets(list(reversed(params)), bucket_size_mb)
        self._bucket_of = {id(p): i for i, b in enumerate(self.buckets) for p in b}
        self._waiting = [len(b) for b in self.buckets]
        self._works = {}  # bucket -> (work, flat buffer) of the step under way
        self._finished = {}  # the previous step's, let go of by _release
        me = weakref.ref(self)  # a hook holding the object itself would keep it alive in a cycle

        def hook(p):
            ddp = me()
            if ddp is not None:
                ddp._ready(p)

        self._hooks = [p.register_post_accumulate_grad_hook(hook) for p in params]

    @staticmethod
    def _buckets(params, bucket_size_mb):
        if bucket_size_mb is None:
            return [[p] for p in params]
        limit, buckets, current, size = bucket_size_mb * 2**20, [], [], 0
        for p in params:
            current.append(p)
            size += p.numel() * p.element_size()
            if size >= limit:
                buckets.append(current)
                current, size = [], 0
        return buckets + ([current] if current else [])

    def _ready(self, p):
        i = self._bucket_of[id(p)]
        self._waiting[i] -= 1
        if self._waiting[i] == 0:  # the bucket's last gradient: reduce it while backward goes on
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            with _without_backward_python_state():
                self._works[i] = (dist.all_reduce(flat, group=self.group, async_op=True), flat)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __del__(self):
        for h in getattr(self, "_hooks", ()):
            h.remove()
        _release(getattr(self, "_finished", {}))

    def finish_gradient_synchronization(self):
        for i, (work, flat) in sorted(self._works.items()):
            work.wait()
            flat /= self.size
            offset = 0
            for p in self.buckets[i]:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        missing = [i for i in range(len(self.buckets)) if i not in self._works]
        _release(self._finished)  # the previous step's: the backend's thread has long let go of them
        self._finished, self._works, self._waiting = self._works, {}, [len(b) for b in self.buckets]
        if missing:
            raise RuntimeError(f"DDP: buckets {missing} never got all their gradients: did backward run, and "
                               f"does every parameter that requires a gradient take part in the loss?")
