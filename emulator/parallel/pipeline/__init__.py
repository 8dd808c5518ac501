"""Pipeline parallelism: schedules as data, checked and simulated, each rank's program (when its
messages go), and one executor."""

from .actions import Action, dependencies, format_schedule, parse
from .check import bubble_of, format_grid, in_flight, validate
from .simulator import ScheduleError, simulate
from .exchange import Step, format_program, local_program, program
from .executor import (PipelineRun, blocking_loop, micro_batches, run, run_actions, sync_dp_grads,
                       train_pipeline, train_step)
from .schedules import NAMES, schedule
from .partition import LocalParams, ReplicatedParams, chunk_layers, split_layers
from .stage import PipelineStage

__all__ = ["Action", "dependencies", "format_schedule", "parse", "ScheduleError", "bubble_of", "format_grid",
           "in_flight", "simulate", "validate", "PipelineRun", "blocking_loop", "micro_batches", "run", "run_actions",
           "sync_dp_grads", "train_pipeline", "train_step", "Step", "format_program", "local_program", "program",
           "NAMES", "schedule", "PipelineStage", "split_layers", "chunk_layers", "LocalParams", "ReplicatedParams"]
