"""FSDP2 inside a pipeline, as ``torch.distributed.pipelining`` and torchtitan run it.

torchtitan turns off ``reshard_after_forward`` when pipeline parallelism is on, so that a
stage does not all-gather its layers again for every micro-batch; the pipeline's stage sets
``reshard_after_backward`` and ``requires_gradient_sync`` off for every backward, so that
the layers stay gathered and their gradients stay whole, summed over micro-batches in the
reduction's dtype (``to_accumulated_grad_if_needed`` upcasts them); once the stage's last
``B`` and ``W`` have run, its ``REDUCE_GRAD`` (``perform_reduce_grad``) reduce-scatters each
layer's gradient once and frees the gathered layers (:data:`emulator.machine.stack_sources.PYTORCH_EAGER`, ``fsdp_unsharded_in_pipeline``).

So each layer is all-gathered once per step, at its first forward (the next one prefetched
as FSDP2 does), and reduce-scattered once, after the stage's last backward, where nothing
hides it. The memory is ZeRO-1's and more: the gathered layers and their whole gradients
stay for the step, the optimizer alone sharded.

Where it differs from torch: an interleaved schedule is lowered there with at most three
stages gathered at once (``_add_unshard_reshard`` in torch/distributed/pipelining/
schedules.py, ``max_active_stages=3``), each stage reduce-scattered right after its own last
backward. Here every chunk stays gathered and all are reduce-scattered after the flush:
the same gathers for two or three chunks per rank, fewer than torch's from four on.
"""

from .zero3 import ZeRO3


class FSDPInPipeline(ZeRO3):
    def __init__(self, comm, model, params, opt, prefetch=True, average=True, label=""):
        super().__init__(comm, model, params, opt, prefetch=prefetch, average=average, label=label)
        self.accumulated = {}  # layer -> its whole gradient, summed over the step's micro-batches

    def _done_with(self, name):
        """Neither the end of a forward nor of a backward reshards: the layer stays gathered."""

    def grads_ready(self, name, grads, last):
        self.accumulate(self.accumulated, name, self.layouts[name].flatten(grads), f"fullgrad:{name}", "grads")

    def reduce_grads(self):
        """``REDUCE_GRAD``: every layer's reduce-scatter issued on its own stream, the gathered
        layers freed, then each waited for (the root's final callback)."""
        handles = []
        for name in self.names:
            if self.gathered.pop(name, None) is not None:
                self.memory.release(f"gathered:{name}")
            if name in self.accumulated:
                handles.append((name, self.comm.reduce_scatter(self.accumulated.pop(name), async_op=True)))
        for name, handle in handles:
            mine = handle.wait() / self.divisor
            self.memory.release(f"fullgrad:{name}")
            self.accumulate(self.grad_shards, name, mine, f"grads:{name}", "grads")
