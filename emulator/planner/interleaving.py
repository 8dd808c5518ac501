"""Which interleaved pipelines a framework can build: the rules each published run's code
applied to ``--num-layers-per-virtual-pipeline-stage``.

The emulator and the planner can cut any model into ``p x v`` chunks, unevenly where the
layers do not divide (:func:`~emulator.parallel.pipeline.partition.split_layers`), and run
interleaved 1F1B on two stages. Megatron-LM could not:

* **v2.5** (the SC21 merge, the code of Narayanan et al. 2021), ``megatron/arguments.py``
  lines 118-127: the interleaved schedule needs ``pipeline_model_parallel_size > 2``, and
  ``megatron/model/transformer.py`` lines 551-566 build ``num_layers // pp`` layers per
  stage and that number ``// v`` per chunk, so a stage whose layers ``v`` does not divide
  builds a smaller model than asked for (60 layers on 4 stages with v = 2: 56);
* **Megatron-Core r0.8** (the README's H100 table, f2e5db4), ``megatron/training/
  arguments.py`` lines 254-268: ``num_layers % pp == 0`` and the layers per stage
  divisible by the layers per virtual stage; two stages are allowed with
  ``--overlap-p2p-communication``, on unless turned off (line 1405).

Llama 3's own code (the Llama 3 paper, section 3.3.2) changed the schedule so the
number of micro-batches is set freely and took one layer from the first and from the last
stage to balance them: uneven stages, as :func:`split_layers` cuts them.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Interleaving:
    """What a framework accepts for interleaved 1F1B: at least ``min_pp`` stages, and, if
    ``even``, layers that divide into ``p x v`` chunks of one size; ``source``: where."""

    name: str
    min_pp: int
    even: bool
    source: str

    def problem(self, n_layers, pp, v):
        """Why this framework cannot run ``n_layers`` as ``pp`` stages of ``v`` chunks,
        or "" when it can."""
        if pp < self.min_pp:
            return f"{self.name} interleaves only {self.min_pp} or more stages, not {pp} ({self.source})"
        if self.even and n_layers % (pp * v):
            return (f"{self.name} builds chunks of one size: {n_layers} layers do not divide into {pp} x {v} "
                    f"({self.source})")
        return ""


MEGATRON_V25 = Interleaving("Megatron-LM v2.5", 3, True, "NVIDIA/Megatron-LM e269e200, megatron/arguments.py:118-127, "
                            "megatron/model/transformer.py:551-566")
MEGATRON_CORE_R08 = Interleaving("Megatron-Core r0.8", 2, True, "NVIDIA/Megatron-LM f2e5db4, "
                                 "megatron/training/arguments.py:254-268 and 1405")
ANY = Interleaving("the emulator", 2, False, "emulator.parallel.pipeline.partition.split_layers")
LLAMA3 = Interleaving("Llama 3's pipeline", 2, False, "the Llama 3 paper, section 3.3.2")
