"""Arrays with a shape and no values: :class:`ShapeArray` (``shape_only``), the NumPy
functions it answers to (``shape_only_functions``) and how NumPy shapes results
(``shape_rules``), so the same per-rank programs run without data at full scale."""

from . import shape_only_functions  # noqa: F401 -- fills shape_only.FUNCTIONS
from .shape_only import (ShapeArray, ShapeOnlyError, ShapeRNG, contiguous, is_shape_only, shape_only_like,
                         shape_only_params)

__all__ = ["ShapeArray", "ShapeOnlyError", "ShapeRNG", "contiguous", "is_shape_only", "shape_only_like",
           "shape_only_params"]
