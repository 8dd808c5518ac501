"""What a pipeline stage keeps of each micro-batch from its forward to its backward: the
rank's ledger of ``activations``.

What each layer's forward cached for a micro-batch is held from ``F`` until the loop calls
:meth:`ActivationLedger.free` once the micro-batch's backward is done (``B``, or ``W`` when
the backward is split: the weight gradient needs the layers' inputs; the output gradients
``B`` keeps for ``W`` are held too, under ``grad-out``, and what ``B`` adds to a layer's
cache for ``W``, under ``for W``). With ``release="layer"`` each
layer's activations go as soon as its own backward is done, as autograd frees saved tensors
while backward proceeds (the training loop's behaviour). Under full recomputation a layer
holds only its input.
"""

from ...errors import ConfigError
from ...records.memory import _arrays, memory_key


class ActivationLedger:
    """The activations of :class:`~.stage.PipelineStage`, a base of it (it reads the stage's
    ``memory``, ``comm`` and ``split``): ``saved`` (mb, chunk) -> {layer: (input, cache)};
    ``grad_out`` (mb, chunk) -> {layer: output gradient}, kept from ``B`` for ``W``;
    ``backward_done``: the (mb, chunk) whose weight gradients are in and activations not yet
    freed; ``micro_batch_bytes``: chunk -> the activation bytes one micro-batch's forward holds."""

    def _init_activations(self, release):
        if release not in ("micro-batch", "layer"):
            raise ConfigError(f"release must be 'micro-batch' or 'layer', got {release!r}")
        self.release_by_layer = release == "layer"
        self.saved, self.grad_out, self.backward_done, self.micro_batch_bytes = {}, {}, set(), {}

    def _hold_layer(self, mb, c, name, held):
        self.memory.hold(f"act {mb}.{c} {name}", held, "activations")

    def _release_layer(self, mb, c, name):
        if self.release_by_layer:
            self.memory.release(f"act {mb}.{c} {name}")

    @staticmethod
    def _held_arrays(objs):
        """The arrays of ``objs``, listed (so kept alive: none of their memory can be reused
        for a new array before :meth:`_hold_for_w` compares against them)."""
        return list(_arrays(objs))

    def _hold_for_w(self, mb, c, name, cache, held):
        """What a split backward's ``B`` left in a layer's cache for its ``W`` beyond what was
        held before it (``held``: :meth:`_held_arrays` of the layer's input, its forward's
        cache and its output gradient): the weight GEMMs' output gradients, and under
        recomputation the cache built again; held until that ``W``, as autograd keeps a
        retained graph's tensors."""
        seen = {memory_key(a) for a in held}
        new = []
        for a in _arrays(cache):
            key = memory_key(a)
            if key not in seen:
                seen.add(key)
                new.append(a)
        self.memory.hold(f"for W {mb}.{c} {name}", new, "activations")

    def _release_for_w(self, mb, c, name):
        self.memory.release(f"for W {mb}.{c} {name}")

    def _keep_grad_out(self, mb, c, outs):
        self.grad_out[(mb, c)] = outs
        self.memory.hold(f"grad-out {mb}.{c}", outs, "activations")

    def _take_grad_out(self, action):
        mb, c = action.microbatch, action.chunk
        if (mb, c) not in self.grad_out:
            raise ConfigError(f"rank {self.comm.global_rank}: {action} before B{mb}{'.' + str(c) if c else ''}: the "
                              f"weight gradient needs the output gradients that B computes")
        outs = self.grad_out.pop((mb, c))
        self.memory.release(f"grad-out {mb}.{c}")
        return outs

    def _saved(self, mb, c):
        if (mb, c) not in self.saved:
            raise ConfigError(f"rank {self.comm.global_rank}: the activations of micro-batch {mb} on chunk {c} are "
                              f"gone: their forward has not run, or they were freed before their backward")
        return self.saved[(mb, c)]

    def finishes_backward(self, action):
        """Whether ``action`` is the last one that needs its micro-batch's activations:
        ``B`` in a schedule without ``W``, else ``W``."""
        return action.kind == ("W" if self.split else "B")

    def free(self, action):
        """Release the activations of ``action``'s micro-batch and chunk (after the action
        that :meth:`finishes_backward`)."""
        mb, c = action.microbatch, action.chunk
        if (mb, c) not in self.backward_done:
            raise ConfigError(f"rank {self.comm.global_rank}: free({action}) before the backward of micro-batch {mb} "
                              f"on chunk {c} is done; its {'W' if self.split else 'B'} still needs the activations")
        self.backward_done.discard((mb, c))
        saved = self.saved.pop((mb, c))
        if not self.release_by_layer:
            for name in saved:
                self.memory.release(f"act {mb}.{c} {name}")
