"""Pipeline parallelism: schedules as data, checked and simulated, and one executor."""

from .actions import Action, format_schedule, parse
from .check import ScheduleError, bubble_of, dependencies, simulate, validate
from .schedules import NAMES, schedule

__all__ = ["Action", "format_schedule", "parse", "ScheduleError", "bubble_of", "dependencies", "simulate",
           "validate", "NAMES", "schedule"]

from .check import format_grid, in_flight  # noqa: E402
from .executor import PipelineRun, micro_batches, run, run_actions, sync_dp_grads, train_pipeline  # noqa: E402
from .stage import PipelineStage, split_layers  # noqa: E402

__all__ += ["format_grid", "in_flight", "PipelineRun", "micro_batches", "run", "run_actions", "sync_dp_grads", "train_pipeline", "PipelineStage",
            "split_layers"]
