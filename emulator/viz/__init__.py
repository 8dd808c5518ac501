"""Pictures: Gantt charts of the simulated timeline and memory over time (``charts``),
diagrams of algorithms and machines (``charts``: a ring step, Megatron's split, topologies,
the primitives), and pipeline schedules (``schedules``: the grid, activations over time)."""

from .charts import (PASS_COLORS, gantt, megatron_split, memory_over_time, primitives, ring_step, topologies,
                     training_pass)
from .schedules import ACTION_COLORS, activations_over_time, schedule_grid

__all__ = ["gantt", "memory_over_time", "ring_step", "megatron_split", "topologies", "primitives",
           "schedule_grid", "activations_over_time", "ACTION_COLORS", "PASS_COLORS", "training_pass"]
