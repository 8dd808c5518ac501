"""Dtype names as the declared work writes them (``"bf16"``, ``"fp32"``), their bytes per
element, and the NumPy dtypes they stand for."""

import numpy as np
from ml_dtypes import bfloat16

from ..errors import ConfigError

DTYPE_BYTES = {"fp64": 8, "fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int64": 8, "int32": 4, "bool": 1}


def dtype_bytes(dtype):
    """Bytes per element of a dtype name (``"bf16"``: 2)."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None


def dtype_name(np_dtype):
    """The name of a NumPy dtype (``ml_dtypes.bfloat16`` -> ``"bf16"``)."""
    dt = np.dtype(np_dtype)
    if dt.name == "bfloat16":
        return "bf16"
    return {"float64": "fp64", "float32": "fp32", "float16": "fp16", "int64": "int64", "int32": "int32",
            "bool": "bool"}.get(dt.name, dt.name)


def np_dtype(name):
    """The NumPy dtype of a dtype name (``"bf16"``: ``ml_dtypes.bfloat16``)."""
    return np.dtype(bfloat16) if name == "bf16" else np.dtype({"fp64": np.float64, "fp32": np.float32,
                                                               "fp16": np.float16, "int64": np.int64,
                                                               "int32": np.int32, "bool": np.bool_}[name])
