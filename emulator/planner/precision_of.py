"""The context a plan is evaluated in: its software stack and precision policy, from the
planner's arguments (``stack=``, ``precision=``, or the old ``param_bytes``/``mixed``
shorthands), resolved as :func:`emulator.parallel.runtime.run_precision` resolves a run's."""

from functools import lru_cache

from ..machine.precision import precision_preset, shorthand
from ..machine.stack import Context, stack_preset


def plan_context(stack=None, precision=None, param_bytes=None, mixed=None):
    """The :class:`~emulator.machine.stack.Context` of a plan: ``precision`` if given, else
    the shorthand ``param_bytes``/``mixed`` stand for, else the stack's own policy; the
    arrays are the policy's weights' dtype (what :func:`~emulator.planner.run_plan` builds
    the model in)."""
    return _context(stack_preset(stack), None if precision is None else precision_preset(precision),
                    param_bytes, mixed)


@lru_cache(maxsize=64)
def _context(stack, precision, param_bytes, mixed):
    policy = precision or shorthand(param_bytes, mixed) or stack.precision
    array = policy.params or "bf16"
    return Context(stack, policy, array)
