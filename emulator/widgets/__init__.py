"""Widgets for the lessons. Each has a model (a pure function: state in, numbers and a
figure out) apart from its controls, so tests can drive it without a browser."""

from .activation_explorer import ActivationExplorer, activation_explorer_model
from .common import figure_png
from .failure_explorer import FailureExplorer, failure_explorer_model
from .mesh_planner import MeshPlanner, PlanExplorer, mesh_planner_model, plan_explorer_model
from .ring_attention_stepper import RingAttentionStepper, ring_attention_stepper_model
from .ring_stepper import RingStepper, ring_stepper_model
from .routing_explorer import RoutingExplorer, routing_explorer_model
from .schedule_explorer import ScheduleExplorer, schedule_explorer_model
from .zero_explorer import ZeroExplorer, zero_explorer_model

__all__ = ["RingStepper", "ring_stepper_model", "ZeroExplorer", "zero_explorer_model", "ActivationExplorer",
           "activation_explorer_model", "ScheduleExplorer", "schedule_explorer_model", "RingAttentionStepper",
           "ring_attention_stepper_model", "RoutingExplorer", "routing_explorer_model", "FailureExplorer",
           "failure_explorer_model", "MeshPlanner", "mesh_planner_model", "PlanExplorer", "plan_explorer_model",
           "figure_png"]
